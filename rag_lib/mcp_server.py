"""MCP server (official `mcp` SDK, `MCPServer`): the knowledge base as agent tools over stdio or
streamable HTTP. Library errors come back as tool errors (`is_error`), never as crashes.
(Named `mcp_server` so it does not shadow the `mcp` package.)"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings, get_settings
from rag_lib.errors import ConfigError, DatabaseError, RagError
from rag_lib.server import service
from rag_lib.server.errors import _has_nul, client_message
from rag_lib.server.graph_tools import register_graph_tools
from rag_lib.server.security import HostPolicy, KeyRing, Scope, check_bind, key_from_headers

_log = logging.getLogger("rag_lib.mcp")

INSTRUCTIONS = (
    "Knowledge base of trading research: stock and earnings analyses, research notes, ticker profiles, "
    "trade journals, strategies, learnings and scanner configs. Start with rag_search (or rag_context to get "
    "prompt-ready text with citations). Results are chunks identified by unit_id '<path>#<section>'; pass a "
    "unit_id or document path to rag_similar to find related material. rag_list and rag_status show what is "
    "indexed. rag_embed adds or updates a document."
)

Query = Annotated[str, Field(min_length=1, max_length=4000, description="What to look for, in plain words.")]
ModeArg = Annotated[
    Literal["semantic", "lexical", "hybrid"] | None,
    Field(description="semantic (meaning), lexical (exact words, tickers, ids) or hybrid (both; default)."),
]
TopK = Annotated[int, Field(ge=1, le=100, description="How many results to return.")]
Value = Annotated[str, Field(min_length=1, max_length=200)]
OneOrMany = Annotated[Value | Annotated[list[Value], Field(max_length=50)] | None,
                      Field(description="One value or a list of up to 50 (any of).")]
Collection = Annotated[str | None, Field(min_length=1, max_length=200,
                                         description="Collection name (default: the configured one).")]


def _call(fn, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Run a service call; a library error becomes a tool error the agent can read and act on (no
    database text or server paths: those go to the log)."""
    if _has_nul([args, kwargs]):
        raise ToolError("invalid_character: a text argument holds a NUL character; remove it")
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


