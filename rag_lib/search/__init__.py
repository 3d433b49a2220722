"""Retrieval over the serving table: semantic, lexical and hybrid search, query routing, grouping
by unit, similar documents and context assembly. `search()` dispatches on mode."""

from __future__ import annotations

from rag_lib.search.retrieval import MODES, SearchOptions, plan_query, search

__all__ = ["MODES", "SearchOptions", "plan_query", "search"]
