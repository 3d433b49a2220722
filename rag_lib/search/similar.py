"""Related documents: the mean vector of a unit / chunk / document, searched, one hit per document."""

from __future__ import annotations

import time

import numpy as np

from rag_lib.models import SearchFilters, SearchResult
from rag_lib.search.results import group_by_unit


def get_similar(store, ref: str, *, collection: str, top_k: int = 10, filters: SearchFilters | None = None) -> SearchResult:
    """Documents most similar to `ref` (unit id, chunk id, document path or id), excluding itself;
    each represented by its most similar chunk."""
    started = time.perf_counter()
    space = store.active_space()
    if space is None:
        return SearchResult(ref, "similar", [], {})
    source, vectors = store.reference_vectors(collection, ref, space["space"])
    centroid = vectors.mean(axis=0)
    norm = float(np.linalg.norm(centroid))
    centroid = centroid / norm if norm else centroid
    base = filters or SearchFilters()
    search_filters = SearchFilters(**{**base.__dict__, "collection": collection})
    depth = min(1000, max(50, top_k * 8))
    hits = store.semantic_search(centroid, space["space"], space["dimensions"], search_filters, depth)
    best: dict[str, object] = {}
    for hit in group_by_unit(hits):
        if hit.path != source["path"] and hit.path not in best:
            best[hit.path] = hit
    out = list(best.values())[:top_k]
    timings = {"total": round((time.perf_counter() - started) * 1000, 2)}
    return SearchResult(ref, "similar", out, timings, plan={"source": source})
