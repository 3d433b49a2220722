"""Fusion of ranked candidate lists (a convex combination of scores, or reciprocal rank fusion),
parent-document evidence, the knowledge graph's list, and soft boosts from query hints."""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from rag_lib.errors import QueryTimeoutError
from rag_lib.graph.extract import STRUCTURAL
from rag_lib.models import SearchFilters, SearchHit

log = logging.getLogger(__name__)


@dataclass
class Candidates:
    """One ranked list (best first) from one retriever, with its fusion weight."""

    source: str  # semantic | lexical | fused | graph (| semantic:NVDA, lexical:expanded, ...)
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


def convex(lists: list[Candidates], alpha: float, semantic_floor: float = 0.0) -> list[SearchHit]:
    """Fuse by a convex combination of scores: each list's scores divided by its best (cosine for
    semantic lists, the raw full-text score for lexical ones), semantic lists weighted `alpha` and
    the others `1 - alpha`, times their own weights. Unlike RRF, a much better match in one list is
    not outvoted by a middling one that appears in both. A semantic list whose best cosine is below
    `semantic_floor` is divided by the floor instead: when nothing is close to the question, its
    first hit does not count as a perfect match. Scores are scaled to [0, 1]."""
    fused: dict[str, float] = {}
    first: dict[str, SearchHit] = {}
    best = 0.0
    for cand in lists:
        if not cand.hits:
            continue
        semantic = cand.source.startswith("semantic")
        # lexical hits carry raw / (1 + raw): recover the raw score, whose ratios mean something
        values = [h.score if semantic else h.score / max(1e-9, 1.0 - h.score) for h in cand.hits]
        # divided by the list's best only: subtracting its lowest (min-max) lowered both dev sets
        # a weak semantic list (best cosine below the floor) counts for what its cosines are worth
        top = max(max(values), semantic_floor if semantic else 0.0) or 1.0
        weight = cand.weight * (alpha if semantic else 1.0 - alpha)
        best += weight
        for hit, value in zip(cand.hits, values):
            fused[hit.chunk_id] = fused.get(hit.chunk_id, 0.0) + weight * max(0.0, value) / top
            first.setdefault(hit.chunk_id, hit)
    order = sorted(fused, key=lambda cid: (-fused[cid], cid))
    out = []
    for cid in order:
        hit = first[cid]
        hit.score = fused[cid] / (best or 1.0)
        out.append(hit)
    return out


def lexical_closeness(semantic: list[SearchHit], lexical: list[SearchHit], n: int = 5) -> float | None:
    """How close full text's first `n` chunks are to the question, relative to the semantic list's
    first `n`: their mean cosine (`similarity`) over the semantic list's (best first). A full-text
    chunk without a cosine counts at the semantic list's last, at least its own. None when either
    list is empty."""
    if not semantic or not lexical:
        return None
    cosines = {h.chunk_id: h.similarity if h.similarity is not None else h.score for h in semantic}
    last = min(cosines.values())
    top = sorted(cosines.values(), reverse=True)[:n]
    near = [h.similarity if h.similarity is not None else cosines.get(h.chunk_id, last) for h in lexical[:n]]
    mean_top = sum(top) / len(top)
    return (sum(near) / len(near)) / mean_top if mean_top > 0 else None


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
        # only raises (min_similarity still holds); not capped at 1, which tied every boosted hit
        # above 1 / (1 + factor) (document evidence alone then ordered them): see `rescale_to_one`
        hit.score = hit.score * (1.0 + bonus)
    return sorted(hits, key=lambda h: -h.score)


def rescale_to_one(hits: list[SearchHit]) -> list[SearchHit]:
    """Scores back in [0, 1] after boosts raised some above 1: all divided by the best, so the order
    and the ratios stay (unboosted scores, such as semantic mode's cosines, are left as they are)."""
    top = max((h.score for h in hits), default=0.0)
    if top > 1.0:
        for hit in hits:
            hit.score /= top
    return hits


