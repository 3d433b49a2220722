"""Embedded servers for benchmark/eval scripts: a persistent one under .rag/bench (reused across
runs, so expensive embeddings are paid once) and throwaway ones in a temporary folder."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
# The process helpers the tests use (scratch database, server child) live in tests/testkit.py, not in
# the shipped library; the benchmarks import them through this module.
sys.path.insert(0, str(REPO / "tests"))

from rag_lib.db import start_embedded, stop_embedded  # noqa: E402
from testkit import RAG, child_env, create_database, start_server  # noqa: E402, F401

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


def copy_corpus_files(dest: Path, count: int, corpus: Path | None = None, *, spread: bool = False,
                      readmes: bool = True) -> list[str]:
    """Copy `count` YAML/markdown files of `corpus` (default: the shared corpus) to `dest`, keeping
    their relative paths: the first ones by path, or with `spread` evenly over the sorted list.
    Returns their relative POSIX paths."""
    corpus = corpus or SHARED / "corpus"
    files = sorted(p for p in corpus.rglob("*") if p.is_file() and p.suffix in (".yaml", ".yml", ".md")
                   and (readmes or "README" not in p.name))
    chosen = (files[:: max(1, len(files) // count)] if spread else files)[:count]
    for src in chosen:
        target = dest / src.relative_to(corpus)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return [p.relative_to(corpus).as_posix() for p in chosen]


def cpu_seconds(procs) -> float:
    """CPU seconds (user + system) the given psutil processes have used so far; gone ones count 0."""
    import psutil

    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def tree_cpu(pid: int | None) -> float:
    """CPU seconds used so far by process `pid` and all its descendants, those started since and those
    gone included (a gone child's time is added to its parent's `children_*` once it is reaped): a
    pool that opens connections during a level has the database start backends then, which a
    list of processes taken before the level leaves out."""
    import psutil

    if pid is None:
        return 0.0
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def ingest_once(kb, corpus: Path, collection: str = "default") -> float:
    """Bring `collection` of a reusable benchmark database up to date with `corpus` (an incremental
    ingest: nothing to do when it is current, a republish after the pipeline's fingerprint changed,
    so figures never come from documents an older loader read), and of its ticker profiles (built by
    this code: only a profile whose text changed is embedded again); the seconds it took. A failed file
    stops the benchmark: its figures would be wrong."""
    started = time.perf_counter()
    report = kb.ingest([corpus], collection)
    if report.count("failed"):
        raise SystemExit(f"corpus ingest failed: {report.to_dict()['failed']}")
    kb.rebuild_profiles(collection)
    return round(time.perf_counter() - started, 1)


def unique_texts(url: str) -> list[str]:
    """The unique chunk texts a database's ingest encoded: what a raw-encoder comparison encodes."""
    import psycopg

    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(
            "SELECT DISTINCT ON (content_hash) embed_text FROM rag_chunks ORDER BY content_hash")]
