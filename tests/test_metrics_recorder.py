"""The metrics recorder writes a busy server's records in few transactions, and loses none."""

from __future__ import annotations

import datetime as dt
import time

from rag_lib import metrics
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
