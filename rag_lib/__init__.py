"""rag_lib: a RAG knowledge base for trading research over PostgreSQL + pgvector.

Plain library (no Dagster). Start with `KnowledgeBase`, or the module-level functions that use a
default instance configured from `rag.yaml` and `RAG_*` environment variables.
"""

from rag_lib.api import (
    EmbedResult,
    KnowledgeBase,
    QueryAnalysis,
    QueryType,
    RAGStats,
    build_analysis_context,
    classify_query,
    close,
    delete_document,
    embed_document,
    embed_text,
    get_hybrid_context,
    get_hybrid_context_adaptive,
    get_rag_stats,
    get_similar_analyses,
    hybrid_search,
    ingest,
    search,
    search_with_expansion,
    search_with_rerank,
    semantic_search,
    status,
)
from rag_lib.errors import RagError

__all__ = [
    "EmbedResult",
    "KnowledgeBase",
    "QueryAnalysis",
    "QueryType",
    "RAGStats",
    "RagError",
    "build_analysis_context",
    "classify_query",
    "close",
    "delete_document",
    "embed_document",
    "embed_text",
    "get_hybrid_context",
    "get_hybrid_context_adaptive",
    "get_rag_stats",
    "get_similar_analyses",
    "hybrid_search",
    "ingest",
    "search",
    "search_with_expansion",
    "search_with_rerank",
    "semantic_search",
    "status",
]
