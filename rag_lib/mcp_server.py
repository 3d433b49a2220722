"""MCP server (official `mcp` SDK, `MCPServer`): the knowledge base as agent tools over stdio or
streamable HTTP. Library errors come back as tool errors (`is_error`), never as crashes.
(Named `mcp_server` so it does not shadow the `mcp` package.)"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field
from pydantic import ValidationError as PydanticValidationError

from rag_lib.api import KnowledgeBase
from rag_lib.config import ServerSettings, Settings, get_settings
from rag_lib.errors import ConfigError, DatabaseError, RagError
from rag_lib.server import schemas as s
from rag_lib.server import service
from rag_lib.server.errors import _has_nul, client_message
from rag_lib.server.graph_tools import register_graph_tools
from rag_lib.server.security import HostPolicy, KeyRing, Scope, check_bind, key_from_headers

_log = logging.getLogger("rag_lib.mcp")

INSTRUCTIONS = (
    "Knowledge base of trading research: stock and earnings analyses, research notes, ticker profiles, "
    "trade journals, strategies, learnings and scanner configs. Start with rag_search (or rag_context / "
    "rag_hybrid_context to get prompt-ready text with citations). Results are chunks identified by unit_id "
    "'<path>#<section>'; rag_similar finds a ticker's closest analyses (or material related to a unit_id). "
    "rag_search_rerank and rag_search_expanded trade speed for relevance and recall; rag_classify_query and "
    "rag_expand_query show how a query is understood. rag_list and rag_status show what is indexed, "
    "rag_metrics_summary how searches perform, rag_evaluate judges an answer against its contexts. "
    "rag_embed and rag_embed_text add documents."
)

Query = Annotated[str, Field(min_length=1, max_length=s.MAX_QUERY, description="What to look for, in plain words.")]
ModeArg = Annotated[
    Literal["semantic", "lexical", "hybrid"] | None,
    Field(description="semantic (meaning), lexical (exact words, tickers, ids) or hybrid (both; default)."),
]
TopK = Annotated[int, Field(ge=1, le=100, description="How many results to return.")]
OneOrMany = Annotated[Annotated[str, Field(min_length=1, max_length=200)] | list[Annotated[str, Field(min_length=1, max_length=200)]] | None,
                      Field(max_length=50, description="One value or a list (any of).")]
Ticker = Annotated[Annotated[str, Field(min_length=1, max_length=16)] | list[Annotated[str, Field(min_length=1, max_length=16)]] | None,
                   Field(max_length=50, description="Ticker filter, e.g. NVDA, or a list of tickers (any of).")]
DocType = Annotated[Annotated[str, Field(min_length=1, max_length=200)] | list[Annotated[str, Field(min_length=1, max_length=200)]] | None,
                    Field(max_length=50, description="Document type filter, e.g. earnings-analysis, stock-analysis, "
                          "research, ticker-profile, trade-journal, strategy, learning, post-trade-review.")]
Collection = Annotated[s.CollectionName | None, Field(description="Collection name (default: the configured one, "
                                                                  "usually 'default').")]
EveryCollection = Annotated[s.CollectionName | None, Field(description="Only this collection (default: every collection).")]
Section = Annotated[str | None, Field(min_length=1, max_length=200, description="Only sections whose path contains this, in any case (e.g. 'risk').")]


def _call(fn, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run a service call; a library error becomes a tool error the agent can read and act on (no
    database text or server paths: those go to the log)."""
    if _has_nul([args, kwargs]):
        raise ToolError("invalid_character: a text argument holds a NUL character; remove it")
    named = {**{f"argument {n}": a for n, a in enumerate(args) if not isinstance(a, KnowledgeBase)}, **kwargs}
    problem = s.invalid_value(named)
    if problem:  # the same refusal as the HTTP schemas: before anything is read or written
        raise ToolError(f"invalid_input: {problem}")
    try:
        return fn(*args, **kwargs)
    except RagError as exc:
        status = 503 if isinstance(exc, DatabaseError) else 500 if isinstance(exc, ConfigError) else 400
        if status >= 500:
            _log.error("tool failed", exc_info=exc, extra={"code": exc.code})
        raise ToolError(f"{exc.code}: {client_message(exc, status, _hidden_roots(args))}") from exc
    except Exception as exc:  # noqa: BLE001 - a tool call never takes the server down
        _log.error("tool crashed", exc_info=exc, extra={"error_type": type(exc).__name__})
        raise ToolError("internal_error: the tool failed; see the server log") from exc


