"""Retrieval over the serving table. `search()` dispatches on mode."""

from __future__ import annotations

import time

from rag_lib.embedding import EmbeddingProvider
from rag_lib.errors import ValidationError
from rag_lib.models import SearchFilters, SearchResult
from rag_lib.store import Store

MODES = ("semantic",)


def search(
    store: Store,
    provider: EmbeddingProvider,
    query: str,
    *,
    mode: str = "semantic",
    filters: SearchFilters | None = None,
    top_k: int = 10,
    min_similarity: float = 0.0,
) -> SearchResult:
    """Search the active embedding space; results carry scores in [0, 1] and timings in ms."""
    if not query or not query.strip():
        raise ValidationError("query is empty; pass some words to search for")
    if mode not in MODES:
        raise ValidationError(f"unknown search mode '{mode}'; use one of {', '.join(MODES)}")
    if not 1 <= top_k <= 1000:
        raise ValidationError(f"top_k must be between 1 and 1000, got {top_k}")
    filters = filters or SearchFilters()
    space = store.active_space()
    timings: dict[str, float] = {}
    if space is None:
        return SearchResult(query, mode, [], timings)
    t0 = time.perf_counter()
    vector = provider.embed([query])[0]
    t1 = time.perf_counter()
    hits = store.semantic_search(vector, space["space"], space["dimensions"], filters, top_k, min_similarity)
    t2 = time.perf_counter()
    timings.update(embed=round((t1 - t0) * 1000, 2), search=round((t2 - t1) * 1000, 2), total=round((t2 - t0) * 1000, 2))
    return SearchResult(query, mode, hits, timings)
