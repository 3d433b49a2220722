"""MCP tools of the knowledge graph: `rag_hybrid_context` (passages + graph facts routed by the
query's class) and `rag_graph` (a node's neighbourhood, a path, or a ticker's context)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from mcp.types import ToolAnnotations
from pydantic import Field

from rag_lib.server import service
from rag_lib.server.graph_routes import _safe

Collection = Annotated[str | None, Field(max_length=200, description="Collection name (default: the configured one).")]


def register_graph_tools(server, kb: Callable[[], Any], _call: Callable[..., Any]) -> None:
    """Add the graph tools to an MCP server; `kb()` returns the shared knowledge base and `_call` runs
    a library call the way every other tool does (input checks, errors an agent can read, no leaks)."""
    readonly = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=readonly)
    def rag_hybrid_context(
        query: Annotated[str, Field(min_length=1, max_length=4000, description="The question, in plain words.")],
        ticker: Annotated[str | None, Field(max_length=16, description="The ticker the question is about.")] = None,
        token_budget: Annotated[int, Field(ge=64, le=16000, description="Maximum tokens of markdown.")] = 2000,
        analysis_type: Annotated[str | None, Field(max_length=200, description=(
            "Only passages of this document type, e.g. earnings-analysis (learnings are still added)."))] = None,
        exclude_doc_id: Annotated[str | None, Field(max_length=512, description=(
            "Leave this document out, e.g. the analysis being written."))] = None,
        collection: Collection = None,
    ) -> dict[str, Any]:
        """Prompt-ready context combining passages (with [n] citations) and knowledge-graph facts
        (biases, strategies, catalysts, peers, learnings). Relationship questions go graph-first
        (related tickers, then search across them); comparisons get one list per ticker; trend
        questions are time-ordered; learnings are always included. Seed 004's names are there too:
        vector_results (the hits used), graph_context and formatted (the markdown)."""
        out = _call(service.hybrid_context, kb(), query, ticker=ticker, token_budget=token_budget,
                    collection=collection, analysis_type=analysis_type, exclude_doc_id=exclude_doc_id).to_dict()
        # seed 001's names for the same parts: context (markdown), citations, query_type, strategy
        out.update(context=out["markdown"], citations=out["hits"], query_type=out["kind"], strategy=out["route"])
        return _safe(out)

    @server.tool(annotations=readonly)
    def rag_graph(
        node: Annotated[str, Field(min_length=1, max_length=512, description=(
            "A ticker (NVDA), document path or id, entity name (loss-aversion) or node key."))],
        depth: Annotated[int, Field(ge=1, le=3, description="Steps from the node.")] = 1,
        predicates: Annotated[list[str] | None, Field(description="Follow only these predicates.")] = None,
        to: Annotated[str | None, Field(max_length=512, description="Return the shortest path to this node.")] = None,
        context: Annotated[bool, Field(description="Treat node as a ticker and return its graph context.")] = False,
        collection: Collection = None,
    ) -> dict[str, Any]:
        """Explore the knowledge graph: edges around a node with their provenance (document and
        section), the shortest path between two nodes, or a ticker's related biases, strategies,
        catalysts, sectors, trades, learnings and peer tickers."""
        base = kb()
        if to:
            return _safe(_call(base.graph_path, node, to, collection=collection))
        if context:
            return _safe(_call(base.ticker_context, node, depth=max(depth, 2), collection=collection))
        return _safe(_call(base.neighbors, node, depth=depth, predicates=predicates, collection=collection))
