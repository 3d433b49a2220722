"""The FastAPI application: routes, API-key auth, body limit, request ids, JSON errors and logs.
Routes are plain `def`s: FastAPI runs them in its threadpool, so the event loop never blocks."""


import logging
import re
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope as AsgiScope, Send

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings, get_settings
from rag_lib.errors import (
    AmbiguousReferenceError,
    ConfigError,
    DatabaseError,
    DimensionMismatchError,
    DocumentError,
    EmbeddingError,
    NotFoundError,
    QueryTimeoutError,
    RagError,
    ValidationError,
)
from rag_lib.log import request_id_var
from rag_lib.server import schemas as s
from rag_lib.server import service
from rag_lib.server.errors import RequestGuard, client_message, send_error
from rag_lib.server.graph_routes import graph_router
from rag_lib.server.security import (
    AuthError,
    ForbiddenError,
    HostPolicy,
    KeyRing,
    PathNotAllowedError,
    Scope,
    key_from_headers,
)

log = logging.getLogger("rag_lib.server")
access_log = logging.getLogger("rag_lib.server.access")

STATUS_OF: list[tuple[type[RagError], int]] = [
    (AuthError, 401), (ForbiddenError, 403), (PathNotAllowedError, 403), (NotFoundError, 404),
    (AmbiguousReferenceError, 409),
    (DimensionMismatchError, 409), (ValidationError, 422), (DocumentError, 422),
    (EmbeddingError, 502), (DatabaseError, 503), (QueryTimeoutError, 504), (ConfigError, 500),
]
HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
              413: "payload_too_large", 415: "unsupported_media_type", 422: "invalid_input", 429: "too_many_requests",
              500: "internal_error", 501: "not_implemented", 503: "unavailable"}
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")

# codes of serving errors whose class is not in STATUS_OF
_EXTRA_STATUS = {"upload_quota_exceeded": 413, "document_conflict": 409, "invalid_character": 422, "document_rejected": 422, "parser_busy": 503}

ERRORS = {code: {"model": s.ErrorResponse} for code in (401, 403, 404, 409, 413, 422, 500, 504)}


def error_response(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None) -> JSONResponse:
    body: dict[str, Any] = {"code": code, "message": message, "request_id": request_id_var.get()}
    if details:
        body["details"] = details
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse({"error": body}, status_code=status, headers=headers)


