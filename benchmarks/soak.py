"""Soak benchmark against a real `rag serve` on 127.0.0.1. Two scenarios, each printing ONE JSON line.

`mixed` (issue 15): search / embed / delete / embed-text traffic from 16 clients for N minutes, with
hostile bodies mixed in (parser bombs, NUL bytes, bad names, huge numbers, foreign Origin): requests,
errors by status code, p95, the server's RSS at start and end, `/health` latency, and an integrity
check (no orphans; the corpus collection equal to a clean ingest of the same files).

`upload` (issue 29): hybrid search p50/p95 from a few clients, first alone (baseline), then while one
maximal upload (a document of `limits.max_chunks_per_document` one-chunk sections, new text so
nothing comes from the embedding cache) is ingested over HTTP; with the machine's load average.

    .venv/bin/python benchmarks/soak.py [--seconds 600] [--clients 16] [--files 40]
    .venv/bin/python benchmarks/soak.py --scenario upload [--chunks 2000] [--small]

Runs on a throwaway embedded PostgreSQL server (nothing else is touched)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import RAG, child_env, copy_corpus_files, create_database, scratch_server, start_server  # noqa: E402

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import psycopg  # noqa: E402

KEY = "soak-" + os.urandom(8).hex()
QUERIES = ["NVDA data center revenue", "earnings guidance risk", "momentum breakout setup", "AMD thesis risks",
           "options implied volatility", "sector rotation", "gap fill", "capex cycle semiconductors",
           "bear case analysis", "position sizing stop loss", "MSFT cloud growth", "catalyst timeline"]


def alias_bomb(levels: int) -> str:
    names = "abcdefghij"
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{names[i]}: &{names[i]} [{','.join(['*' + names[i - 1]] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# Bodies that cost a naive parser dearly but are valid documents: published (once), never refused.
PUBLISHABLE = {"bomb/spaces.yaml"}

HOSTILE = [  # (method, path, json body, extra headers): each must be refused or skipped, never a 5xx
    ("POST", "/api/rag/embed", {"name": "bomb/nest.yaml", "content": "d: " + "[" * 50_000 + "]" * 50_000,
                                "collection": "soak"}, {}),
    ("POST", "/api/rag/embed", {"name": "bomb/alias.yaml", "content": alias_bomb(7), "collection": "soak"}, {}),
    ("POST", "/api/rag/embed", {"name": "bomb/spaces.yaml", "content": "n: a" + " " * 60_000 + "b\n",
                                "collection": "soak"}, {}),
    ("POST", "/api/rag/embed", {"name": "bomb/front.md", "content": "---\nt: " + "[" * 40_000 + "\n---\n# x\n",
                                "collection": "soak"}, {}),
    ("POST", "/api/rag/embed", {"name": "..", "content": "# x\n", "collection": "soak"}, {}),
    ("POST", "/api/rag/embed", {"name": "bomb/ids.jsonl", "collection": "soak", "content":
                                json.dumps({"_id": "../../etc/passwd", "text": "x"}) + "\n"}, {}),
    ("POST", "/api/rag/search", {"query": "nvda\u0000"}, {}),
    ("POST", "/api/rag/search", {"query": "x", "top_k": 10**30}, {}),
    ("GET", "/api/rag/sources?offset=" + "9" * 31, None, {}),
    ("POST", "/api/rag/embed", {"path": "x" * 300 + ".md"}, {}),
    ("POST", "/api/rag/search", {"query": "q" * 5000}, {}),
    ("POST", "/api/rag/search", {"query": "x"}, {"X-API-Key": "wrong"}),
    ("POST", "/api/rag/search", {"query": "x"}, {"Origin": "http://evil.example", "X-API-Key": "wrong"}),
]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def db_counts(url: str, collection: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        one = lambda sql: conn.execute(sql, {"c": collection}).fetchone()[0]  # noqa: E731
        return {
            "documents": one("SELECT count(*) FROM rag_documents WHERE collection = %(c)s"),
            "sections": one("SELECT count(*) FROM rag_sections WHERE collection = %(c)s"),
            "chunks": one("SELECT count(*) FROM rag_chunks WHERE collection = %(c)s"),
            "vectors": one("SELECT count(*) FROM rag_chunk_vectors v JOIN rag_chunks c USING (chunk_id)"
                           " WHERE c.collection = %(c)s"),
            "chunk_ids": one("SELECT md5(coalesce(string_agg(chunk_id, ',' ORDER BY chunk_id), ''))"
                             " FROM rag_chunks WHERE collection = %(c)s"),
        }


def orphans(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
        return {
            "sections_without_document": one(
                "SELECT count(*) FROM rag_sections s WHERE NOT EXISTS (SELECT 1 FROM rag_documents d"
                " WHERE d.collection = s.collection AND d.path = s.path)"),
            "chunks_without_document": one(
                "SELECT count(*) FROM rag_chunks c WHERE NOT EXISTS (SELECT 1 FROM rag_documents d"
                " WHERE d.collection = c.collection AND d.path = c.path)"),
            "vectors_without_chunk": one(
                "SELECT count(*) FROM rag_chunk_vectors v WHERE NOT EXISTS (SELECT 1 FROM rag_chunks c"
                " WHERE c.chunk_id = v.chunk_id)"),
            "chunks_without_vector": one(
                "SELECT count(*) FROM rag_chunks c WHERE NOT EXISTS (SELECT 1 FROM rag_chunk_vectors v"
                " WHERE v.chunk_id = c.chunk_id)"),
        }


class Traffic:
    def __init__(self, base: str, files: list[str], seed: int):
        self.base = base
        self.files = files
        self.rng = random.Random(seed)
        self.latencies: list[float] = []
        self.by_status: Counter[int] = Counter()
        self.unexpected: Counter[str] = Counter()  # status a request of its kind should never get
        self.kinds: Counter[str] = Counter()
        self.health_ms: list[float] = []
        self.rss_samples: list[float] = []  # the server's RSS (MB) every 30 s
        self.uploaded: list[str] = []

    async def one(self, c: httpx.AsyncClient, client_no: int, n: int) -> None:
        roll = self.rng.random()
        headers: dict[str, str] = {}
        if roll < 0.55:
            kind, method, path = "search", "POST", "/api/rag/search"
            body: dict | None = {"query": self.rng.choice(QUERIES), "top_k": 5,
                                 "mode": self.rng.choice(["hybrid", "semantic", "lexical"])}
            ok = {200}
        elif roll < 0.65:
            kind, method, path, ok = "embed_text", "POST", "/api/rag/embed-text", {200}
            body = {"text": self.rng.choice(QUERIES) + f" {n}"}
        elif roll < 0.75:
            kind, method, path, ok = "upload", "POST", "/api/rag/embed", {200, 503}
            name = f"notes/c{client_no}-{n}.md"
            body = {"name": name, "collection": "soak",
                    "content": f"# Soak note {n}\n\n## Idea\n\n{self.rng.choice(QUERIES)} noted by client {client_no}.\n"}
        elif roll < 0.82 and self.uploaded:
            kind, method, ok = "delete", "DELETE", {200, 404}
            path, body = f"/api/rag/sources/{self.uploaded.pop(self.rng.randrange(len(self.uploaded)))}?collection=soak", None
        elif roll < 0.87:
            kind, method, path, ok = "reembed", "POST", "/api/rag/embed", {200, 503}
            body = {"path": self.rng.choice(self.files)}
        else:
            kind, ok = "hostile", {400, 401, 403, 404, 413, 421, 422, 503}
            method, path, body, headers = self.rng.choice(HOSTILE)
            if path == "/api/rag/embed" and "content" in (body or {}):
                ok = ok | {200}  # a loader may skip a bomb with its reason instead of the sandbox refusing it
        t0 = time.perf_counter()
        try:
            r = await c.request(method, path, json=body, headers=headers)
            status = r.status_code
            if kind == "upload" and status == 200:
                self.uploaded.append(body["name"])  # only once stored: a delete never races its upload
            if kind == "hostile" and status == 200:
                out = r.json()
                if (out.get("new") or out.get("changed")) and body.get("name") not in PUBLISHABLE:
                    status = -1  # a bomb was published: count as unexpected
        except httpx.HTTPError as exc:
            status = 0
            self.unexpected[f"{kind}:{type(exc).__name__}"] += 1
        self.latencies.append((time.perf_counter() - t0) * 1000)
        self.kinds[kind] += 1
        self.by_status[status] += 1
        if status not in ok:
            self.unexpected[f"{kind}:{status}"] += 1

    async def client(self, client_no: int, until: float) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=120, headers={"X-API-Key": KEY}) as c:
            n = 0
            while time.monotonic() < until:
                n += 1
                await self.one(c, client_no, n)

    async def health(self, until: float) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as c:
            while time.monotonic() < until:
                t0 = time.perf_counter()
                try:
                    r = await c.get("/health")
                    if r.status_code != 200:
                        self.unexpected[f"health:{r.status_code}"] += 1
                except httpx.HTTPError as exc:
                    self.unexpected[f"health:{type(exc).__name__}"] += 1
                self.health_ms.append((time.perf_counter() - t0) * 1000)
                await asyncio.sleep(0.25)

    async def memory(self, pid: int, until: float, every: float = 30.0) -> None:
        """The server's RSS every `every` seconds: a leak keeps climbing, warm-up levels off."""
        while time.monotonic() < until:
            await asyncio.sleep(min(every, max(0.0, until - time.monotonic())))
            self.rss_samples.append(rss_mb(pid))

    async def run(self, seconds: float, clients: int, pid: int) -> None:
        until = time.monotonic() + seconds
        await asyncio.gather(self.health(until), self.memory(pid, until),
                             *(self.client(i, until) for i in range(clients)))


