"""Knowledge-graph quality checks as plain results (the orchestrator maps them to its own checks):
dangling `_links` and nodes that look like duplicates (warnings, listed), orphan nodes and stale edges
(errors), and counts per node
kind and predicate with a small sample of triples as markdown."""

from __future__ import annotations

from rag_lib.quality import QualityResult, markdown_table


def check_dangling_links(store, collection: str | None = None) -> QualityResult:
    rows = store.graph_dangling_links(collection)
    return QualityResult(
        passed=not rows, severity="warn",
        description=f"{len(rows)} _links point to files that are not in the corpus" if rows
        else "every _links target is a document of the corpus",
        metadata={"dangling": len(rows), "links": [f"{r['path']} → {r['target']}" for r in rows[:50]]},
        markdown={"dangling_links": markdown_table(rows, ["path", "role", "target"])} if rows else {},
    )


def check_orphan_nodes(store, collection: str | None = None) -> QualityResult:
    rows = store.graph_orphan_nodes(collection)
    return QualityResult(
        passed=not rows, severity="error",
        description=f"{len(rows)} graph nodes have no edges" if rows else "no orphan graph nodes",
        metadata={"orphans": len(rows), "nodes": [r["key"] for r in rows[:50]]},
        markdown={"orphan_nodes": markdown_table(rows, ["collection", "key", "kind"])} if rows else {},
    )


def check_stale_edges(store, collection: str | None = None) -> QualityResult:
    rows = store.graph_stale_edges(collection)
    return QualityResult(
        passed=not rows, severity="error",
        description=f"{len(rows)} graph edges come from an older version of their document" if rows
        else "every graph edge comes from the live version of its document",
        metadata={"stale": len(rows), "edges": [f"{r['path']}: {r['src']} {r['predicate']} {r['dst']}" for r in rows[:50]]},
        markdown={"stale_edges": markdown_table(rows, ["path", "src", "predicate", "dst"])} if rows else {},
    )


def check_duplicate_nodes(store, collection: str | None = None) -> QualityResult:
    """Nodes that look like one real thing under two keys (a warning: the corpus spells it two ways
    that resolution does not unify; listed so a person can fix the spelling or the `_graph`)."""
    rows = store.graph_duplicate_nodes(collection)
    table = [{"collection": r["collection"], "nodes": ", ".join(r["keys"]), "kinds": ", ".join(r["kinds"]),
              "reason": r["reason"]} for r in rows]
    return QualityResult(
        passed=not rows, severity="warn",
        description=f"{len(rows)} groups of graph nodes look like duplicates" if rows
        else "no graph nodes look like duplicates",
        metadata={"duplicate_groups": len(rows), "groups": [" = ".join(r["keys"]) for r in rows[:50]]},
        markdown={"duplicate_nodes": markdown_table(table, ["collection", "nodes", "kinds", "reason"])} if rows else {},
    )


def graph_summary(store, collection: str | None = None) -> QualityResult:
    """Counts per node kind and predicate (always passes; the numbers are the point)."""
    counts = store.graph_counts(collection)
    sample = store.graph_sample(collection)
    kinds = [{"kind": k, "nodes": n} for k, n in counts["nodes"].items()]
    preds = [{"predicate": p, "edges": n} for p, n in counts["edges"].items()]
    return QualityResult(
        passed=True, severity="warn",
        description=f"{sum(counts['nodes'].values())} nodes, {sum(counts['edges'].values())} edges",
        metadata={"nodes": sum(counts["nodes"].values()), "edges": sum(counts["edges"].values()),
                  "nodes_by_kind": counts["nodes"], "edges_by_predicate": counts["edges"]},
        markdown={"node_kinds": markdown_table(kinds, ["kind", "nodes"]),
                  "predicates": markdown_table(preds, ["predicate", "edges"]),
                  "sample": markdown_table(sample, ["src", "predicate", "dst", "path"])},
    )


def graph_checks(store, collection: str | None = None) -> list[QualityResult]:
    return [check_dangling_links(store, collection), check_orphan_nodes(store, collection),
            check_stale_edges(store, collection), check_duplicate_nodes(store, collection),
            graph_summary(store, collection)]


GRAPH_CHECKS = {"dangling_links": check_dangling_links, "orphan_nodes": check_orphan_nodes,
                "stale_edges": check_stale_edges, "duplicate_nodes": check_duplicate_nodes,
                "counts": graph_summary}
