"""The one logger setup: human-readable to stderr, level from settings or RAG_LOG_LEVEL."""

from __future__ import annotations

import logging
import os

_CONFIGURED = False


def setup_logging(level: str | None = None) -> None:
    """Configure the `rag_lib` logger once; later calls only change the level."""
    global _CONFIGURED
    logger = logging.getLogger("rag_lib")
    logger.setLevel((level or os.environ.get("RAG_LOG_LEVEL") or "WARNING").upper())
    if not _CONFIGURED:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
        _CONFIGURED = True


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name if name.startswith("rag_lib") else f"rag_lib.{name}")
