"""`rag serve --workers N` (server.workers): N server processes share the port, each with its own
model and pool, all answering searches (one process runs Python on one core at a time)."""

from __future__ import annotations

import os
import socket
import time
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


def _listening(proc: psutil.Process, port: int) -> set[str]:
    """The sockets (`socket:[inode]`) through which `proc` listens on `port`."""
    found = set()
    for conn in proc.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
            found.add(os.readlink(f"/proc/{proc.pid}/fd/{conn.fd}"))
    return found


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (SO_REUSEPORT sockets: Linux)")
def test_each_worker_listens_on_its_own_socket_so_connections_spread_over_them(database_url: str, tmp_path: Path):
    """On one shared socket the first worker to wake accepted every waiting connection (8 clients:
    8/0 or 7/1 in most trials), so one process ran every search on one core. Each worker now has
    a socket of its own (SO_REUSEPORT) and the kernel spreads connections by their addresses."""
    env = child_env(database_url, tmp_path / ".rag", RAG_API_KEYS=KEY)
    server = start_server(["serve", "--workers", "2"], env, tmp_path / "server.log")
    port = int(server.url.rsplit(":", 1)[1])
    try:
        workers = _workers(server.proc.pid)
        deadline = time.monotonic() + 300  # a worker listens once it has started (model loaded)
        while not all(_listening(w, port) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.5)
        sockets = [_listening(w, port) for w in workers]
        assert all(len(s) == 1 for s in sockets), sockets
        assert sockets[0] != sockets[1]  # not one socket shared by both

        def held() -> dict[int, int]:
            return {w.pid: sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
                               for c in w.net_connections("tcp")) for w in workers}

        # 16 connections opened together and kept open, as a load test's clients do: each worker
        # holds some of them (the kernel's hash leaves one empty with probability 2 x 2^-16)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(16)]
        try:
            deadline = time.monotonic() + 60  # until both event loops have accepted theirs
            while sum(held().values()) < 16 and time.monotonic() < deadline:
                time.sleep(0.2)
            counts = held()
        finally:
            for c in clients:
                c.close()
        assert sum(counts.values()) == 16 and all(counts.values()), counts
    finally:
        server.stop(timeout=30)
