"""Graph questions over the store: resolve a node from what a user types, its neighbourhood, the
path between two nodes, and a ticker's context (biases, strategies, catalysts, peers, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag_lib.errors import NotFoundError, ValidationError, close_matches, did_you_mean
from rag_lib.graph.extract import STRUCTURAL, alias_key, doc_key, normalise_name, ticker_key

MAX_DEPTH = 3

# Node kinds (and document types) gathered under each heading of a ticker's context.
CONTEXT_KINDS = {
    "biases": ("bias",),
    "strategies": ("strategy",),
    "catalysts": ("catalyst", "event"),
    "sectors": ("sector",),
    "industries": ("industry",),
    "signals": ("signal", "metric"),
    "trades": ("trade",),
    "outcomes": ("outcome",),
    "learnings": ("learning",),
    "themes": ("theme", "research", "customer"),
}
DOC_TYPE_HEADINGS = {"learning": "learnings", "strategy": "strategies", "trade-journal": "trades",
                     "post-trade-review": "learnings"}
PEER_VIA = {"sector", "industry", "catalyst", "doc", "theme", "event"}


def _empty_collection(store, collection: str) -> str:
    """"; collection 'x' holds no documents; these do: ..." when it is empty (documents ingested into
    another collection than the one asked), else ""."""
    from rag_lib.models import SearchFilters
    from rag_lib.search.notes import empty_collection_note

    note = empty_collection_note(store.empty_search_facts(SearchFilters(collection=collection)))
    return f"; {note}" if note else ""


def resolve_node(store, collection: str, ref: str) -> dict[str, Any]:
    """The node `ref` names: a key, a ticker, a document path or id, or an entity name."""
    ref = ref.strip()
    if not ref:
        raise ValidationError("node is empty; pass a ticker, a document path or id, or an entity name")
    # A key as written, then the ticker, then any node a document gave this name (a company name, a
    # trade id, another spelling), then the entity and document spellings.
    candidates = [ref, ticker_key(ref) if len(ref) <= 10 else ref]
    node = store.graph_find_node(collection, candidates, alias=alias_key(ref))
    if node is None:
        candidates = [normalise_name(ref), doc_key(ref)]
        candidates += [doc_key(p) for p in store.documents_with_id(collection, ref)[:1]]
        node = store.graph_find_node(collection, candidates)
    if node is None:
        if empty := _empty_collection(store, collection):
            raise NotFoundError(f"no graph node '{ref}' in collection '{collection}'{empty}")
        raise NotFoundError(f"no graph node '{ref}' in collection '{collection}'{_suggestions(store, collection, ref)};"
                            " try a ticker, a document path, or see `rag graph export`")
    return node


def _suggestions(store, collection: str, ref: str) -> str:
    """' (did you mean …?)' from the collection's tickers close to `ref` and node labels containing it."""
    close = close_matches([ref.upper()], sorted(store.known_tickers(collection))) if ref.isalnum() and len(ref) <= 6 \
        else []
    return did_you_mean((close + store.graph_labels_like(collection, ref))[:3])


def _check_depth(depth: int) -> None:
    if not 1 <= depth <= MAX_DEPTH:
        raise ValidationError(f"depth must be between 1 and {MAX_DEPTH}, got {depth}")


def neighbors(store, collection: str, ref: str, depth: int = 1, predicates: Sequence[str] | None = None,
              include_structural: bool = False) -> dict[str, Any]:
    """Nodes and edges within `depth` steps of a node (has_type/dated hubs left out unless asked)."""
    _check_depth(depth)
    start = resolve_node(store, collection, ref)
    if predicates:  # a mistyped predicate would read as "no such edges"
        known = store.graph_predicates(collection)
        if unknown := [p for p in predicates if p not in known]:
            raise ValidationError(f"no edge of collection '{collection}' has the predicate '{unknown[0]}'"
                                  f"{did_you_mean(close_matches(unknown[:1], known))}; its predicates: {', '.join(known)}")
    exclude = () if include_structural or predicates else STRUCTURAL
    edges = store.graph_walk(collection, start["key"], depth, predicates, exclude)
    depth_of = {start["key"]: 0}
    for e in edges:
        for k in (e["src"], e["dst"]):
            depth_of.setdefault(k, e["depth"])
    nodes = store.graph_nodes(collection, list(depth_of))
    out_nodes = [{**nodes.get(k, {"key": k, "kind": "?", "label": k, "aliases": []}), "depth": d}
                 for k, d in sorted(depth_of.items(), key=lambda kv: (kv[1], kv[0]))]
    return {"node": start, "depth": depth, "nodes": out_nodes, "edges": edges}


