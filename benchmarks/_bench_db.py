"""Embedded servers for benchmark/eval scripts: a persistent one under .rag/bench (reused across
runs, so expensive embeddings are paid once) and throwaway ones in a temporary folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


from rag_lib.db import start_embedded, stop_embedded  # noqa: E402
from rag_lib.testing import create_database  # noqa: E402, F401  (the benchmarks import it from here)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
if not SHARED.is_dir():
    SHARED = Path(os.environ.get("RAG_SHARED", "/work/shared"))


def bench_database(name: str, work: Path | None = None, template: str | None = None) -> tuple[str, Path]:
    """URL of database `name` on the reusable benchmark server, and the server's folder."""
    work = (work or REPO / ".rag" / "bench").resolve()
    return create_database(start_embedded(work / "pgdata"), name, template), work


@contextmanager
def scratch_server(prefix: str = "rag-bench-") -> Iterator[tuple[str, Path]]:
    """(admin URL, folder) of a throwaway server; stopped and deleted on exit."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        admin = start_embedded(work / "pgdata")
        try:
            yield admin, work
        finally:
            stop_embedded(work / "pgdata")
    finally:
        shutil.rmtree(work, ignore_errors=True)
