"""HTTP API load benchmark: search over HTTP (`rag serve` in its own process) with 1, 8 and 32
concurrent clients for N seconds each, against the shared corpus; the in-process search p95 is
measured in the same script for comparison. Prints ONE JSON line.

    .venv/bin/python benchmarks/api.py [--seconds 30] [--levels 1,8,32] [--mode hybrid] [--corpus DIR]

Database: $RAG_DATABASE_URL, else database `rag_bench_api` on the embedded server (.rag/pgdata);
the shared corpus is ingested into it when missing (incremental: later runs reuse it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import start_server  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.db import database_url  # noqa: E402
from rag_lib.server.service import DEFAULT_MODE  # noqa: E402
from rag_lib.store.connection import ensure_database  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RAG_SHARED_CORPUS", REPO.parent / "shared" / "corpus"))
QUERIES = SHARED.parent / "eval" / "tradegent-dev" / "queries.jsonl"
KEY = "bench-" + os.urandom(8).hex()


def pct(values: list[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 2) if values else 0.0


def prepare_db(corpus: Path) -> str:
    """URL of a database holding the shared corpus (ingested if missing)."""
    settings = Settings()
    if settings.database_url:
        url = settings.database_url
    else:
        url = database_url(settings, dbname="rag_bench_api")
        ensure_database(database_url(settings), "rag_bench_api")
    with KnowledgeBase(Settings(database_url=url)) as kb:
        if kb.store.status_counts(kb.settings.collection)["documents"] == 0:
            print("ingesting the shared corpus (first run only)...", file=sys.stderr)
            kb.ingest([corpus])
        space = kb.store.active_space()
        kb.store.ensure_hnsw_index(space["space"], space["dimensions"])
    return url


def load_queries() -> list[str]:
    if QUERIES.is_file():
        return [json.loads(line)["text"] for line in QUERIES.read_text().splitlines() if line.strip()]
    return ["NVDA earnings guidance", "AMD forward P/E", "momentum strategy entry rules", "loss aversion"]


def in_process(url: str, queries: list[str], mode: str, seconds: float) -> list[float]:
    """Sequential `KnowledgeBase.search` latencies in ms (model + pool warm)."""
    with KnowledgeBase(Settings(database_url=url)) as kb:
        for q in queries[:5]:
            kb.search(q, mode=mode, top_k=10)
        latencies: list[float] = []
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            kb.search(queries[i % len(queries)], mode=mode, top_k=10)
            latencies.append((time.perf_counter() - t0) * 1000)
            i += 1
    return latencies


def summary(latencies: list[float]) -> dict:
    return {"requests": len(latencies), "p50_ms": pct(latencies, 50), "p95_ms": pct(latencies, 95),
            "p99_ms": pct(latencies, 99)}


async def load(base: str, queries: list[str], mode: str, clients: int, seconds: float) -> dict:
    """`clients` concurrent loops, each sending one search at a time until the time is up."""
    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, headers={"X-API-Key": KEY}, timeout=60, limits=limits) as c:
        end = time.perf_counter() + seconds

        async def worker(offset: int) -> None:
            nonlocal errors
            i = offset
            while time.perf_counter() < end:
                body = {"query": queries[i % len(queries)], "mode": mode, "top_k": 10}
                t0 = time.perf_counter()
                try:
                    r = await c.post("/api/rag/search", json=body)
                    ok = r.status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    latencies.append((time.perf_counter() - t0) * 1000)
                else:
                    errors += 1
                i += 7

        started = time.perf_counter()
        await asyncio.gather(*(worker(n) for n in range(clients)))
        elapsed = time.perf_counter() - started
    return {"clients": clients, "requests": len(latencies), "errors": errors,
            "rps": round(len(latencies) / elapsed, 2), "p50_ms": pct(latencies, 50), "p95_ms": pct(latencies, 95),
            "p99_ms": pct(latencies, 99)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--mode", default=None, help=f"semantic | lexical | hybrid (default: {DEFAULT_MODE})")
    parser.add_argument("--corpus", type=Path, default=SHARED, help="ingested when the database is empty")
    args = parser.parse_args()
    mode = args.mode or DEFAULT_MODE
    url = prepare_db(args.corpus)
    queries = load_queries()
    # half before and half after the HTTP levels, so a shared machine's load swings hit both alike
    local_ms = in_process(url, queries, mode, min(args.seconds, 20.0) / 2)
    # the server's env keeps this process's settings (e.g. RAG_EMBEDDING__*) and adds the bench key
    server = start_server(["serve", "--log-level", "warning"], {**os.environ, "RAG_DATABASE_URL": url,
                          "RAG_API_KEYS": KEY}, Path(tempfile.mkdtemp(prefix="rag-api-bench-")) / "server.log")
    base = server.url
    try:
        asyncio.run(load(base, queries, mode, 2, 3))  # warm-up: pool connections, JIT-free paths
        levels = [asyncio.run(load(base, queries, mode, int(n), args.seconds)) for n in args.levels.split(",")]
    finally:
        server.stop(timeout=20)
    local_ms += in_process(url, queries, mode, min(args.seconds, 20.0) / 2)
    local = summary(local_ms)
    at8 = next((lv for lv in levels if lv["clients"] == 8), None)
    out = {
        "benchmark": "api_search", "mode": mode, "seconds_per_level": args.seconds, "queries": len(queries),
        "cpus": os.cpu_count(), "in_process": local, "http": levels,
        "p95_ratio_8_clients_vs_in_process": round(at8["p95_ms"] / local["p95_ms"], 2) if at8 and local["p95_ms"] else None,
        "errors": sum(lv["errors"] for lv in levels),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),  # the machine is shared: read numbers with this
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
