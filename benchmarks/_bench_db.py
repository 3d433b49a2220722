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


def bench_database(name: str, work: Path | None = None, template: str | None = None) -> tuple[str, Path]:
    """URL of database `name` on a reusable embedded server and its home. A missing database is
    created, as a copy of `template` when that exists (so its embeddings are not paid for again)."""
    work = (work or REPO / ".rag" / "bench").resolve()
    admin = start_embedded(work / "pgdata")
    with psycopg.connect(admin, autocommit=True) as conn:
        exists = lambda db: conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone()  # noqa: E731
        if exists(name) is None:
            if template and exists(template):
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            else:
                conn.execute(f'CREATE DATABASE "{name}"')
    return admin.replace("/postgres?", f"/{name}?", 1), work