def create_mcp(kb_factory, keys: KeyRing | None = None, read_only: bool = False) -> MCPServer:
    """Build the MCP server. `kb_factory()` returns the (shared, long-lived) knowledge base; it is
    called on the first tool call so the server answers `initialize` at once."""
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

    server = MCPServer("rag-kb", instructions=INSTRUCTIONS, version="1.0.0", log_level="WARNING")
    readonly_hint = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=readonly_hint)
    def rag_search(
        query: Query,
        mode: ModeArg = None,
        top_k: TopK = 10,
        doc_type: OneOrMany = None,
        ticker: OneOrMany = None,
        section: Annotated[str | None, Field(min_length=1, max_length=200,
                                             description="Only this top-level section (YAML key / H2).")] = None,
        date_from: Annotated[dt.date | None, Field(description="Documents dated on or after (YYYY-MM-DD).")] = None,
        date_to: Annotated[dt.date | None, Field(description="Documents dated on or before (YYYY-MM-DD).")] = None,
        min_similarity: Annotated[float, Field(ge=0, le=1, description="Drop results scoring below this.")] = 0.0,
        collection: Collection = None,
    ) -> dict[str, Any]:
        """Search the trading-research knowledge base. Returns ranked chunks with score, unit_id
        ('<path>#<section>'), document id, type, ticker, date, an excerpt and the chunk text.
        Filter by doc_type (e.g. stock-analysis, earnings-analysis, research, ticker-profile,
        trade-journal, strategy, learning), ticker (e.g. NVDA), section or date range."""
        filters = {"doc_type": doc_type, "ticker": ticker, "section": section, "date_from": date_from, "date_to": date_to}
        return _json_safe(_call(service.search, kb(), query, mode=mode, filters=filters, top_k=top_k,
                                min_similarity=min_similarity, collection=collection))

    @server.tool(annotations=readonly_hint)
    def rag_similar(
        ref: Annotated[str, Field(min_length=1, max_length=512,
                                  description="A unit_id from a search result, a chunk id, a document path or id.")],
        top_k: TopK = 10,
        collection: Collection = None,
    ) -> dict[str, Any]:
        """Find chunks similar to something already in the knowledge base (a search result's
        unit_id, or a document), e.g. other analyses of the same setup."""
        return _json_safe(_call(service.similar, kb(), ref, top_k=top_k, collection=collection))

    @server.tool(annotations=readonly_hint)
    def rag_context(
        query: Query,
        token_budget: Annotated[int, Field(ge=50, le=16000, description="Maximum tokens of context to return.")] = 2000,
        mode: ModeArg = None,
        ticker: OneOrMany = None,
        doc_type: OneOrMany = None,
        collection: Collection = None,
    ) -> dict[str, Any]:
        """Prompt-ready context for a question: the most relevant passages, within token_budget,
        each marked with a citation ([1], [2], ...) that maps to a unit_id in `citations`."""
        filters = {"ticker": ticker, "doc_type": doc_type}
        return _json_safe(_call(service.context, kb(), query, token_budget=token_budget, mode=mode,
                                filters=filters, collection=collection))

    @server.tool(annotations=readonly_hint)
    def rag_status(
        collection: Collection = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="Skipped inputs per page.")] = 100,
        offset: Annotated[int, Field(ge=0, le=10_000_000, description="Start of the skipped page.")] = 0,
    ) -> dict[str, Any]:
        """What is indexed: document, chunk and token counts, documents per type, the active
        embedding space, skipped inputs (one page; skipped_total counts all) and recent failures."""
        return _json_safe(service.page_status(_call(kb().status, collection), limit, offset))

    @server.tool(annotations=readonly_hint)
    def rag_list(
        collection: Collection = None,
        limit: Annotated[int, Field(ge=1, le=1000, description="Page size.")] = 100,
        offset: Annotated[int, Field(ge=0, le=10_000_000,
                                     description="Start of the page; use next_offset from the last page.")] = 0,
    ) -> dict[str, Any]:
        """List indexed documents (path, id, type, ticker, date, chunk count), one page at a time."""
        return _json_safe(_call(service.list_sources, kb(), collection=collection, limit=limit, offset=offset))

    register_graph_tools(server, kb)  # rag_hybrid_context, rag_graph (rag_lib/server/graph_tools.py)

    if not read_only:

        @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
        def rag_embed(
            ctx: Context,
            path: Annotated[str | None, Field(max_length=4096, description=(
                "A file inside a configured corpus root (absolute, or relative to the root)."))] = None,
            name: Annotated[str | None, Field(max_length=512, description=(
                "With `content`: the relative name to store it under, e.g. notes/2025-06-01-fed.md."))] = None,
            content: Annotated[str | None, Field(max_length=1_000_000, description=(
                "Text of a YAML or markdown document to add (give `name` too)."))] = None,
            collection: Collection = None,
            force: Annotated[bool, Field(description="Re-process even if unchanged.")] = False,
        ) -> dict[str, Any]:
            """Add or update one document: either `path` (a file in a corpus root) or `name` +
            `content`. Unchanged documents are skipped; returns new/changed/unchanged/skipped counts."""
            if ctx.headers is not None:  # over HTTP: a read-only key may not write
                try:
                    keyring.authorize(key_from_headers(ctx.headers), Scope.WRITE)
                except RagError as exc:
                    raise ToolError(f"{exc.code}: {exc}") from exc
            if (path is None) == (content is None) or (content is not None and not name):
                raise ToolError("invalid_input: give either `path`, or `name` and `content`")
            if path is not None:
                return _call(service.embed_path, kb(), path, collection=collection, force=force)
            return _call(service.embed_content, kb(), name, content, collection=collection, force=force)

    return server


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
    from rag_lib.server.logs import setup_json_logging

    settings = settings or get_settings()
    keys = KeyRing.from_env(settings)
    setup_json_logging("WARNING")

    def factory() -> KnowledgeBase:
        base = KnowledgeBase(settings)
        service.warm_up(base)
        return base

    if transport == "stdio":
        create_mcp(factory, keys, read_only).run("stdio")
        return
    if transport != "http":
        raise ValueError(f"unknown transport '{transport}'; use stdio or http")
    import uvicorn

    host = host or settings.server.host
    port = port if port is not None else settings.server.port
    check_bind(host, keys)
    kb = factory()  # load once, before the first session
    server = create_mcp(lambda: kb, keys, read_only)
    # loopback mode: explicit DNS-rebinding protection with our loopback rule (the SDK's own default
    # covers only 127.0.0.1/localhost/::1, not e.g. 127.0.0.2)
    security = None if keys.enabled else HostPolicy.from_settings(settings, host, port).transport_security()
    app = server.streamable_http_app(host=host, max_request_body_size=settings.server.max_body_bytes,
                                     transport_security=security)
    try:
        uvicorn.run(_KeyGate(app, keys), host=host, port=port, log_config=None, access_log=False,
                    log_level="warning", server_header=False)
    finally:
        kb.close()
