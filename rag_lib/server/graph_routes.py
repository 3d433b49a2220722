"""HTTP routes of the knowledge graph: `GET /api/rag/graph/{node}` (neighbourhood, path or ticker
context) and `POST /api/rag/hybrid-context` (passages + graph facts routed by the query's class)."""


import datetime as dt
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import Field

from rag_lib.api import KnowledgeBase
from rag_lib.log import request_id_var
from rag_lib.server import service
from rag_lib.server.schemas import CollectionName, Request


class HybridContextRequest(Request):
    query: str = Field(min_length=1, max_length=4000, description="The question to build context for.")
    ticker: str | None = Field(None, max_length=16, description="The ticker the question is about.")
    token_budget: int = Field(4000, ge=64, le=32000, description="Maximum tokens of markdown.")
    analysis_type: str | None = Field(None, max_length=200, description=(
        "Only passages of this document type, e.g. earnings-analysis (learnings are still added)."))
    exclude_doc_id: str | None = Field(None, max_length=512, description=(
        "Leave this document out, e.g. the analysis being written."))
    collection: CollectionName | None = None


def _safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_safe(v) for v in value]
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def graph_router(get_kb: Callable[[], KnowledgeBase], read: list) -> APIRouter:
    """The graph routes, using the app's knowledge-base dependency and read-scope check."""
    router = APIRouter(tags=["graph"], dependencies=read)
    KB = Annotated[KnowledgeBase, Depends(get_kb)]

    @router.get("/api/rag/graph/{node:path}")
    def graph(
        kb: KB,
        node: Annotated[str, Path(max_length=512, description="Ticker, document path or id, entity name, node key.")],
        depth: Annotated[int, Query(ge=1, le=3, description="Steps from the node.")] = 1,
        predicate: Annotated[list[str] | None, Query(description="Follow only these predicates.")] = None,
        to: Annotated[str | None, Query(max_length=512, description="Return the shortest path to this node.")] = None,
        context: Annotated[bool, Query(description="Treat the node as a ticker and return its context.")] = False,
        collection: Annotated[CollectionName | None, Query()] = None,
    ) -> dict[str, Any]:
        """A node's neighbourhood (nodes, edges with provenance), a path to another node, or a ticker's context."""
        if to:
            out = kb.graph_path(node, to, collection=collection)
        elif context:
            out = kb.ticker_context(node, depth=max(depth, 2), collection=collection)
        else:
            out = kb.neighbors(node, depth=depth, predicates=predicate, collection=collection)
        return {**_safe(out), "request_id": request_id_var.get()}

    @router.post("/api/rag/hybrid-context")
    def hybrid_context(body: HybridContextRequest, kb: KB) -> dict[str, Any]:
        """Passages with citations and knowledge-graph facts for a question, within a token budget."""
        out = service.hybrid_context(kb, body.query, ticker=body.ticker, token_budget=body.token_budget,
                                     collection=body.collection, analysis_type=body.analysis_type,
                                     exclude_doc_id=body.exclude_doc_id)
        return {**_safe(out.to_dict()), "request_id": request_id_var.get()}

    return router
