"""Embedding benchmark: ingest the shared corpus through the OpenAI-compatible provider against
the local stub server (tests/openai_stub.py) with 50 ms latency, once clean and once with 1%
injected 429s (Retry-After honoured), then a second run over the same files that must be served
entirely from the embedding cache (target: 100% hits, zero requests). Prints ONE JSON line.

    .venv/bin/python benchmarks/embedding.py [--latency 0.05] [--fault-rate 0.01] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import REPO, SHARED, create_database, scratch_server, unique_texts  # noqa: E402

import httpx  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.embedding import get_provider  # noqa: E402

MODEL, DIMS = "stub-embed", 256


class StubProcess:
    """tests/openai_stub.py in its own process (it must not share the client's GIL)."""

    def __init__(self, **options: object):
        cmd = [sys.executable, str(REPO / "tests" / "openai_stub.py")]
        for key, value in options.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.base_url = self.proc.stdout.readline().strip()

    def stats(self) -> dict:
        return httpx.get(self.base_url + "/stats").json()

    @property
    def requests(self) -> int:
        return self.stats()["requests"]

    def __enter__(self) -> StubProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run_ingest(admin: str, db: str, home: Path, corpus: Path, stub: StubProcess, args, force: bool = False) -> dict:
    settings = Settings(database_url=create_database(admin, db), home=home, embedding={
        "provider": "openai_compatible", "base_url": stub.base_url, "model": MODEL, "dimensions": DIMS,
        "batch_size": args.batch_size, "concurrency": args.concurrency, "backoff_base": 0.05, "max_retries": 8,
        "prices": {MODEL: 0.13},
    })
    requests_before = stub.requests
    with KnowledgeBase(settings, provider=get_provider(settings)) as kb:
        started = time.perf_counter()
        report = kb.ingest([corpus], force=force)
        seconds = time.perf_counter() - started
        usage = kb.store.run_usage(kb.engine.embedder.run_id)
    assert report.count("failed") == 0, report.to_dict()
    return {
        "seconds": round(seconds, 2),
        "chunks": report.chunks,
        "embedded": report.texts_embedded,
        "chunks_per_s": round(report.chunks / seconds, 1),
        "requests": stub.requests - requests_before,  # counted by the server
        "retries": usage["retries"] if usage else 0,
        "tokens": usage["tokens"] if usage else 0,
        "cost_usd": round(usage["cost_usd"], 6) if usage else 0.0,
        "cache_hit_rate": usage["cache_hit_rate"] if usage else None,
    }


def provider_only(texts: list[str], args, **faults: object) -> dict:
    """The provider alone on the corpus's unique chunk texts (no parsing, chunking or database)."""
    with StubProcess(latency=args.latency, **faults) as stub:
        settings = Settings(embedding={
            "provider": "openai_compatible", "base_url": stub.base_url, "model": MODEL, "dimensions": DIMS,
            "batch_size": args.batch_size, "concurrency": args.concurrency, "backoff_base": 0.05, "max_retries": 8})
        provider = get_provider(settings)
        provider.embed(["warm up"])
        before = provider.totals.requests
        started = time.perf_counter()
        _, usage = provider.embed_counted(texts)
        seconds = time.perf_counter() - started
        stats = stub.stats()
    return {"texts": len(texts), "seconds": round(seconds, 2), "texts_per_s": round(len(texts) / seconds, 1),
            "requests": provider.totals.requests - before, "retries": usage[0].retries,
            "injected_429s": stats["outcomes"].get("429", 0), "max_in_flight": stats["max_in_flight"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=SHARED / "corpus")
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--fault-rate", type=float, default=0.01)
    parser.add_argument("--retry-after", default="0.2")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    with scratch_server("rag-bench-embed-") as (admin, work):
        with StubProcess(latency=args.latency) as stub:
            clean = run_ingest(admin, "bench_clean", work / ".rag", args.corpus, stub, args)
        texts = unique_texts(admin.replace("/postgres?", "/bench_clean?", 1))
        raw_clean = provider_only(texts, args)
        raw_faults = provider_only(texts, args, fault_rate=args.fault_rate, fault="429",
                                   retry_after=args.retry_after, seed=11)
        with StubProcess(latency=args.latency, fault_rate=args.fault_rate, fault="429",
                         retry_after=args.retry_after, seed=11) as stub:
            faults = run_ingest(admin, "bench_faults", work / ".rag", args.corpus, stub, args)
            faults["injected_429s"] = stub.stats()["outcomes"].get("429", 0)
            second = run_ingest(admin, "bench_faults", work / ".rag", args.corpus, stub, args, force=True)
    print(json.dumps({
        "benchmark": "embedding",
        "provider": "openai_compatible (local stub)",
        "latency_ms": args.latency * 1000,
        "fault_rate_429": args.fault_rate,
        "retry_after_s": float(args.retry_after),
        "batch_size": args.batch_size,
        "concurrency": args.concurrency,
        "provider_only_clean": raw_clean,
        "provider_only_with_faults": raw_faults,
        "provider_throughput_ratio_faults_vs_clean": round(raw_faults["texts_per_s"] / raw_clean["texts_per_s"], 3),
        "clean": clean,
        "with_faults": faults,
        "throughput_ratio_faults_vs_clean": round(faults["chunks_per_s"] / clean["chunks_per_s"], 3),
        "second_run": second,
        "second_run_requests": second["requests"],
        "second_run_cache_hit_rate": second["cache_hit_rate"],
    }))


if __name__ == "__main__":
    main()
