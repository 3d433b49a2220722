"""HTTP API load benchmark: search over HTTP (`rag serve` in its own process) with 1, 8 and 32
concurrent clients for N seconds each, against the shared corpus; the in-process search p95 is
measured in the same script for comparison. Prints ONE JSON line.

CPU per request: the CPU time (user + system, from /proc via psutil) that the server's processes,
the database server's processes and this client spent during a level, divided by its requests; the
load average is read before and after each level (the machine is shared), and `cores_busy` says how
many cores the benchmark's processes and the whole machine kept busy during it.

`--compare-src DIR` first runs the same levels against a server running the code in DIR (e.g. a
checkout of an older commit), with the same --workers and --query-cache, so old and new are compared
as ratios within one run.
`--workers N` sets server.workers; `--query-cache 0` turns the query-vector cache off (each request
then encodes its query: the benchmark cycles through the same queries, which the cache would hit).

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
from _bench_db import start_server, tree_cpu  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402

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


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def postmaster(url: str) -> int | None:
    """The pid of the database server behind `url` when it runs on this machine (the embedded one)."""
    try:
        with psycopg.connect(url) as conn:
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # superusers only
        return int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
    except (psycopg.Error, OSError, ValueError):
        return None  # a server elsewhere: its CPU is not counted


def busy_cores() -> float:
    """CPU seconds the whole machine has spent not idle (every process, ours or not)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


def connections_per_worker(server_pid: int, port: int) -> list[int]:
    """Established connections each server process holds on `port` (how the clients spread)."""
    counts = []
    for proc in tree(server_pid):
        try:
            held = sum(c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port for c in proc.net_connections("tcp"))
        except psutil.Error:
            continue
        if held:
            counts.append(held)
    return sorted(counts, reverse=True)


def measured_level(base: str, queries: list[str], mode: str, clients: int, seconds: float, server_pid: int,
                   db_pid: int | None) -> dict:
    """One level with the CPU its requests cost (server, database, client), the load around it, the
    cores the whole machine kept busy (ours and everyone else's: on a shared machine a level that
    leaves cores idle is held back by itself, one that finds them all busy by the machine) and how
    the clients' connections spread over the server's processes."""
    port = int(base.rsplit(":", 1)[1])
    spread = lambda: connections_per_worker(server_pid, port)  # noqa: E731
    started = time.perf_counter()
    before = (tree_cpu(server_pid), tree_cpu(db_pid), time.process_time(), os.getloadavg()[0], busy_cores())
    level = asyncio.run(load(base, queries, mode, clients, seconds, spread))
    after = (tree_cpu(server_pid), tree_cpu(db_pid), time.process_time(), os.getloadavg()[0], busy_cores())
    wall = time.perf_counter() - started
    n = max(level["requests"], 1)
    cpu = {name: round((a - b) * 1000 / n, 2) for name, a, b in zip(("server", "database", "client"), after, before)}
    cpu["total"] = round(sum(cpu.values()), 2)
    level["cpu_ms_per_request"] = cpu
    level["loadavg_1m"] = [round(before[3], 2), round(after[3], 2)]
    level["cores_busy"] = {"benchmark": round(sum(a - b for a, b in zip(after[:3], before[:3])) / wall, 2),
                           "machine": round((after[4] - before[4]) / wall, 2), "of": psutil.cpu_count()}
    return level


def run_server(url: str, mode: str, queries: list[str], levels: list[int], seconds: float, env_extra: dict,
               db_pid: int | None) -> list[dict]:
    # the server's env keeps this process's settings (e.g. RAG_EMBEDDING__*) and adds the bench key
    env = {**os.environ, "RAG_DATABASE_URL": url, "RAG_API_KEYS": KEY, **env_extra}
    server = start_server(["serve", "--log-level", "warning"], env,
                          Path(tempfile.mkdtemp(prefix="rag-api-bench-")) / "server.log")
    try:
        asyncio.run(load(server.url, queries, mode, 2, 3))  # warm-up: pool connections, caches
        return [measured_level(server.url, queries, mode, n, seconds, server.proc.pid, db_pid) for n in levels]
    finally:
        server.stop(timeout=20)


async def load(base: str, queries: list[str], mode: str, clients: int, seconds: float, spread=None) -> dict:
    """`clients` concurrent loops, each sending one search at a time until the time is up; `spread()`
    (how the connections spread over the server's processes) is read while they are all open."""
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
        held = spread() if spread else None
    return {"clients": clients, "requests": len(latencies), "errors": errors,
            "rps": round(len(latencies) / elapsed, 2), "p50_ms": pct(latencies, 50), "p95_ms": pct(latencies, 95),
            "p99_ms": pct(latencies, 99), **({"connections_per_process": held} if held is not None else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--mode", default=None, help=f"semantic | lexical | hybrid (default: {DEFAULT_MODE})")
    parser.add_argument("--corpus", type=Path, default=SHARED, help="ingested when the database is empty")
    parser.add_argument("--workers", type=int, default=None, help="server.workers (default: the settings')")
    parser.add_argument("--query-cache", type=int, default=None, help="search.query_cache_size (0: off)")
    parser.add_argument("--compare-src", type=Path, default=None,
                        help="also run the levels against a server running the code in this folder, first")
    args = parser.parse_args()
    mode = args.mode or DEFAULT_MODE
    url = prepare_db(args.corpus)
    queries = load_queries()
    db_pid = postmaster(url)
    counts = [int(n) for n in args.levels.split(",")]
    extra = {k: str(v) for k, v in (("RAG_SERVER__WORKERS", args.workers),
                                    ("RAG_SEARCH__QUERY_CACHE_SIZE", args.query_cache)) if v is not None}
    compared = None
    if args.compare_src:
        compared = run_server(url, mode, queries, counts, args.seconds,
                              {**extra, "PYTHONPATH": str(args.compare_src.resolve())}, db_pid)
    # half before and half after the HTTP levels, so a shared machine's load swings hit both alike
    local_ms = in_process(url, queries, mode, min(args.seconds, 20.0) / 2)
    levels = run_server(url, mode, queries, counts, args.seconds, extra, db_pid)
    local_ms += in_process(url, queries, mode, min(args.seconds, 20.0) / 2)
    local = summary(local_ms)
    at8 = next((lv for lv in levels if lv["clients"] == 8), None)
    out = {
        "benchmark": "api_search", "mode": mode, "seconds_per_level": args.seconds, "queries": len(queries),
        "cpus": os.cpu_count(), "server_env": extra, "in_process": local, "http": levels,
        "p95_ratio_8_clients_vs_in_process": round(at8["p95_ms"] / local["p95_ms"], 2) if at8 and local["p95_ms"] else None,
        "errors": sum(lv["errors"] for lv in levels),
        **({"compared": {"src": str(args.compare_src), "http": compared,
                         "rps_ratio": {lv["clients"]: round(lv["rps"] / old["rps"], 2) if old["rps"] else None
                                       for lv, old in zip(levels, compared)},
                         "cpu_ratio": {lv["clients"]: round(lv["cpu_ms_per_request"]["total"]
                                                            / old["cpu_ms_per_request"]["total"], 2)
                                       if old["cpu_ms_per_request"]["total"] else None
                                       for lv, old in zip(levels, compared)}}} if compared else {}),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),  # the machine is shared: read numbers with this
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
