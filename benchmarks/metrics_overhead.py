"""What recording search metrics costs a search: the caller's share (build the record, enqueue it)
per search, measured over many synthetic search results while the background writer stores them in
a real (throwaway) embedded PostgreSQL; plus how long the writer needs per record. One JSON line.

    .venv/bin/python benchmarks/metrics_overhead.py [--searches 20000]"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _bench_db import create_database, scratch_server  # noqa: E402

from rag_lib.config import Settings  # noqa: E402
from rag_lib.metrics import MetricsRecorder, search_metric  # noqa: E402
from rag_lib.models import SearchHit, SearchResult  # noqa: E402
from rag_lib.store import Store  # noqa: E402


def _result(n: int) -> SearchResult:
    hits = [SearchHit(chunk_id=f"c{i}", score=1 - i / 20, text="t", doc_id="d", path="p.yaml", section="s",
                      section_path="s", unit_id=f"p.yaml#s{i}", doc_type="stock-analysis", collection="default")
            for i in range(10)]
    timings = {"embed": 3.1, "semantic": 4.2, "lexical": 5.0, "search": 9.2, "fuse": 0.4, "total": 13.0}
    return SearchResult(f"query number {n}", "hybrid", hits, timings,
                        plan={"kind": "comparison", "tickers": ["NVDA", "AMD"], "doc_types": []})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--searches", type=int, default=20000)
    args = parser.parse_args()
    results = [_result(i) for i in range(args.searches)]
    with scratch_server() as (admin, work):
        store = Store(Settings(database_url=create_database(admin, "metrics_bench"), home=work))
        recorder = MetricsRecorder(store.insert_metrics, work / "rag_metrics.jsonl")
        per_call: list[float] = []
        started = time.perf_counter()
        for result in results:
            t0 = time.perf_counter()
            recorder.record(search_metric(result, "default", False))
            per_call.append((time.perf_counter() - t0) * 1000)
        enqueued = time.perf_counter() - started
        recorder.flush(timeout=600)
        drained = time.perf_counter() - started
        recorder.close()
        rows = store.metrics_summary()["searches"]
        store.close()
    per_call.sort()
    print(json.dumps({
        "benchmark": "metrics_overhead", "searches": args.searches, "rows_written": rows,
        "caller_ms_per_search_mean": round(statistics.fmean(per_call), 4),
        "caller_ms_per_search_p50": round(per_call[len(per_call) // 2], 4),
        "caller_ms_per_search_p99": round(per_call[int(len(per_call) * 0.99)], 4),
        "writer_ms_per_record": round((drained * 1000) / args.searches, 4),
        "enqueue_seconds": round(enqueued, 3), "drain_seconds": round(drained, 3),
    }))


if __name__ == "__main__":
    main()
