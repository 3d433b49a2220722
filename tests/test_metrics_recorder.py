"""The metrics recorder writes a busy server's records in few transactions, and loses none."""

from __future__ import annotations

import datetime as dt
import logging
import time

import psycopg
import pytest

from rag_lib import metrics
from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.db import stop_embedded
from rag_lib.models import SearchMetric


def _metric(n: int) -> SearchMetric:
    return SearchMetric(query=f"q{n}", mode="hybrid", strategy="hybrid", results=10, latency_ms=50.0,
                        query_class=None, top_score=0.5, reranked=False, collection="default", stages_ms={},
                        at=dt.datetime.now(dt.timezone.utc))


def test_records_arriving_together_are_written_in_one_transaction(kb, monkeypatch):
    """Searches that finish while the writer lingers share one write (one transaction): written one by
    one, each search cost the server ~0.7 ms and the database ~0.5 ms of CPU. flush() does not wait
    for the lingering to end, and every record reaches the table."""
    monkeypatch.setattr(metrics, "LINGER_SECONDS", 60.0)  # only flush() ends the wait here
    writes: list[int] = []

    def write(searches, embeds):
        writes.append(len(searches))
        kb.store.insert_metrics(searches, embeds)

    recorder = metrics.MetricsRecorder(write)
    try:
        for n in range(10):
            recorder.record(_metric(n))
            time.sleep(0.02)  # searches finishing one after another, not all at once
        assert recorder.flush(timeout=30) and recorder.dropped == 0
    finally:
        recorder.close()
    assert writes == [10]
    assert kb.metrics_summary()["searches"] == 10


def test_close_writes_what_is_queued(kb, monkeypatch):
    monkeypatch.setattr(metrics, "LINGER_SECONDS", 60.0)
    recorder = metrics.MetricsRecorder(kb.store.insert_metrics)
    for n in range(3):
        recorder.record(_metric(n))
    recorder.close()
    assert kb.metrics_summary()["searches"] == 3


@pytest.mark.subprocess  # its own embedded server, stopped under it
def test_closing_after_the_database_went_drops_the_queued_records_at_once(tmp_path, monkeypatch, caplog):
    """A command that lost its database waited about 30 s more at exit: the recorder tried its queued
    records against a pool that waited out its timeout. Now they are dropped and counted in one log line."""
    monkeypatch.setattr(metrics, "LINGER_SECONDS", 60.0)  # queued until close
    settings = Settings(home=tmp_path, database_url=None)
    kb = KnowledgeBase(settings)
    logging.getLogger("rag_lib").addHandler(caplog.handler)
    try:
        assert kb.store.list_spaces() is not None
        for n in range(3):
            kb.metrics.record(_metric(n))
        assert stop_embedded(settings.pgdata)
        with pytest.raises(psycopg.OperationalError):  # the command's own statement finds the database gone
            kb.store.list_spaces()
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="rag_lib"):
            kb.close()
        assert time.monotonic() - started < 3
    finally:
        logging.getLogger("rag_lib").removeHandler(caplog.handler)
        kb.close()
        stop_embedded(settings.pgdata)
    assert "dropped 3 metric records unwritten: the database was gone" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
