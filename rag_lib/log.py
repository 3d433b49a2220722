"""The one logger setup. Every process has exactly one handler on the `rag_lib` logger (and, in the
servers, on uvicorn's and the MCP SDK's loggers): human-readable lines for the CLI and library, one
JSON object per line carrying the request id for `rag serve` / `rag mcp`. Calling a setup again
changes the level or the format of that same handler, never adds a second one (a second handler
wrote every server record twice, its tracebacks without request ids)."""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import os
import re
import sys
from typing import IO

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("rag_request_id", default=None)

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_PLAIN = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
SERVER_LOGGERS = ("rag_lib", "uvicorn", "uvicorn.error", "mcp")


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "msg", "request_id", ...extra fields}`."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid:
            out["request_id"] = rid
        for key, value in record.__dict__.items():
            if key not in _RESERVED and key not in out and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class _OurHandler(logging.StreamHandler):
    """Marks the handler this module installed, so a later setup finds it instead of adding another."""


def _handler(logger: logging.Logger) -> _OurHandler | None:
    return next((h for h in logger.handlers if isinstance(h, _OurHandler)), None)


def _install(json_format: bool | None, stream: IO[str] | None, loggers: tuple[str, ...] = ()) -> _OurHandler:
    """The one handler: created on first use, else found again and reformatted / re-pointed."""
    root = logging.getLogger("rag_lib")
    handler = _handler(root)
    if handler is None:
        handler = _OurHandler(stream or sys.stderr)
        handler.setFormatter(_PLAIN)
        root.addHandler(handler)
        root.propagate = False
    elif stream is not None:
        handler.setStream(stream)
    if json_format is not None:
        handler.setFormatter(JsonFormatter() if json_format else _PLAIN)
    for name in loggers:  # third-party loggers write through the same handler, once
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
    return handler


def setup_logging(level: str | None = None) -> None:
    """Configure the `rag_lib` logger: its level (argument, else $RAG_LOG_LEVEL, else WARNING) and the
    one handler (plain text on stderr unless a server switched it to JSON). Safe to call again."""
    logging.getLogger("rag_lib").setLevel((level or os.environ.get("RAG_LOG_LEVEL") or "WARNING").upper())
    _install(None, None)


def setup_server_logging(level: str = "INFO", stream: IO[str] | None = None) -> None:
    """The servers' format: the one handler writes JSON lines (with the request id) to stderr, and the
    uvicorn and MCP SDK loggers write through it (stdout stays free for MCP's stdio protocol). The
    request log (`rag_lib.server`) gets `level`; the rest of `rag_lib` keeps settings.log_level."""
    _install(True, stream, SERVER_LOGGERS[1:])
    logging.getLogger("rag_lib.server").setLevel(level.upper())
    logging.getLogger("uvicorn.access").disabled = True  # our access log carries the request id


def redact_url(url: str) -> str:
    """An http(s) URL as logs may show it: no user:password, no query string (keys travel there)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=("***@" if parts.username or parts.password else "") + netloc,
                                     query="***" if parts.query else ""))


_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_CONNINFO_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def scrub_secrets(text: str) -> str:
    """`text` with URL passwords (`scheme://user:***@`) and conninfo `password=***` masked: for error
    messages that quote a connection string."""
    return _CONNINFO_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("rag_lib") else f"rag_lib.{name}")
