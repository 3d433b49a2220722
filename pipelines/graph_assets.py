"""The `knowledge_graph` asset: per file partition, the graph its documents contributed. The graph
is written by `vector_table` in the same transaction as the chunks (so graph and vectors never
disagree); this asset reads it back from the store and reports it per file: node and edge counts
per kind and predicate, dangling `_links`, a few triples. A file whose graph is the same as at its
last materialization is `unchanged` and re-emits the same metadata."""


import hashlib
import json
from collections import Counter
from typing import Any

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    MaterializeResult,
    MetadataValue,
    asset,
)

from rag_lib.graph.extract import GRAPH_VERSION
from rag_lib.quality import markdown_table

from pipelines.assets import GROUP, finish, partition_targets, raw_documents, vector_table
from pipelines.event_log import partition_keys_read_once
from pipelines.partitions import corpus_files
from pipelines.resources import RagResource
from rag_lib.ingest.state import RAW, VECTORS, StageOutcome, upstream_outcome

GRAPH = "knowledge_graph"
SAMPLE_TRIPLES = 5


def _merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One file's report from its documents' reports (a JSONL file holds many documents)."""
    kinds: Counter[str] = Counter()
    preds: Counter[str] = Counter()
    dangling: list[dict[str, Any]] = []
    sample: list[dict[str, Any]] = []
    for r in reports:
        kinds.update(r["nodes_by_kind"])
        preds.update(r["edges_by_predicate"])
        dangling += r["dangling"]
        sample += r["sample"][: max(0, SAMPLE_TRIPLES - len(sample))]
    return {"nodes_by_kind": dict(sorted(kinds.items())), "edges_by_predicate": dict(sorted(preds.items())),
            "dangling": dangling, "sample": sample}


def _digest(report: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()[:16]


def triples_table(rows: list[dict[str, Any]]) -> str:
    """A few triples as a markdown table."""
    return markdown_table([{"subject": r["src"], "predicate": r["predicate"], "object": r["dst"],
                            "section": r["section"]} for r in rows], ["subject", "predicate", "object", "section"])


def _metadata(outcome: StageOutcome) -> dict[str, Any]:
    meta: dict[str, Any] = {"status": outcome.status}
    m = outcome.metadata
    if "nodes_by_kind" in m:
        meta.update(
            documents=m["documents"], nodes=sum(m["nodes_by_kind"].values()), edges=sum(m["edges_by_predicate"].values()),
            nodes_by_kind=MetadataValue.json(m["nodes_by_kind"]),
            edges_by_predicate=MetadataValue.json(m["edges_by_predicate"]),
            dangling_links=len(m["dangling"]),
            triples=MetadataValue.md(triples_table(m["sample"])))
        if m["dangling"]:
            meta["dangling"] = MetadataValue.json([f"{d['role']}: {d['target']}" for d in m["dangling"]][:50])
    elif m.get("skip_reason"):
        meta["skip_reason"] = m["skip_reason"]
    if outcome.error:
        meta["error"] = outcome.error
    return meta


def graph_outcomes(rag: RagResource, keys: list[str]) -> list[StageOutcome]:
    """Each partition's graph report from the store (one query per kind of fact per collection),
    stored as the file's `knowledge_graph` stage output."""
    kb = rag.kb()
    targets, unknown = partition_targets(rag, keys)
    outcomes: dict[str, StageOutcome] = {o.key: o for o in unknown}
    rows = kb.store.load_stage_outputs((RAW, VECTORS, GRAPH), [(t.collection, t.rel) for t in targets])
    ready: dict[str, tuple[Any, dict, list[str]]] = {}
    for t in targets:
        raw = rows.get((t.collection, t.rel, RAW))
        early = upstream_outcome(t.key, raw, rows.get((t.collection, t.rel, VECTORS)), VECTORS)
        if early is not None:
            outcomes[t.key] = early
        else:
            ready[t.key] = (t, raw, [d["path"] for d in raw["documents"]])
    by_collection: dict[str, list[str]] = {}
    for t, _, paths in ready.values():
        by_collection.setdefault(t.collection, []).extend(paths)
    reports = {c: kb.store.graph_file_reports(c, paths) for c, paths in by_collection.items()}
    saves = []
    for key, (t, raw, paths) in ready.items():
        report = _merge([reports[t.collection][p] for p in paths])
        digest = _digest(report)
        mine = rows.get((t.collection, t.rel, GRAPH)) or {}
        same = mine.get("digest") == digest and mine.get("file_hash") == raw["file_hash"] \
            and mine.get("version") == GRAPH_VERSION
        meta = {"documents": len(paths), **report}
        outcomes[key] = StageOutcome(key, "unchanged" if same else "ok", meta)
        if not same:
            saves.append((t.collection, t.rel, GRAPH, {"status": "ok", "file_hash": raw["file_hash"], "digest": digest,
                                                       "version": GRAPH_VERSION, "meta": meta}, raw["file_hash"]))
    kb.store.save_stage_outputs(saves)
    return [outcomes[k] for k in keys]