def big_document(chunks: int, seed: int) -> str:
    """A YAML document of `chunks` top-level keys of ~40 new words each: one chunk per key, and text
    no earlier run embedded (a random token per key), so every chunk costs a model call."""
    rng = random.Random(seed)
    words = " ".join(QUERIES).lower().split()
    tag = os.urandom(4).hex()
    lines = ["_meta:", "  type: research", f"  id: soak-upload-{tag}"]
    for i in range(chunks):
        text = " ".join(rng.choice(words) for _ in range(40))
        lines.append(f"s{i:05d}: \"{tag} {i} {text}\"")
    return "\n".join(lines) + "\n"


def percentiles(latencies: list[float]) -> dict[str, float | int | None]:
    if not latencies:
        return {"n": 0, "p50_ms": None, "p95_ms": None, "max_ms": None}
    return {"n": len(latencies), "p50_ms": round(float(np.percentile(latencies, 50)), 1),
            "p95_ms": round(float(np.percentile(latencies, 95)), 1), "max_ms": round(max(latencies), 1)}


async def search_clients(base: str, clients: int, stop: asyncio.Event, seconds: float | None,
                         embed_ms: list[float] | None = None) -> list[float]:
    """Hybrid searches from `clients` clients, one after another each, until `stop` is set (or
    `seconds` pass); their latencies in ms (and the server's query-encoding time in `embed_ms`)."""
    latencies: list[float] = []
    embed_ms = [] if embed_ms is None else embed_ms
    deadline = time.monotonic() + seconds if seconds else None

    async def one(n: int) -> None:
        rng = random.Random(n)
        async with httpx.AsyncClient(base_url=base, timeout=600, headers={"X-API-Key": KEY}) as c:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                t0 = time.perf_counter()
                r = await c.post("/api/rag/search", json={"query": rng.choice(QUERIES), "top_k": 5, "mode": "hybrid"})
                r.raise_for_status()
                latencies.append((time.perf_counter() - t0) * 1000)
                embed_ms.append(float(r.json().get("timings_ms", {}).get("embed", 0.0)))

    await asyncio.gather(*(one(n) for n in range(clients)))
    return latencies


