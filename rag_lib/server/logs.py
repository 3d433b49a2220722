"""Structured JSON logs for the servers: one object per line, carrying the current request id.
Only metadata is logged (method, path, status, timings); never keys, headers or bodies."""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("rag_request_id", default=None)

_RESERVED = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


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


def setup_json_logging(level: str = "INFO", stream=None) -> None:
    """Route rag_lib and uvicorn loggers to one JSON handler on stderr (stdout stays free for MCP)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("rag_lib", "uvicorn", "uvicorn.error", "mcp"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.propagate = False
    logging.getLogger("rag_lib.server").setLevel(level.upper())
    logging.getLogger("uvicorn.access").disabled = True  # our access log carries the request id