class RequestContext:
    """Pure ASGI middleware: request id, body-size limit (413) and one access-log line per request.
    Pure ASGI (not BaseHTTPMiddleware) so the body limit applies while the body streams in."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app = app
        self.max_body = max_body_bytes

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        given = headers.get("x-request-id", "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        token = request_id_var.set(rid)
        started = time.perf_counter()
        status = {"code": 500}

        async def send_wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["started"] = True
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(b"x-request-id", rid.encode())]
            await send(message)

        try:
            length = headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > self.max_body):
                await error_response(413, "payload_too_large",
                                     f"request body is larger than {self.max_body} bytes")(scope, receive, send_wrapped)
                return
            received = 0

            async def receive_limited() -> Message:
                nonlocal received
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > self.max_body:
                        exc = _BodyTooLarge()
                        exc.detail = f"request body is larger than {self.max_body} bytes"
                        raise exc
                return message

            try:
                await self.app(scope, receive_limited, send_wrapped)
            except _BodyTooLarge:
                await error_response(413, "payload_too_large",
                                     f"request body is larger than {self.max_body} bytes")(scope, receive, send_wrapped)
            except Exception as exc:  # noqa: BLE001 - logged with its request id; the client gets only the id
                log.error("unexpected error", exc_info=exc, extra={"error_type": type(exc).__name__})
                if status["code"] == 500 and not status.get("started"):
                    await send_error(send_wrapped, 500, "internal_error",
                                     "internal error; see the server log for this request id")
        finally:
            access_log.info(
                "request", extra={
                    "method": scope.get("method"), "path": scope.get("path"), "status": status["code"],
                    "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                    "client": (scope.get("client") or ("?",))[0],
                },
            )
            request_id_var.reset(token)


class _BodyTooLarge(StarletteHTTPException):
    """Raised while the body streams in; FastAPI re-raises HTTP exceptions from body reading as-is."""

    def __init__(self) -> None:
        super().__init__(413, "request body is too large")


def create_app(settings: Settings | None = None, kb: KnowledgeBase | None = None,
               keys: KeyRing | None = None, bind: tuple[str, int] | None = None) -> FastAPI:
    """Build the app. `kb` (tests) is used as given and not closed; otherwise one is opened at start
    and closed at shutdown. Keys come from the environment unless given. Without keys only loopback
    Host/Origin headers (and the bound address, `bind`) are served."""
    settings = settings or (kb.settings if kb else get_settings())
    keyring = keys if keys is not None else KeyRing.from_env(settings)
    host_policy = None if keyring.enabled else HostPolicy.from_settings(settings, *(bind or (None, None)))
    hidden_roots = [*settings.server.corpus_roots, settings.server.upload_dir or (settings.home / "uploads"),
                    settings.home]
    hidden_roots += [FsPath(r).resolve() for r in hidden_roots]
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from starlette.concurrency import run_in_threadpool

        base = kb or KnowledgeBase(settings)
        await run_in_threadpool(service.warm_up, base)  # model + pool load once, before serving
        state["kb"] = base
        log.info("ready", extra={"auth": keyring.enabled, "space": base.embedding_info()["space"]})
        try:
            yield
        finally:
            if kb is None:
                base.close()

    # FastAPIOffline: FastAPI whose /docs and /redoc load Swagger UI and ReDoc from its wheel, not a CDN
    app = FastAPIOffline(
        title="RAG knowledge base API",
        version="1.0.0",
        description=(
            "Search, context assembly and ingestion for the trading-research knowledge base.\n\n"
            "Authenticate with `X-API-Key: <key>` or `Authorization: Bearer <key>`. Read-only keys may "
            "search and read; embedding and deleting need a full-access key. Errors are "
            "`{\"error\": {\"code\", \"message\", \"request_id\"}}` with a stable `code`."
        ),
        lifespan=lifespan,
        responses=ERRORS,
    )
    app.add_middleware(RequestGuard, policy=host_policy)  # inside RequestContext: ids and size limit first
    app.add_middleware(RequestContext, max_body_bytes=settings.server.max_body_bytes)

    # Dependencies are `async def` (they do no I/O): FastAPI runs a sync one on the thread pool, a
    # thread hop (and a wait for the GIL) per dependency per request.
    async def get_kb() -> KnowledgeBase:
        base = state.get("kb")
        if base is None:
            raise DatabaseError("the server is still starting")
        return base

    def require(scope: Scope):
        async def check(request: Request) -> Scope | None:
            return keyring.authorize(key_from_headers(request.headers), scope)

        return check

    KB = Annotated[KnowledgeBase, Depends(get_kb)]
    read = [Depends(require(Scope.READ))]
    write = [Depends(require(Scope.WRITE))]
    Collection = Annotated[s.CollectionName | None, Query(description="Collection (default: settings.collection).")]
    EveryCollection = Annotated[s.CollectionName | None, Query(description="Only this collection (default: every collection).")]
    Ref = Annotated[str, Path(max_length=s.MAX_NAME, description="Document path (relative to its root) or id.")]

    # ---- errors --------------------------------------------------------------------------

    @app.exception_handler(RagError)
    async def rag_error(request: Request, exc: RagError) -> JSONResponse:
        status = next((code for cls, code in STATUS_OF if isinstance(exc, cls)), _EXTRA_STATUS.get(exc.code, 500))
        if status >= 500 and status not in (501, 504):  # the detail (database text, paths) goes to the log only
            log.error("request failed", exc_info=exc, extra={"code": exc.code, "error_type": type(exc).__name__})
        elif status == 504:
            log.warning("request stopped by its time limit", extra={"code": exc.code})
        return error_response(status, exc.code, client_message(exc, status, hidden_roots))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Field locations and reasons only: echoing the rejected input could leak document text.
        details = [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", ""), "type": e.get("type", "")}
                   for e in exc.errors()]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            # pydantic puts the character offset where a field name would be ("0: JSON decode error")
            reason = (exc.errors()[0].get("ctx") or {}).get("error", "JSON decode error")
            offset = first["loc"][-1] if first["loc"] else "?"
            return error_response(422, "invalid_input", f"request body is not valid JSON ({reason} at character "
                                  f"{offset}); send a JSON object with Content-Type: application/json", details)
        where = ".".join(p for p in first["loc"] if p != "body") or "request"
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if where == "request" and kind != "application/json":
            # `curl -d '{...}'` sends form data: FastAPI then reads no JSON object at all
            return error_response(422, "invalid_input", "request body must be a JSON object sent with Content-Type: "
                                  f"application/json (this request says {kind or 'no Content-Type'})", details)
        return error_response(422, "invalid_input", f"{where}: {first['msg']}", details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("unexpected error", exc_info=exc, extra={"error_type": type(exc).__name__})
        return error_response(500, "internal_error", "internal error; see the server log for this request id")

    # ---- routes --------------------------------------------------------------------------

    @app.get("/health", response_model=s.HealthResponse, tags=["ops"],
             responses={503: {"model": s.HealthResponse}})
    def health() -> JSONResponse:
        """Database reachable and model loaded (no key needed; reveals nothing else)."""
        base = state.get("kb")
        data = service.health(base) if base else {"status": "degraded", "database": False, "model": False}
        return JSONResponse(data, status_code=200 if data["status"] == "ok" else 503)

    # Searching routes are `async def` and run their search with `service.run_search`: at most
    # `search_slots` at once per process, on the request thread pool; the response is checked and
    # written on the event loop (a sync route hops to the thread pool for that as well).
    search_slots = service.search_slots(settings)

    @app.post("/api/rag/search", response_model=s.SearchResponse, dependencies=read, tags=["search"])
    async def search(body: s.SearchRequest, kb: KB) -> dict[str, Any]:
        """Semantic, lexical or hybrid search with metadata filters (in `filters`, or seed 000's top-level
        `ticker`, `doc_type`, ...); results carry unit ids and scores."""
        out = await service.run_search(
            search_slots, service.search, kb, body.query, mode=body.mode,
            filters=body.filters.model_dump(exclude_none=True), top_k=body.top_k,
            min_similarity=body.min_similarity, collection=body.collection, rerank=body.rerank,
        )
        return {**out, "request_id": request_id_var.get()}

    @app.post("/api/rag/context", response_model=s.ContextResponse, dependencies=read, tags=["search"])
    async def context(body: s.ContextRequest, kb: KB) -> dict[str, Any]:
        """Context for an LLM prompt: the best passages within a token budget, with citations."""
        out = await service.run_search(search_slots, service.context, kb, body.query, token_budget=body.token_budget,
                                       mode=body.mode, filters=body.filters.model_dump(exclude_none=True),
                                       collection=body.collection)
        return {**out, "request_id": request_id_var.get()}

    @app.post("/api/rag/similar", tags=["search"], dependencies=read)
    async def similar(body: s.SimilarRequest, kb: KB) -> dict[str, Any]:
        """Chunks most similar to a stored unit, chunk or document."""
        return await service.run_search(search_slots, service.similar, kb, body.ref, top_k=body.top_k,
                                        collection=body.collection)

    @app.get("/api/rag/metrics", dependencies=read, tags=["search"])
    def metrics(kb: KB, days: Annotated[float, Query(gt=0, le=3650, description="Summarise the last N days.")] = 7
                ) -> dict[str, Any]:
        """Search and embedding metrics: latency percentiles per mode, zero-result rate, query-class mix,
        embed failure rate and fallback share."""
        return service.metrics_summary(kb, days=days)

    # Ingest routes are `async def` and hand their work to the ingest executor (`service.run_ingest`):
    # one ingest at a time by default, never on the thread pool searches run on.
    ingest_workers = settings.server.ingest_workers

    @app.post("/api/rag/embed", response_model=s.EmbedResponse, dependencies=write, tags=["ingest"])
    async def embed(body: s.EmbedRequest, kb: KB) -> dict[str, Any]:
        """Ingest a file inside a configured corpus root (`path`, or seed 000's `file_path`), or uploaded
        content under a relative name."""
        if body.path is not None:
            out = await service.run_ingest(ingest_workers, service.embed_path, kb, body.path,
                                           collection=body.collection, force=body.force)
        else:
            out = await service.run_ingest(ingest_workers, service.embed_content, kb, body.name or "",
                                           body.content or "", collection=body.collection, force=body.force)
        log.info("embedded", extra={"files": len(out["files"]), "chunks": out["chunks"], "failed": out["failed"]})
        return {**out, "request_id": request_id_var.get()}

    @app.post("/api/rag/embed-text", response_model=s.StoredTextResponse | s.EmbedTextResponse,
              dependencies=write, tags=["ingest"])
    async def embed_text(body: s.EmbedTextRequest, kb: KB) -> dict[str, Any]:
        """With `doc_id` (seed 000): store the text as a document and return its chunk count. Without:
        the text's vector in the active embedding space (nothing stored). Full-access keys only."""
        if body.doc_id is None:
            return await run_in_threadpool(service.embed_text, kb, body.text)
        out = await service.run_ingest(
            ingest_workers, service.store_text, kb, body.text, doc_id=body.doc_id, doc_type=body.doc_type,
            ticker=body.ticker, title=body.title, doc_date=body.doc_date, collection=body.collection, force=body.force)
        return {**out, "request_id": request_id_var.get()}

    @app.get("/api/rag/status", response_model=s.StatusResponse, dependencies=read, tags=["sources"])
    def status(kb: KB, collection: EveryCollection = None,
               limit: Annotated[int, Query(ge=1, le=1000, description="Skipped rows per page.")] = 100,
               offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> dict[str, Any]:
        """Counts of documents, chunks, vectors, index size; skipped inputs (paged) and recent failures."""
        return service.page_status(service.status(kb, collection), limit, offset)

    @app.get("/api/rag/sources", response_model=s.SourcesPage, dependencies=read, tags=["sources"])
    def sources(kb: KB, collection: EveryCollection = None,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> dict[str, Any]:
        """Documents, one page at a time (ordered by collection and path)."""
        return service.list_sources(kb, collection=collection, limit=limit, offset=offset)

    @app.get("/api/rag/sources/{ref:path}", response_model=s.SourceDetail, dependencies=read, tags=["sources"])
    def source(ref: Ref, kb: KB, collection: Collection = None) -> dict[str, Any]:
        """One document with its sections (empty ones too) and chunk summaries."""
        return kb.show(ref, collection)

    @app.delete("/api/rag/sources/{ref:path}", response_model=s.DeleteResponse, dependencies=write,
                tags=["sources"])
    def delete_source(ref: Ref, kb: KB, collection: Collection = None) -> dict[str, Any]:
        """Delete a document and all its sections, chunks and vectors."""
        return service.delete_document(kb, ref, collection)

    # ---- the seeds' paths (000 and 003): aliases of the routes above, same service functions ----

    compat = ["compatibility"]

    @app.delete("/api/rag/document/{doc_id:path}", response_model=s.DeleteResponse, dependencies=write,
                tags=compat)
    def delete_document(doc_id: Ref, kb: KB, collection: Collection = None) -> dict[str, Any]:
        """Seed 000: delete a document by id (or path); alias of `DELETE /api/rag/sources/{ref}`."""
        return service.delete_document(kb, doc_id, collection)

    @app.post("/rag/index", response_model=s.IndexResponse, dependencies=write, tags=compat)
    async def rag_index(body: s.IndexRequest, kb: KB) -> dict[str, Any]:
        """Seed 003: index a file inside a corpus root; alias of `POST /api/rag/embed` with `path`."""
        return await service.run_ingest(ingest_workers, service.index_source, kb, body.source_path,
                                        metadata=body.metadata, collection=body.collection, force=body.force)

    @app.post("/rag/retrieve", response_model=s.RetrieveResponse, dependencies=read, tags=compat)
    async def rag_retrieve(body: s.RetrieveRequest, kb: KB) -> dict[str, Any]:
        """Seed 003: semantic search in seed 003's shape; alias of `POST /api/rag/search`."""
        return await service.run_search(search_slots, service.retrieve, kb, body.query, top_k=body.top_k,
                                        similarity_threshold=body.similarity_threshold,
                                        filters=body.filters.model_dump(exclude_none=True), mode=body.mode,
                                        collection=body.collection)

    @app.get("/rag/sources", response_model=s.SourcesListing, dependencies=read, tags=compat)
    def rag_sources(kb: KB, collection: EveryCollection = None,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
                    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> dict[str, Any]:
        """Seed 003: indexed sources with totals; alias of `GET /api/rag/sources`."""
        return service.list_source_summaries(kb, collection=collection, limit=limit, offset=offset)

    @app.delete("/rag/sources/{source_id:path}", response_model=s.SourceDeleted, dependencies=write, tags=compat)
    def rag_delete_source(source_id: Ref, kb: KB, collection: Collection = None) -> dict[str, Any]:
        """Seed 003: delete a source (document id or path) and its chunks."""
        out = service.delete_document(kb, source_id, collection)
        return {"source_id": out["doc_id"], "chunks_deleted": out["chunks_deleted"], "status": "deleted"}

    app.include_router(graph_router(get_kb, read))  # knowledge graph: /api/rag/graph, /api/rag/hybrid-context

    def openapi() -> dict[str, Any]:
        """The generated document, its request limits those settings.server enforces (one source)."""
        if app.openapi_schema is None:
            s.bound_openapi(type(app).openapi(app), settings.server)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