def _scale(hits: list[SearchHit], matches: Callable[[SearchHit], bool], factor: float) -> list[SearchHit]:
    """`hits` with the scores of those `matches` accepts multiplied by `factor`, best first. A raise
    is not capped at 1 either (see `boost`)."""
    for hit in hits:
        if matches(hit):
            hit.score *= factor
    return sorted(hits, key=lambda h: -h.score)


def weigh_descriptors(hits: list[SearchHit], names: frozenset[str], weight: float) -> list[SearchHit]:
    """Multiply the scores of a YAML document's descriptor sections (`names`: its `_meta`, `_graph`,
    `_links`, metadata scalars) by `weight`: short sections that repeat a document's tickers, ids and
    link targets otherwise match any question naming them, ahead of the sections that answer it."""
    if weight >= 1.0 or not names:
        return hits
    return _scale(hits, lambda h: h.section in names and h.path.lower().endswith((".yaml", ".yml")), weight)


def weigh_stubs(hits: list[SearchHit], min_words: int, weight: float) -> list[SearchHit]:
    """Multiply by `weight` the scores of chunks with fewer than `min_words` words of their own (a
    section left as a stub, `prior analyses found: 0`): their embedded text is mostly the context prefix
    (`[stock-analysis] [META] [post mortem]`), so they match any question about that document."""
    if weight >= 1.0 or min_words <= 0:
        return hits
    return _scale(hits, lambda h: len(h.text.split()) < min_words, weight)


def date_boost(hits: list[SearchHit], dates: list[str], factor: float) -> list[SearchHit]:
    """Raise hits from documents dated within the [first, last] ISO days the query names, like a
    named ticker: "the January 2025 analyses" prefers January 2025's. A nudge, never a filter."""
    if factor <= 0 or not dates:
        return hits
    first, last = (dt.date.fromisoformat(d) for d in dates)
    return _scale(hits, lambda h: h.doc_date is not None and first <= h.doc_date <= last, 1.0 + factor)


def document_boost(hits: list[SearchHit], paths: list[str], factor: float) -> list[SearchHit]:
    """Raise hits from the documents the query names (`QueryPlan.documents`), like a named ticker's."""
    if factor <= 0 or not paths:
        return hits
    named = set(paths)
    return _scale(hits, lambda h: h.path in named, 1.0 + factor)


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
    try:
        related = {p for p, _ in store.graph_related_paths(collection, seeds, STRUCTURAL, opts.graph_candidates)}
    except QueryTimeoutError as exc:  # the graph's list only reorders: the search goes on without it
        log.warning("search without the graph's list: %s", exc)
        return None
    hits = [h for h in ranked if h.path in related and h.collection == collection]
    return Candidates("graph", hits, opts.graph_weight) if hits else None


def document_evidence(ranked: list[SearchHit], units: int, weight: float) -> list[SearchHit]:
    """Parent-document scoring: each hit's score plus `weight` times its document's evidence (the
    summed scores of the document's best `units` units in this ranking, relative to the best
    document's), rescaled to [0, 1]. A document several of whose sections match lifts its second
    and third sections above loosely related sections of other documents; a document matching
    once gains little."""
    if weight <= 0 or units <= 0 or not ranked:
        return ranked
    seen: set[tuple[str, str]] = set()
    doc_units: dict[tuple[str, str], list[float]] = {}
    for hit in ranked:
        doc_units.setdefault((hit.collection, hit.path), [])
        if (hit.collection, hit.unit_id) not in seen:  # a unit's best chunk speaks for it
            seen.add((hit.collection, hit.unit_id))
            doc_units[(hit.collection, hit.path)].append(hit.score)
    evidence = {doc: sum(sorted(scores, reverse=True)[:units]) for doc, scores in doc_units.items()}
    top = max(evidence.values()) or 1.0
    for hit in ranked:
        hit.score = (hit.score + weight * evidence[(hit.collection, hit.path)] / top) / (1.0 + weight)
    return sorted(ranked, key=lambda h: -h.score)