async def _ingest_call(kb: KnowledgeBase, fn, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """`_call` of an ingest on the ingest executor (see `service.run_ingest`): searches never wait for it."""
    return await service.run_ingest(kb.settings.server.ingest_workers, _call, fn, kb, *args, **kwargs)


def _hidden_roots(args: tuple) -> list[Any]:
    kb = next((a for a in args if isinstance(a, KnowledgeBase)), None)
    if kb is None:
        return []
    cfg = kb.settings.server
    roots = [*cfg.corpus_roots, cfg.upload_dir or (kb.settings.home / "uploads"), kb.settings.home]
    return roots + [Path(r).resolve() for r in roots]


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value


class StrictMCPServer(MCPServer):
    """An argument a tool does not take is an error naming the ones it does: the SDK ignores it, so an
    agent passing `filters` to `rag_search` (which takes `ticker`, `date_from`…) got unfiltered
    results as if they were filtered. The tools' input schemas publish the limits settings.server
    enforces (`schemas.bound_schema`), read from `limits()` when the tools are first listed."""

    limits: Callable[[], ServerSettings | None] | None = None

    async def list_tools(self) -> list[Any]:
        if self.limits is not None:
            server = await anyio.to_thread.run_sync(self.limits)
            if server is not None:  # None: no knowledge base yet (bound at the next listing)
                for tool in self._tool_manager.list_tools():
                    s.bound_schema(tool.parameters, server)
                self.limits = None
        return await super().list_tools()

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None) -> Any:
        schema = self._tool_input_schema(name)
        if schema is not None:
            known = list(schema.get("properties", {}))
            if unknown := sorted(set(arguments or {}) - set(known)):
                raise ToolError(f"{name} takes no argument {', '.join(map(repr, unknown))}; "
                                f"its arguments: {', '.join(known)}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            # the SDK's message is pydantic's whole report (model name, input, a link): one line per
            # argument instead, as the HTTP API answers (`top_k: Input should be ...`)
            if isinstance(exc.__cause__, PydanticValidationError):
                problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                                     for e in exc.__cause__.errors())
                raise ToolError(f"invalid_input: {problems}") from None
            raise


