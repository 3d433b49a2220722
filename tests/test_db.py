"""The embedded server: started on demand, shared by concurrent starters, stopped on request."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from rag_lib.config import Settings
from rag_lib.db import embedded_running, server_status, start_embedded, stop_embedded

pytestmark = pytest.mark.subprocess

START = "from pathlib import Path; import sys; from rag_lib.db import start_embedded; print(start_embedded(Path(sys.argv[1])))"


def test_two_processes_starting_at_once_share_one_server(tmp_path: Path):
    pgdata = tmp_path / "pgdata"
    env = {**os.environ}
    procs = [
        subprocess.Popen([sys.executable, "-c", START, str(pgdata)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outputs]
    urls = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert len(urls) == 1, urls
    try:
        # the server outlives the processes that started it, and is configured for Dagster's load
        assert embedded_running(pgdata)
        with psycopg.connect(urls.pop()) as conn:
            assert conn.execute("SHOW max_connections").fetchone()[0] == "300"
            assert conn.execute("SHOW shared_buffers").fetchone()[0] == "1GB"
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            assert conn.execute("SELECT '[1,2]'::vector <=> '[2,4]'::vector").fetchone()[0] < 1e-6
        status = server_status(Settings(home=tmp_path, database_url=None))
        assert status.embedded and status.running
        assert f"/rag?host={pgdata}" in status.url  # the library's database, not the server's `postgres`
    finally:
        assert stop_embedded(pgdata)
    assert not embedded_running(pgdata)
    assert not server_status(Settings(home=tmp_path, database_url=None)).running


def test_the_embedded_server_keeps_a_larger_buffer_pool_an_operator_set(tmp_path: Path):
    """Its settings are minimums: shared_buffers raised with ALTER SYSTEM (what a million chunks
    need, docs/scale.md) survives the next start, one below 1 GB is raised again."""
    pgdata = tmp_path / "pgdata"
    url = start_embedded(pgdata)
    try:
        for wanted, kept in (("1536MB", "1536MB"), ("128MB", "1GB")):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"ALTER SYSTEM SET shared_buffers = '{wanted}'")
            assert stop_embedded(pgdata)
            url = start_embedded(pgdata)
            with psycopg.connect(url) as conn:
                assert conn.execute("SHOW shared_buffers").fetchone()[0] == kept
                assert conn.execute("SHOW max_connections").fetchone()[0] == "300"
    finally:
        assert stop_embedded(pgdata)


def test_rag_db_commands_manage_the_embedded_server(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k != "RAG_DATABASE_URL"}
    env["RAG_HOME"] = str(tmp_path / ".rag")
    rag = str(Path(sys.executable).parent / "rag")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([rag, *args], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    assert run("db", "status").returncode == 3  # not running yet
    started = run("db", "start")
    assert started.returncode == 0, started.stderr
    url = run("db", "url").stdout.strip()
    assert url.startswith("postgresql://") and "/rag?" in url
    with psycopg.connect(url) as conn:  # migrations were applied by `db start`
        assert conn.execute("SELECT count(*) FROM rag_schema_migrations").fetchone()[0] >= 1
    assert run("db", "status").returncode == 0
    assert run("db", "stop").returncode == 0
    assert run("db", "status").returncode == 3


def test_no_store_part_hides_another_parts_method():
    """`Store` is one class made of parts (documents, vectors, checks, ...): a method name defined in
    two parts silently hides one of them (a prune helper once hid the orphans check's
    `document_sources()`, failing every Dagster run's check step with a TypeError)."""
    from collections import Counter

    from rag_lib.store import Store

    parts = [c for c in Store.__mro__[1:] if c.__module__.startswith("rag_lib.store")]
    names = Counter(n for c in parts for n, v in vars(c).items() if callable(v) and not n.startswith("__"))
    assert not [n for n, k in names.items() if k > 1]


def _rag_runner(tmp_path: Path):
    """`run(*args)`: the `rag` command on its own embedded server under tmp_path (no RAG_DATABASE_URL)."""
    env = {k: v for k, v in os.environ.items() if k != "RAG_DATABASE_URL"}
    env["RAG_HOME"] = str(tmp_path / ".rag")
    rag = str(Path(sys.executable).parent / "rag")

    def run(*args: str, wait: bool = True):
        if not wait:
            return subprocess.Popen([rag, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=tmp_path)
        return subprocess.run([rag, *args], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    return run, tmp_path / ".rag" / "pgdata"


def test_db_stop_refuses_while_a_command_uses_the_server_unless_forced(tmp_path: Path):
    """`rag db stop` stopped the server under a running ingest or `rag serve` without a word."""
    run, pgdata = _rag_runner(tmp_path)
    assert run("db", "start").returncode == 0
    url = run("db", "url").stdout.strip()
    try:
        with psycopg.connect(url, application_name="rag serve"), psycopg.connect(url, application_name="rag serve"):
            refused = run("db", "stop")
            assert refused.returncode == 1 and embedded_running(pgdata)
            assert " ".join(refused.stderr.split()) == (
                "error: not stopped: 2 connections (rag serve ×2) use the embedded server and would fail; stop them "
                "first, or pass --force to stop it anyway")
            forced = run("db", "stop", "--force")
            assert forced.returncode == 0 and forced.stdout.strip() == "stopped" and not embedded_running(pgdata)
    finally:
        stop_embedded(pgdata)


def test_a_command_whose_server_is_stopped_under_it_exits_at_once_with_one_line(tmp_path: Path):
    """An ingest (or reembed) whose embedded server was stopped mid-command printed the error line after
    about ten psycopg_pool "error connecting" warnings, having waited out 30 s pool timeouts in its
    cleanup and in the metrics writer: about a minute in all."""
    run, pgdata = _rag_runner(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(150):  # seconds of embedding: the server is stopped while the ingest works
        (corpus / f"note{i:03}.md").write_text(f"# Note {i}\n\n## Copper\n\n" + f"copper demand view {i}. " * 60 + "\n")
    assert run("db", "start").returncode == 0
    ingest = run("ingest", str(corpus), wait=False)
    try:
        with psycopg.connect(run("db", "url").stdout.strip(), autocommit=True) as conn:
            while not conn.execute("SELECT 1 FROM rag_documents LIMIT 1").fetchone():  # published its first file
                assert ingest.poll() is None, ingest.communicate()
                time.sleep(0.1)
        assert run("db", "stop", "--force").returncode == 0
        stopped = time.monotonic()
        _, err = ingest.communicate(timeout=120)
        took = time.monotonic() - stopped
    finally:
        ingest.kill()
        stop_embedded(pgdata)
    assert ingest.returncode == 1
    lines = err.strip().splitlines()
    # the ingest's own line, or the CLI's when the loss is met between files: one line either way
    assert len(lines) == 1 and lines[0].startswith("error: the database stopped answering"), err
    assert "published stay" in lines[0] and "rag db start" in lines[0], err
    assert took < 15, took
