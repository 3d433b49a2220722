"""Structured JSON logs for the servers: one object per line, carrying the current request id.
Only metadata is logged (method, path, status, timings); never keys, headers or bodies. The
formatter, the request id and the one handler live in `rag_lib.log`; these names stay for callers."""

from __future__ import annotations

from rag_lib.log import JsonFormatter, request_id_var, setup_server_logging

setup_json_logging = setup_server_logging

__all__ = ["JsonFormatter", "request_id_var", "setup_json_logging"]