def create_mcp(kb_factory, keys: KeyRing | None = None, read_only: bool = False,
               settings: Settings | None = None) -> MCPServer:
    """Build the MCP server. `kb_factory()` returns the (shared, long-lived) knowledge base; it is
    called on the first tool call so the server answers `initialize` at once. The tools' schemas show
    `settings`' limits (default: the knowledge base's, read when the tools are first listed)."""
    keyring = keys or KeyRing()
    lock = threading.Lock()
    holder: dict[str, KnowledgeBase] = {}

    def kb() -> KnowledgeBase:
        with lock:
            if "kb" not in holder:
                try:
                    holder["kb"] = kb_factory()
                except RagError as exc:  # e.g. database down: tell the agent, retry on the next call
                    raise ToolError(f"{exc.code}: {exc}") from exc
            return holder["kb"]

    def require_write(ctx: Context) -> None:
        if ctx.headers is not None:  # over HTTP: a read-only key may not write
            _call(keyring.authorize, key_from_headers(ctx.headers), Scope.WRITE)

    def limits() -> ServerSettings | None:
        if settings is not None:
            return settings.server
        try:
            base = kb()
        except ToolError:  # e.g. the database is down: listed unbounded now, bound at the next listing
            return None
        return base.settings.server if isinstance(base, KnowledgeBase) else None

    server = StrictMCPServer("rag-kb", instructions=INSTRUCTIONS, version="1.0.0", log_level="WARNING")
    server.limits = limits
    readonly_hint = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=readonly_hint)
    def rag_search(
        query: Query,
        mode: ModeArg = None,
        top_k: Annotated[int | None, Field(ge=1, le=100, description=(
            "How many results to return (default: the server's search.top_k, 10)."))] = None,
        doc_type: DocType = None,
        ticker: Ticker = None,
        section: Section = None,
        date_from: Annotated[dt.date | None, Field(description="Documents dated on or after (YYYY-MM-DD).")] = None,
        date_to: Annotated[dt.date | None, Field(description="Documents dated on or before (YYYY-MM-DD).")] = None,
        min_similarity: Annotated[float, Field(ge=0, le=1, description=(
            "Drop results whose cosine similarity to the query (`similarity`) is below this, whichever "
            "retriever found them; the seeds use 0.3-0.4."))] = 0.0,
        collection: Collection = None,
    ) -> s.SearchResponse:
        """Search the trading-research knowledge base. Returns ranked chunks with score, similarity (cosine),
        unit_id ('<path>#<section>'), document id, type, ticker, date, an excerpt and the chunk text
        (also under the seeds' names content, file_path, section_label).
        Filter by doc_type (e.g. stock-analysis, earnings-analysis, research, ticker-profile,
        trade-journal, strategy, learning), ticker (e.g. NVDA, or a list of peers), section or date range."""
        filters = {"doc_type": doc_type, "ticker": ticker, "section": section, "date_from": date_from, "date_to": date_to}
        return _call(service.search, kb(), query, mode=mode, filters=filters, top_k=top_k,
                     min_similarity=min_similarity, collection=collection)

    @server.tool(annotations=readonly_hint)
    def rag_search_rerank(
        query: Query,
        ticker: Ticker = None,
        top_k: TopK = 5,
        doc_type: DocType = None,
        mode: ModeArg = None,
        collection: Collection = None,
    ) -> s.SearchResponse:
        """Search with second-stage reranking for higher relevance: a wider candidate pool is rescored
        by the configured reranker (cross-encoder or /rerank service); each hit keeps its fused `score`
        beside its `rerank_score`. Slower than rag_search. `reranked` says whether a reranker ran; without
        one the hybrid order is kept and `rerank_note` names the setting that turns reranking on."""
        return _call(service.search, kb(), query, mode=mode, filters={"ticker": ticker, "doc_type": doc_type},
                     top_k=top_k, collection=collection, rerank=True)

    @server.tool(annotations=readonly_hint)
    def rag_search_expanded(
        query: Query,
        ticker: Ticker = None,
        top_k: TopK = 5,
        n_expansions: Annotated[int, Field(ge=0, le=10, description="How many query variations to add.")] = 3,
        doc_type: DocType = None,
        collection: Collection = None,
    ) -> dict[str, Any]:
        """Search with query expansion for better recall: the query and up to n_expansions variations
        (from the configured chat model; none when no expander is configured) are searched and merged,
        best score per chunk first. `queries` lists what was searched, `matched_query` on each hit which one found it."""
        return _json_safe(_call(service.search_expanded, kb(), query, n_expansions=n_expansions, top_k=top_k,
                                filters={"ticker": ticker, "doc_type": doc_type}, collection=collection))

    @server.tool(annotations=readonly_hint)
    def rag_classify_query(query: Query, collection: Collection = None) -> dict[str, Any]:
        """Classify a query to pick a retrieval strategy: query_type (retrieval, relationship, trend,
        comparison, global), the known tickers and document types it names, suggested_strategy
        (vector, graph, hybrid) and a confidence (rule-based: 0.9 when a rule matched, 0.5 for the default)."""
        return _call(service.classify_query, kb(), query, collection)

    @server.tool(annotations=readonly_hint)
    def rag_expand_query(
        query: Query,
        n: Annotated[int, Field(ge=1, le=10, description="How many variations to generate.")] = 3,
    ) -> dict[str, Any]:
        """Generate variations of a query (synonyms, full company names, technical terms) with the
        configured chat model: original, variations and all_queries (original first). Without a
        configured expander `variations` is empty and `expander` is 'none'."""
        return _call(service.expand_query, kb(), query, n)

    @server.tool(annotations=readonly_hint)
    def rag_similar(
        ticker: Annotated[str | None, Field(min_length=1, max_length=10, description=(
            "Find this ticker's analyses closest to its thesis, catalysts and risks (one per document)."))] = None,
        analysis_type: Annotated[str | None, Field(max_length=200, description=(
            "With ticker: only this document type, e.g. earnings-analysis or stock-analysis."))] = None,
        ref: Annotated[str | None, Field(min_length=1, max_length=s.MAX_NAME, description=(
            "Instead of ticker: a unit_id from a search result, a chunk id, a document path or id; finds "
            "related documents."))] = None,
        top_k: TopK = 5,
        collection: Collection = None,
    ) -> dict[str, Any]:
        """Find similar past analyses for a ticker (`ticker`, optional `analysis_type`), or material
        similar to something already in the knowledge base (`ref`: a search result's unit_id or a document)."""
        if (ticker is None) == (ref is None):
            raise ToolError("invalid_input: give either `ticker` or `ref`")
        if ticker is not None:
            return _json_safe(_call(service.similar_for_ticker, kb(), ticker, analysis_type=analysis_type,
                                    top_k=top_k, collection=collection))
        return _json_safe(_call(service.similar, kb(), ref, top_k=top_k, collection=collection))

    @server.tool(annotations=readonly_hint)
    def rag_context(
        query: Query,
        token_budget: Annotated[int, Field(ge=50, le=16000, description="Maximum tokens of context to return.")] = 2000,
        mode: ModeArg = None,
        ticker: Ticker = None,
        doc_type: DocType = None,
        collection: Collection = None,
    ) -> dict[str, Any]:
        """Prompt-ready context for a question: the most relevant passages, within token_budget,
        each marked with a citation ([1], [2], ...) that maps to a unit_id in `citations`."""
        filters = {"ticker": ticker, "doc_type": doc_type}
        return _json_safe(_call(service.context, kb(), query, token_budget=token_budget, mode=mode,
                                filters=filters, collection=collection))

    @server.tool(annotations=readonly_hint)
    def rag_status(
        collection: EveryCollection = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="Skipped inputs per page.")] = 100,
        offset: Annotated[int, Field(ge=0, le=10_000_000, description="Start of the skipped page.")] = 0,
    ) -> dict[str, Any]:
        """What is indexed: document, chunk and token counts, documents per type, the active
        embedding space, index size (index_size_mb), skipped inputs (one page; skipped_total counts all) and recent failures."""
        return _json_safe(service.page_status(_call(service.status, kb(), collection), limit, offset))

    @server.tool(annotations=readonly_hint)
    def rag_list(
        collection: EveryCollection = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="Page size.")] = 100,
        offset: Annotated[int, Field(ge=0, le=10_000_000, description="Start of the page; use next_offset from the last page.")] = 0,
    ) -> dict[str, Any]:
        """List indexed documents (path, id, type, ticker, date, chunk count, content hash), one page at a time."""
        return _json_safe(_call(service.list_sources, kb(), collection=collection, limit=limit, offset=offset))

    @server.tool(annotations=readonly_hint)
    def rag_metrics_summary(
        days: Annotated[float, Field(gt=0, le=3650, description="Days to summarise (default 7).")] = 7,
    ) -> dict[str, Any]:
        """Search and embedding metrics for recent activity: latency p50/p95 per mode, zero-result rate,
        query-class and strategy mix, embed failure rate and fallback share."""
        return _json_safe(_call(service.metrics_summary, kb(), days=days))

    @server.tool(annotations=readonly_hint)
    def rag_evaluate(
        query: Query,
        contexts: Annotated[list[Annotated[str, Field(max_length=s.MAX_TEXT)]], Field(
            min_length=1, max_length=50, description="The retrieved passages the answer was based on.")],
        answer: Annotated[str, Field(min_length=1, max_length=s.MAX_TEXT, description="The answer to judge.")],
        ground_truth: Annotated[str | None, Field(max_length=s.MAX_TEXT, description=(
            "A reference answer (improves context recall).")) ] = None,
    ) -> dict[str, Any]:
        """Evaluate a RAG answer with RAGAS metrics judged by the configured chat model: context
        precision, context recall (with ground_truth), faithfulness, answer_relevancy (each 0-1) and
        overall_score (their harmonic mean). Without a configured chat model every metric is null and
        `error_message` names the setting to set (eval.judge_model)."""
        return _json_safe(_call(service.evaluate, kb(), query, contexts, answer, ground_truth))

    register_graph_tools(server, kb, _call)  # rag_hybrid_context, rag_graph (rag_lib/server/graph_tools.py)

    if not read_only:

        @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
        async def rag_embed(
            ctx: Context,
            file_path: Annotated[str | None, Field(max_length=4096, description=(
                "A YAML or markdown file inside a configured corpus root (absolute, or relative to the root)."))] = None,
            path: Annotated[str | None, Field(max_length=4096, description="Same as file_path.")] = None,
            name: Annotated[str | None, Field(max_length=s.MAX_NAME, description=(
                "With `content`: the relative name to store it under, e.g. notes/2025-06-01-fed.md."))] = None,
            content: Annotated[str | None, Field(max_length=1_000_000, description=(
                "Text of a YAML or markdown document to add (give `name` too)."))] = None,
            collection: Collection = None,
            force: Annotated[bool, Field(description="Re-process even if unchanged.")] = False,
        ) -> s.EmbedResponse:
            """Embed a YAML document: either `file_path` (a file in a corpus root) or `name` + `content`.
            Unchanged documents are skipped; returns doc_id, status, chunks, tokens_processed and counts."""
            require_write(ctx)
            if file_path is not None and path is not None:
                raise ToolError("invalid_input: give `file_path` or `path`, not both")
            path = file_path if file_path is not None else path
            if (path is None) == (content is None) or (content is not None and not name):
                raise ToolError("invalid_input: give either `file_path`, or `name` and `content`")
            base = await anyio.to_thread.run_sync(kb)
            if path is not None:
                return await _ingest_call(base, service.embed_path, path, collection=collection, force=force)
            return await _ingest_call(base, service.embed_content, name, content, collection=collection, force=force)

        @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
        async def rag_embed_text(
            ctx: Context,
            text: Annotated[str, Field(min_length=1, max_length=s.MAX_TEXT, description="The text to store.")],
            doc_id: Annotated[str, Field(min_length=1, max_length=200, pattern=s.DOC_ID_PATTERN,
                                         description="Id of the document, e.g. external-article-001.")],
            doc_type: Annotated[str | None, Field(max_length=200, description="Document type, e.g. article.")] = None,
            ticker: Annotated[str | None, Field(min_length=1, max_length=10, pattern=s.TICKER_PATTERN,
                                                description="Ticker, e.g. NVDA.")] = None,
            title: Annotated[str | None, Field(max_length=500, description="Title of the text.")] = None,
            collection: Collection = None,
        ) -> s.StoredTextResponse:
            """Embed raw text (an article, a note) as a searchable document with doc_id, doc_type and
            ticker; returns its chunk count. The same doc_id again replaces it (unchanged text is skipped)."""
            require_write(ctx)
            base = await anyio.to_thread.run_sync(kb)
            return await _ingest_call(base, service.store_text, text, doc_id=doc_id, doc_type=doc_type, ticker=ticker,
                                      title=title, collection=collection)

    return server