def rebuild_profiles(rag: RagResource, outcomes: list[StageOutcome]) -> dict[str, Any]:
    """The ticker profiles (entity linking) of the collections whose graph changed in this run, or
    whose profiles are missing: one rebuild per run, only changed profiles embedded again."""
    kb = rag.kb()
    pmap = rag.partition_map()
    changed: dict[str, bool] = {}
    for o in outcomes:
        if o.status in ("ok", "unchanged"):
            collection = pmap.target(o.key).collection
            changed[collection] = changed.get(collection, False) or o.status == "ok"
    reports = [r for c in sorted(changed) if (r := kb.rebuild_profiles(c, changed=changed[c])) is not None]
    if not reports:
        return {"profiles_rebuilt": 0}
    return {"profiles": sum(r["profiles"] for r in reports),
            "profiles_rebuilt": sum(len(r["rebuilt"]) for r in reports),
            "profiles_removed": sum(len(r["removed"]) for r in reports),
            "profiles_detail": MetadataValue.json(
                {r["collection"]: {"rebuilt": r["rebuilt"][:50], "removed": r["removed"][:50]} for r in reports}),
            "profiles_sample": MetadataValue.md("\n\n".join(f"**{t}**: {text}" for r in reports
                                                            for t, text in r["sample"].items()))}


@asset(partitions_def=corpus_files, backfill_policy=BackfillPolicy.single_run(), group_name=GROUP,
       deps=[raw_documents, vector_table], code_version=f"graph-{GRAPH_VERSION}",
       description="The file's knowledge graph (entities, `_graph` triples, `_links`, ticker/type/date facts), "
                   "written with its chunks by vector_table: counts per node kind and predicate, dangling links, "
                   "a sample of triples; then the ticker profiles entity linking uses are rebuilt where "
                   "documents changed (run metadata `profiles_*`).")
def knowledge_graph(context: AssetExecutionContext, rag: RagResource) -> MaterializeResult:
    keys = list(context.partition_keys)
    done_for, outcomes, profiles = rag.after(GRAPH, lambda: graph_work(rag, keys))
    if done_for != keys:  # started ahead for other partitions (not in one run): do this step's own
        _, outcomes, profiles = graph_work(rag, keys)
    with partition_keys_read_once(context.instance):
        for outcome in outcomes:
            context.add_asset_metadata(_metadata(outcome), partition_key=outcome.key)
    edges = sum(sum(o.metadata.get("edges_by_predicate", {}).values()) for o in outcomes)
    return finish(context, rag, GRAPH, outcomes, {"run_edges": edges, **profiles})


def graph_work(rag: RagResource, keys: list[str]) -> tuple[list[str], list[StageOutcome], dict[str, Any]]:
    """The asset's work for `keys`: each file's graph report, then the ticker profiles' rebuild
    (started ahead, once the run's stages are done, by pipelines.assets.after_stages)."""
    outcomes = graph_outcomes(rag, keys)
    return keys, outcomes, rebuild_profiles(rag, outcomes)


GRAPH_ASSETS = [knowledge_graph]
