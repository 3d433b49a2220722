"""What a client may see of a failure: stable codes, no database text, no server paths, the request
id on every error; and the request guard that refuses hostile requests before any route runs."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any, Iterable

from starlette.types import ASGIApp, Message, Receive, Scope as AsgiScope, Send

from rag_lib.errors import RagError, ValidationError
from rag_lib.log import request_id_var
from rag_lib.server.security import HostNotAllowedError, HostPolicy, OriginNotAllowedError

log = logging.getLogger("rag_lib.server")


class InvalidCharacterError(ValidationError):
    """A NUL (or other control character PostgreSQL text cannot hold) in a request field."""

    code = "invalid_character"


class DocumentRejectedError(ValidationError):
    """Uploaded or requested content that crashed, exhausted or timed out the sandboxed parser."""

    code = "document_rejected"


class ParserBusyError(RagError):
    """Every sandboxed parse slot stayed busy too long; retry later."""

    code = "parser_busy"


class UploadQuotaError(RagError):
    """An upload that would take a collection's upload folder past settings.server.upload_quota_*."""

    code = "upload_quota_exceeded"


HIDDEN_5XX = "internal error; see the server log for this request id"
UNAVAILABLE = "the database is unavailable; see the server log for this request id"

# Absolute POSIX paths of two or more components (e.g. /home/x/.rag/uploads/a.md); a lone "/" is kept.
_ABS_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s/'\"<>:,;()\[\]{}]+/)+[^\s/'\"<>:,;()\[\]{}]*")


def scrub_paths(text: str, roots: Iterable[Path | str] = ()) -> str:
    """`text` without server filesystem paths: known roots become relative, other absolute paths `<path>`."""
    for root in sorted({str(r).rstrip("/") for r in roots if str(r).strip("/")}, key=len, reverse=True):
        text = text.replace(root + "/", "").replace(root, "<root>")
    return _ABS_PATH.sub("<path>", text)


def client_message(exc: Exception, status: int, roots: Iterable[Path | str] = ()) -> str:
    """The one line a client sees: library messages for 4xx (paths scrubbed), nothing internal for 5xx."""
    if status == 503:
        return UNAVAILABLE if getattr(exc, "code", "") == "database_error" else scrub_paths(str(exc), roots)
    if status >= 500 and status not in (501, 504):  # 504: a time limit, named (no database text)
        return HIDDEN_5XX
    return scrub_paths(str(exc), roots)


def scrub_outcomes(out: dict[str, Any], roots: Iterable[Path | str]) -> dict[str, Any]:
    """An ingest report's per-file reasons and details without server paths."""
    roots = list(roots)
    for item in out.get("files", []) or []:
        for key in ("path", "reason", "detail"):
            if isinstance(item.get(key), str):
                item[key] = scrub_paths(item[key], roots)
    return out


def error_body(status: int, code: str, message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps({"error": {"code": code, "message": message, "request_id": request_id_var.get()}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return body, headers


async def send_error(send: Send, status: int, code: str, message: str) -> None:
    body, headers = error_body(status, code, message)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _has_nul(value: Any) -> bool:
    """Any NUL in the strings (keys too) of a parsed JSON value; iterative, so depth cannot hurt."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set):
            stack.extend(item)
    return False


_NUL_ESCAPE = re.compile(rb"\\u0000", re.IGNORECASE)
_PCT_NUL = re.compile(rb"%00")


class RequestGuard:
    """Pure ASGI middleware in front of every route: in loopback mode (no keys) only loopback Host and
    Origin headers pass (DNS rebinding, 421/403); a NUL in the path, query or any JSON string is a 422
    `invalid_character` (PostgreSQL text cannot hold it). JSON bodies are read here (the size limit
    outside this guard bounds them) and replayed to the app unchanged."""

    def __init__(self, app: ASGIApp, policy: HostPolicy | None):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.policy is not None:
            try:
                self.policy.check(headers.get("host"), headers.get("origin"))
            except HostNotAllowedError as exc:
                log.warning("refused host", extra={"code": exc.code})
                await send_error(send, 421, exc.code, str(exc))
                return
            except OriginNotAllowedError as exc:
                log.warning("refused origin", extra={"code": exc.code})
                await send_error(send, 403, exc.code, str(exc))
                return
        if "\x00" in scope.get("path", "") or _PCT_NUL.search(scope.get("raw_path") or b"") \
                or b"\x00" in scope.get("query_string", b"") or _PCT_NUL.search(scope.get("query_string", b"")):
            await send_error(send, 422, InvalidCharacterError.code, "the URL holds a NUL character; remove it")
            return
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return

        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # client went away
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if b"\x00" in body or _NUL_ESCAPE.search(body):
            try:
                bad = b"\x00" in body or _has_nul(json.loads(body))
            except (ValueError, RecursionError):
                bad = False  # not JSON: the route's own parsing reports it
            if bad:
                await send_error(send, 422, InvalidCharacterError.code,
                                 "a request field holds a NUL character (\\u0000); text fields cannot contain it")
                return
        await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive), send)


def _replay(messages: list[Message], then: Receive) -> Receive:
    """`messages` first, then the real channel (which reports the client's disconnect)."""
    queue = list(messages)

    async def replayed() -> Message:
        if queue:
            return queue.pop(0)
        return await then()

    return replayed
