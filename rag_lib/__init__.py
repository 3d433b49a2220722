"""rag_lib: a RAG knowledge base for trading research over PostgreSQL + pgvector.

Plain library (no Dagster). Start with `KnowledgeBase`, or the module-level functions that use a
default instance configured from `rag.yaml` and `RAG_*` environment variables.
"""

from rag_lib.api import (
    KnowledgeBase,
    delete_document,
    embed_document,
    embed_text,
    ingest,
    search,
    status,
)
from rag_lib.errors import RagError

__all__ = [
    "KnowledgeBase",
    "RagError",
    "delete_document",
    "embed_document",
    "embed_text",
    "ingest",
    "search",
    "status",
]
