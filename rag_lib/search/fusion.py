"""Reciprocal rank fusion of ranked candidate lists, the knowledge graph's list, and soft boosts from
query hints."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag_lib.graph.extract import STRUCTURAL
from rag_lib.models import SearchFilters, SearchHit


@dataclass
class Candidates:
    """One ranked list (best first) from one retriever, with its fusion weight."""

    source: str  # semantic | lexical (| semantic:NVDA, lexical:expanded, ...)
    hits: list[SearchHit]
    weight: float = 1.0


def rrf(lists: list[Candidates], k: int = 60) -> list[SearchHit]:
    """Fuse by sum of weight / (k + rank); scores are scaled to [0, 1] by the best possible sum."""
    fused: dict[str, float] = {}
    first: dict[str, SearchHit] = {}
    for cand in lists:
        for rank, hit in enumerate(cand.hits, 1):
            fused[hit.chunk_id] = fused.get(hit.chunk_id, 0.0) + cand.weight / (k + rank)
            first.setdefault(hit.chunk_id, hit)
    best = sum(c.weight for c in lists if c.hits) / (k + 1) or 1.0
    order = sorted(fused, key=lambda cid: (-fused[cid], cid))
    out = []
    for cid in order:
        hit = first[cid]
        hit.score = fused[cid] / best
        out.append(hit)
    return out


def boost(hits: list[SearchHit], tickers: list[str], doc_types: list[str], factor: float) -> list[SearchHit]:
    """Raise hits about a ticker / document type the query names; a soft nudge, never a filter."""
    if factor <= 0 or not (tickers or doc_types):
        return hits
    in_path = re.compile(r"(?<![A-Z])(" + "|".join(map(re.escape, tickers)) + r")(?![A-Z])") if tickers else None
    for hit in hits:
        bonus = 0.0
        if in_path is not None and (hit.ticker in tickers or in_path.search(hit.path.upper())):
            bonus += factor
        if doc_types and hit.doc_type in doc_types:
            bonus += factor / 2
        hit.score = min(1.0, hit.score * (1.0 + bonus))  # only raises: min_similarity still holds
    return sorted(hits, key=lambda h: -h.score)


def graph_candidates(store, filters: SearchFilters, ranked: list[SearchHit], opts) -> Candidates | None:
    """The graph's ranked list: the first pass's hits from documents linked to, or sharing graph nodes
    (entities, tickers) with, its top `opts.graph_seeds` documents, in first-pass order. It reorders
    what the first pass found (injecting the related documents' nearest chunks instead lowered nDCG
    on the dev set). None when nothing is related."""
    seeds: list[str] = []
    for hit in ranked:
        if hit.path not in seeds:
            seeds.append(hit.path)
            if len(seeds) >= opts.graph_seeds:
                break
    collection = filters.collection or (ranked[0].collection if ranked else None)
    if not seeds or not collection:
        return None
    related = {p for p, _ in store.graph_related_paths(collection, seeds, STRUCTURAL, opts.graph_candidates)}
    hits = [h for h in ranked if h.path in related and h.collection == collection]
    return Candidates("graph", hits, opts.graph_weight) if hits else None