def graph_path(store, collection: str, a: str, b: str, max_depth: int = 4) -> dict[str, Any]:
    """A shortest path (at most `max_depth` edges, either direction) between two nodes."""
    if not 1 <= max_depth <= 6:
        raise ValidationError(f"max_depth must be between 1 and 6, got {max_depth}")
    start, end = resolve_node(store, collection, a), resolve_node(store, collection, b)
    edges = store.graph_path(collection, start["key"], end["key"], max_depth, exclude=STRUCTURAL)
    return {"from": start, "to": end, "found": bool(edges) or start["key"] == end["key"], "edges": edges}


def ticker_context(store, collection: str, ticker: str, depth: int = 2) -> dict[str, Any]:
    """What the graph knows around a ticker: related biases, strategies, catalysts, sectors, signals,
    trades, outcomes, learnings, documents, and peer tickers (with the node they share)."""
    _check_depth(depth)
    key = ticker_key(ticker)
    if store.graph_find_node(collection, [key]) is None:
        raise NotFoundError(f"ticker {ticker.upper()} is not in the knowledge graph of '{collection}'"
                            f"{_empty_collection(store, collection)}")
    edges = store.graph_walk(collection, key, depth, None, STRUCTURAL)
    keys = {k for e in edges for k in (e["src"], e["dst"])} - {key}
    nodes = store.graph_nodes(collection, list(keys))
    docs = store.document_summaries(collection, [k[4:] for k in keys if k.startswith("doc:")])
    out: dict[str, Any] = {"ticker": ticker.upper(), **{h: [] for h in CONTEXT_KINDS}, "documents": [], "peers": []}
    by_kind: dict[str, str] = {kind: h for h, kinds in CONTEXT_KINDS.items() for kind in kinds}
    for k in sorted(keys):
        node = nodes.get(k)
        if node is None:
            continue
        if node["kind"] == "doc":
            doc = docs.get(k[4:])
            if doc is None:
                continue  # a dangling link target
            out["documents"].append(doc)
            if (heading := DOC_TYPE_HEADINGS.get(doc["doc_type"])):
                out[heading].append(doc["title"] or doc["doc_id"] or doc["path"])
        elif node["kind"] in by_kind:
            out[by_kind[node["kind"]]].append(node["label"])
    # peers: other tickers one step from a node that is one step from this ticker's neighbourhood
    via: dict[str, set[str]] = {}
    kinds = {k: n["kind"] for k, n in nodes.items()}
    for e in edges:
        for here, there in ((e["src"], e["dst"]), (e["dst"], e["src"])):
            if here.startswith("ticker:") and here != key and kinds.get(there) in PEER_VIA:
                via.setdefault(here[7:], set()).add(nodes[there]["label"] if there in nodes else there)
    out["peers"] = [{"ticker": t, "via": sorted(v)[:5]} for t, v in sorted(via.items(), key=lambda kv: (-len(kv[1]), kv[0]))]
    out["facts"] = [e for e in edges if e["depth"] == 1 or e["section"] == "_graph"][:200]
    for heading in CONTEXT_KINDS:
        out[heading] = sorted(set(out[heading]))
    return out


def context_markdown(ctx: dict[str, Any]) -> str:
    """A ticker context as short markdown lines for a prompt."""
    lines = [f"### Knowledge graph: {ctx['ticker']}"]
    for heading in CONTEXT_KINDS:
        if ctx.get(heading):
            lines.append(f"- {heading.capitalize()}: {', '.join(map(str, ctx[heading][:12]))}")
    if ctx.get("peers"):
        lines.append("- Peers: " + ", ".join(f"{p['ticker']} (via {', '.join(p['via'][:2])})" for p in ctx["peers"][:8]))
    if ctx.get("documents"):
        lines.append("- Documents: " + ", ".join(d["path"] for d in ctx["documents"][:8]))
    return "\n".join(lines)
