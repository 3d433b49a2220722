"""Concurrent searches in one server process: they run in parallel, at most `search_slots` at once,
and never wait for a pooled connection (each holds two at a time, the metrics writer one)."""

from __future__ import annotations

import threading
from pathlib import Path

from fastapi.testclient import TestClient

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.server import create_app
from rag_lib.server import service
from rag_lib.server.security import KeyRing

KEY = "concurrency-key-31c7"
QUESTIONS = ["NVDA earnings guidance", "AMD forward P/E", "momentum strategy entry rules", "loss aversion",
             "which trades hit their stop", "data center revenue growth", "risk management position sizing",
             "semiconductor supply chain"]


def test_concurrent_searches_overlap_up_to_the_slots_and_never_wait_for_a_connection(
        corpus_db_url: str, provider, tmp_path: Path, monkeypatch):
    settings = Settings(database_url=corpus_db_url, home=tmp_path / ".rag", pool_max_size=8)
    slots = service.search_slots(settings)
    assert slots == 3  # (8 - 1) // 2

    running, most = 0, 0
    lock = threading.Lock()
    search = service.search

    def counted(*args, **kwargs):
        """service.search, counting the searches inside it at once (server-side, not client timings)."""
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            return search(*args, **kwargs)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(service, "search", counted)
    kb = KnowledgeBase(settings, provider=provider)
    app = create_app(settings, kb=kb, keys=KeyRing.from_env(settings, {"RAG_API_KEYS": KEY}))
    try:
        with TestClient(app, headers={"X-API-Key": KEY}) as client:
            pool = kb.store.db.pool
            assert pool.get_stats()["pool_size"] == 8  # opened at start, not one by one under load
            pool.pop_stats()
            start = threading.Barrier(16)
            answers: list[int] = []

            def ask(n: int) -> None:
                start.wait()
                r = client.post("/api/rag/search", json={"query": QUESTIONS[n % len(QUESTIONS)], "mode": "hybrid"})
                answers.append(r.status_code)

            threads = [threading.Thread(target=ask, args=(n,)) for n in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            stats = pool.pop_stats()
    finally:
        kb.close()
    assert answers == [200] * 16
    assert 2 <= most <= slots, most  # in parallel, and no more than the pool serves at once
    # unbounded, 16 searches asked a pool of 8 for up to 33 connections and most requests queued
    assert stats.get("requests_queued", 0) == 0, stats
