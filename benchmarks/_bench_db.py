"""A persistent embedded server for benchmark/eval scripts (under .rag/bench, reused across runs)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import psycopg  # noqa: E402

from rag_lib.db import start_embedded  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
if not SHARED.is_dir():
    SHARED = Path(os.environ.get("RAG_SHARED", "/work/shared"))


def bench_database(name: str, work: Path | None = None) -> tuple[str, Path]:
    """URL of database `name` on a reusable embedded server (created if missing) and its home."""
    work = (work or REPO / ".rag" / "bench").resolve()
    admin = start_embedded(work / "pgdata")
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(f'CREATE DATABASE "{name}"')
    return admin.replace("/postgres?", f"/{name}?", 1), work