def tool_list(read_only: bool = False) -> list[tuple[str, str]]:
    """(name, first line of the description) of every tool the server serves, from the server itself."""
    import anyio

    server = create_mcp(lambda: None, read_only=read_only)
    tools = anyio.run(server.list_tools)
    return [(t.name, re.split(r"(?<=\.)\s", " ".join((t.description or "").split()), maxsplit=1)[0].rstrip("."))
            for t in tools]


class _KeyGate:
    """ASGI wrapper for the MCP HTTP app: every request needs a valid key (when keys exist)."""

    def __init__(self, app, keys: KeyRing):
        self.app = app
        self.keys = keys

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and self.keys.enabled:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            try:
                self.keys.authorize(key_from_headers(headers), Scope.READ)
            except RagError as exc:
                from starlette.responses import JSONResponse

                response = JSONResponse({"error": {"code": exc.code, "message": str(exc)}}, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def run_mcp(settings: Settings | None = None, transport: str = "stdio", host: str | None = None,
            port: int | None = None, read_only: bool = False) -> None:
    """Serve the tools over stdio (logs to stderr; stdout is the protocol) or streamable HTTP."""
    from rag_lib.log import setup_server_logging

    settings = settings or get_settings()
    keys = KeyRing.from_env(settings)
    setup_server_logging("WARNING")

    def factory() -> KnowledgeBase:
        base = KnowledgeBase(settings)
        service.warm_up(base)
        return base

    if transport == "stdio":
        create_mcp(factory, keys, read_only, settings).run("stdio")
        return
    if transport != "http":
        raise ValueError(f"unknown transport '{transport}'; use stdio or http")
    import uvicorn

    host = host or settings.server.host
    port = port if port is not None else settings.server.port
    check_bind(host, keys)
    kb = factory()  # load once, before the first session
    server = create_mcp(lambda: kb, keys, read_only, settings)
    # loopback mode: explicit DNS-rebinding protection with our loopback rule (the SDK's own default
    # covers only 127.0.0.1/localhost/::1, not e.g. 127.0.0.2)
    security = None if keys.enabled else HostPolicy.from_settings(settings, host, port).transport_security()
    app = server.streamable_http_app(host=host, max_request_body_size=settings.server.max_body_bytes,
                                     transport_security=security)
    try:
        from rag_lib.server import proxy_options

        uvicorn.run(_KeyGate(app, keys), host=host, port=port, log_config=None, access_log=False,
                    log_level="warning", server_header=False, **proxy_options(settings))
    finally:
        kb.close()


if __name__ == "__main__":  # `python -m rag_lib.mcp_server [--transport http ...]`, as `rag mcp`
    import sys

    from rag_lib.cli import app

    app(["mcp", *sys.argv[1:]], prog_name="rag")
