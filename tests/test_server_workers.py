"""`rag serve --workers N` (server.workers): N server processes share the port, each with its own
model and pool, all answering searches (one process runs Python on one core at a time)."""

from __future__ import annotations

from pathlib import Path

import httpx
import psutil
import pytest

from testkit import child_env, start_server

pytestmark = pytest.mark.subprocess

KEY = "workers-key-4f1a"


def _workers(pid: int) -> list[psutil.Process]:
    """The serving processes: uvicorn's supervisor's own children (their parse workers are theirs),
    multiprocessing's resource tracker left out."""
    return [p for p in psutil.Process(pid).children()
            if "resource_tracker" not in " ".join(p.cmdline())]


def test_serve_runs_the_configured_number_of_processes_and_each_answers(database_url: str, tmp_path: Path):
    env = child_env(database_url, tmp_path / ".rag", RAG_API_KEYS=KEY)
    server = start_server(["serve", "--workers", "2"], env, tmp_path / "server.log")
    workers: list[psutil.Process] = []
    try:
        workers = _workers(server.proc.pid)
        assert len(workers) == 2, [" ".join(p.cmdline())[:200] for p in workers]
        with httpx.Client(base_url=server.url, timeout=60, headers={"X-API-Key": KEY}) as c:
            # separate connections: the kernel hands each to whichever process accepts it
            for _ in range(8):
                r = c.post("/api/rag/search", json={"query": "earnings guidance", "mode": "hybrid"},
                           headers={"Connection": "close"})
                assert r.status_code == 200 and r.json()["results"] == []
    finally:
        server.stop(timeout=30)
    psutil.wait_procs(workers, timeout=30)
    assert not any(p.is_running() for p in workers)  # stopping the server stops its workers