async def during_upload(base: str, clients: int, body: dict, embed_ms: list[float]) -> tuple[list[float], dict]:
    """Search latencies while `body` is uploaded (from the first search to the upload's answer)."""
    stop = asyncio.Event()
    upload: dict = {}

    async def send() -> None:
        await asyncio.sleep(0.5)  # searches are running before the upload starts
        t0 = time.perf_counter()
        async with httpx.AsyncClient(base_url=base, timeout=3600, headers={"X-API-Key": KEY}) as c:
            r = await c.post("/api/rag/embed", json=body)
        upload.update(status=r.status_code, seconds=round(time.perf_counter() - t0, 1),
                      chunks=r.json().get("chunks") if r.status_code == 200 else None,
                      message=None if r.status_code == 200 else r.json().get("error", {}).get("message"))
        stop.set()

    results = await asyncio.gather(search_clients(base, clients, stop, None, embed_ms), send())
    return results[0], upload


def upload_scenario(args: argparse.Namespace) -> None:
    files_n, chunks = (8, 300) if args.small else (args.files, args.chunks)
    baseline_s = 10.0 if args.small else args.baseline_seconds
    with scratch_server("rag-soak-") as (admin, work):
        root = work / "corpus"
        files = copy_corpus_files(root, files_n, spread=True, readmes=False)
        url = create_database(admin, "soak")
        env = child_env(url, work / "home", RAG_API_KEYS=KEY, RAG_SERVER__CORPUS_ROOTS=json.dumps([str(root)]),
                        RAG_SERVER__MAX_BODY_BYTES=str(4 * 1024 * 1024))
        server = start_server(["serve", "--log-level", "warning"], env, work / "server.log", timeout=300)
        try:
            with httpx.Client(base_url=server.url, timeout=600, headers={"X-API-Key": KEY}) as c:
                for rel in files:
                    c.post("/api/rag/embed", json={"path": rel}).raise_for_status()
                for q in QUERIES:
                    c.post("/api/rag/search", json={"query": q, "top_k": 5}).raise_for_status()
            load_before = os.getloadavg()
            embed_alone: list[float] = []
            embed_during: list[float] = []
            baseline = asyncio.run(search_clients(server.url, args.search_clients, asyncio.Event(), baseline_s,
                                                  embed_alone))
            body = {"name": "soak/big.yaml", "content": big_document(chunks, args.seed), "collection": "soak"}
            during, upload = asyncio.run(during_upload(server.url, args.search_clients, body, embed_during))
            load_after = os.getloadavg()
            alive = server.alive()
        finally:
            server.stop(timeout=20)
    print(json.dumps({
        "benchmark": "soak_upload", "small": args.small, "corpus_files": len(files), "search_clients": args.search_clients,
        "upload_chunks_requested": chunks, "upload_bytes": len(body["content"].encode()), "upload": upload,
        "baseline": percentiles(baseline), "during_upload": percentiles(during),
        "p95_ratio": round(percentiles(during)["p95_ms"] / percentiles(baseline)["p95_ms"], 2)
        if during and baseline else None,
        # the server's own query-encoding time inside those searches (timings_ms.embed)
        "query_embed_baseline": percentiles(embed_alone), "query_embed_during_upload": percentiles(embed_during),
        "loadavg_before": [round(x, 2) for x in load_before], "loadavg_after": [round(x, 2) for x in load_after],
        "cpus": os.cpu_count(), "server_alive": alive,
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--scenario", choices=["mixed", "upload"], default="mixed",
                    help="mixed traffic for --seconds, or search latency while one maximal upload is ingested")
    ap.add_argument("--seconds", type=float, default=600, help="mixed: how long the traffic runs")
    ap.add_argument("--clients", type=int, default=16, help="mixed: concurrent clients")
    ap.add_argument("--files", type=int, default=40, help="corpus files ingested before the clock starts")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--chunks", type=int, default=2000,
                    help="upload: chunks of the uploaded document (default: limits.max_chunks_per_document)")
    ap.add_argument("--search-clients", type=int, default=4, help="upload: concurrent search clients")
    ap.add_argument("--baseline-seconds", type=float, default=30, help="upload: searching alone, for the baseline")
    ap.add_argument("--small", action="store_true",
                    help="upload: a quick run (8 corpus files, 300 chunks, 10 s baseline)")
    args = ap.parse_args()
    if args.scenario == "upload":
        upload_scenario(args)
        return

    with scratch_server("rag-soak-") as (admin, work):
        root = work / "corpus"
        files = copy_corpus_files(root, args.files, spread=True, readmes=False)
        url = create_database(admin, "soak")
        env = child_env(url, work / "home", RAG_API_KEYS=KEY, RAG_SERVER__CORPUS_ROOTS=json.dumps([str(root)]))
        server = start_server(["serve", "--log-level", "warning"], env, work / "server.log", timeout=300)
        proc, base = server.proc, server.url
        try:
            with httpx.Client(base_url=base, timeout=600, headers={"X-API-Key": KEY}) as c:
                for rel in files:  # the corpus through the API, once, before the clock starts
                    r = c.post("/api/rag/embed", json={"path": rel})
                    r.raise_for_status()
                for q in QUERIES:  # warm every path once
                    c.post("/api/rag/search", json={"query": q, "top_k": 5})
            rss_start = rss_mb(proc.pid)
            traffic = Traffic(base, files, args.seed)
            started = time.monotonic()
            asyncio.run(traffic.run(args.seconds, args.clients, proc.pid))
            elapsed = time.monotonic() - started
            rss_end = rss_mb(proc.pid)
            alive = proc.poll() is None
            with httpx.Client(base_url=base, timeout=120, headers={"X-API-Key": KEY}) as c:
                for name in traffic.uploaded:  # remove what the clients left, then check integrity
                    c.delete(f"/api/rag/sources/{name}", params={"collection": "soak"})
                left_in_soak = c.get("/api/rag/sources", params={"collection": "soak", "limit": 1000}).json()["items"]
        finally:
            server.stop(timeout=20)

        served = db_counts(url, "default")
        clean_url = create_database(admin, "soak_clean")
        env_clean = {**env, "RAG_DATABASE_URL": clean_url}
        done = subprocess.run([RAG, "ingest", str(root), "--json"], env=env_clean, capture_output=True, text=True)
        clean = db_counts(clean_url, "default")
        lost = orphans(url)

    lat = traffic.latencies
    errors = {str(k): v for k, v in sorted(traffic.by_status.items()) if k < 200 or k >= 300}
    out = {
        "benchmark": "soak",
        "seconds": round(elapsed, 1),
        "clients": args.clients,
        "requests": len(lat),
        "requests_per_s": round(len(lat) / elapsed, 1) if elapsed else 0,
        "by_kind": dict(traffic.kinds),
        "errors_by_status": errors,
        "unexpected": dict(traffic.unexpected),
        "p50_ms": round(float(np.percentile(lat, 50)), 1) if lat else None,
        "p95_ms": round(float(np.percentile(lat, 95)), 1) if lat else None,
        "health_p95_ms": round(float(np.percentile(traffic.health_ms, 95)), 1) if traffic.health_ms else None,
        "health_max_ms": round(max(traffic.health_ms), 1) if traffic.health_ms else None,
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
        "rss_mb_every_30s": traffic.rss_samples,
        # growth over the second half only: what is left once caches and pools have warmed up
        "rss_mb_growth_second_half": round(rss_end - traffic.rss_samples[len(traffic.rss_samples) // 2 - 1], 1)
        if len(traffic.rss_samples) >= 2 else None,
        "server_alive": alive,
        "integrity": {
            "orphans": lost,
            "no_orphans": not any(lost.values()),
            "soak_collection_left": len(left_in_soak),
            "served": served,
            "clean_ingest": clean,
            "equal_to_clean_ingest": served == clean and done.returncode == 0,
        },
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
