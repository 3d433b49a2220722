"""Search latency of two code versions on one existing benchmark database, interleaved search by
search in one session, so a shared machine's load falls on both alike. Prints ONE JSON line.

Each version runs in a worker process of its own (this script with `--worker`, its rag_lib from
that version's checkout on PYTHONPATH); the driver sends every question to both, alternating which
goes first, step by step. Per question and version: hybrid with a new query vector ("hybrid_fresh"),
semantic (a new query vector), lexical, then hybrid reusing the vector semantic just made (what
benchmarks/search.py measures as "hybrid"). Nothing is ingested or built: the database must exist
(benchmarks/search.py --build-only). The questions are search.py's (the 30 dev questions, then
SciFact test claims) plus `LEVER_QUESTIONS`, which name a document type, a named document or a
month without a year, reported on their own (only they exercise those retrieval steps).

    .venv/bin/python benchmarks/search_versions.py --work /tmp/bench100k --base /tmp/old-checkout
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
STEPS = ("hybrid_fresh", "semantic", "lexical", "hybrid")
# Questions naming a document type, a named document or a month without a year (tradegent-probe,
# tradegent-dev2 and the two examples).
LEVER_QUESTIONS = [
    "which fields does a trade journal record when a position is closed",
    "did the NVDA setup satisfy the earnings-momentum strategy's entry rules",
    "Under the pre-earnings momentum strategy, how long can a position be held at most and what should I do "
    "when that limit is hit?",
    "Where in a ticker profile is my own trading record on that stock kept, and what does it track?",
    "Does the earnings-momentum scanner look for names in the same pre-earnings window that the pre-earnings "
    "momentum strategy says to enter?",
    "Did the NVDA Q4 FY2025 earnings setup actually satisfy the earnings-momentum strategy's entry rules, "
    "especially the reward-to-risk requirement?",
    "did the January NVDA trade use the position structure the earnings analysis recommended",
    "how many NVDA trades have I logged - the strategy file and the NVDA profile give different counts",
    "NVDA tends to dip before earnings - how do the ticker profile, earnings analysis and strategy use that",
    "holding period and return for each NVDA earnings trade in the journals, real and sample",
    "did tax harvesting into year end and the quiet christmas tape make the database giant's december dump worse",
    "VIX level recorded in each February 2026 stock analysis",
]


# Unmeasured: they fill the caches only such questions use (documents' names and dates).
WARM_LEVER_QUESTIONS = [
    "what does the earnings-momentum scanner score",
    "the latest stock analysis of MSFT",
    "entry rules in the pre-earnings momentum strategy",
    "the march META trade",
]


def worker(url: str, home: Path) -> None:
    """Answer one JSON request per stdin line ({"q", "step"}) with the search's wall ms and timings."""
    import rag_lib
    from rag_lib.api import KnowledgeBase
    from rag_lib.config import Settings
    from rag_lib.models import SearchFilters
    from rag_lib.search import search as library_search

    kb = KnowledgeBase(Settings(database_url=url, home=home, max_file_bytes=64 * 1024 * 1024))
    store, provider = kb.search_context()
    caches = kb.search_caches
    print(json.dumps({"ready": str(Path(rag_lib.__file__).parent)}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        step = req["step"]
        if step in ("hybrid_fresh", "semantic"):
            caches._queries = None  # a new question: its vector is encoded within the search
        t0 = time.perf_counter()
        res = library_search(store, provider, req["q"], mode=step.split("_")[0], top_k=10,
                             filters=SearchFilters(collection=req.get("collection")), caches=caches)
        ms = (time.perf_counter() - t0) * 1000
        plan = res.plan or {}
        print(json.dumps({"ms": ms, "timings": res.timings_ms, "hits": [h.chunk_id for h in res.hits],
                          "documents": len(plan.get("documents") or [])}), flush=True)
    kb.close()


class Worker:
    """One version's worker process."""

    def __init__(self, label: str, root: Path, url: str, home: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(root)}
        self.label = label
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker", "--url", url, "--home", str(home)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root)
        ready = self._read()
        self.code = ready["ready"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker {self.label} stopped (see its stderr above)")
        return json.loads(line)

    def search(self, q: str, step: str, collection: str | None = None) -> dict:
        self.proc.stdin.write(json.dumps({"q": q, "step": step, "collection": collection}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def summary(samples: list[dict]) -> dict:
    """p50/p95 of the wall ms, and p50/p95 of each stage (timings_ms)."""
    from rag_lib.eval import percentile

    wall = [s["ms"] for s in samples]
    stages: dict[str, list[float]] = {}
    for s in samples:
        for k, v in (s["timings"] or {}).items():
            stages.setdefault(k, []).append(v)
    return {"p50": round(percentile(wall, 50), 2), "p95": round(percentile(wall, 95), 2), "n": len(wall),
            "stages_p50": {k: round(percentile(v, 50), 2) for k, v in sorted(stages.items())},
            "stages_p95": {k: round(percentile(v, 95), 2) for k, v in sorted(stages.items())}}


def measure(workers: list[Worker], questions: list[str], rounds: int, flip: int = 0,
            collection: str | None = None) -> dict:
    """Every question, step and round on every worker, the first worker alternating; samples by
    worker label and step. `collection`: searches scoped to it (None: every chunk, as search.py)."""
    out: dict[str, dict[str, list[dict]]] = {w.label: {s: [] for s in STEPS} for w in workers}
    turn = flip
    for _ in range(rounds):
        for q in questions:
            for step in STEPS:
                order = workers if turn % 2 == 0 else workers[::-1]
                turn += 1
                for w in order:
                    out[w.label][step].append({**w.search(q, step, collection), "q": q})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help="folder of search.py's benchmark server")
    parser.add_argument("--base", type=Path, help="checkout of the code to compare against")
    parser.add_argument("--current", type=Path, default=REPO, help="checkout of the code measured (default: this)")
    parser.add_argument("--database", default="bench_search")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured SciFact train claims run first")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lever-rounds", type=int, default=6)
    parser.add_argument("--scoped", default="default", help="the collection the lever questions also run in")
    args, _ = parser.parse_known_args()
    if args.worker:
        return worker(args.url, args.home)
    if args.work is None or args.base is None:
        parser.error("--work and --base are required")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bench_db import SHARED, bench_database  # noqa: E402

    from rag_lib.db import stop_embedded
    from rag_lib.eval import load_qrels, load_queries

    url, work = bench_database(args.database, args.work, template="tradegent")
    queries = load_queries(SHARED / "datasets" / "scifact" / "queries.jsonl")
    dev = load_queries(SHARED / "eval" / "tradegent-dev" / "queries.jsonl")
    texts = (list(dev.values()) + [queries[q] for q in load_qrels(SHARED / "datasets" / "scifact" / "qrels" / "test.tsv")])
    texts = texts[: args.queries]
    warm = [queries[q] for q in load_qrels(SHARED / "datasets" / "scifact" / "qrels" / "train.tsv")][: args.warmup]
    workers: list[Worker] = []
    try:
        # the current code first: it applies the newer migrations the old code must then run beside
        workers.append(Worker("current", args.current, url, work / "home"))
        workers.append(Worker("base", args.base, url, work / "home"))
        load = {"start": os.getloadavg()}
        measure(workers, warm + WARM_LEVER_QUESTIONS, 1)
        load["after_warmup"] = os.getloadavg()
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
        main_samples = measure(workers, texts, args.rounds)
        load["after_questions"] = os.getloadavg()
        lever_samples = measure(workers, LEVER_QUESTIONS, args.lever_rounds, flip=1)
        load["after_lever_questions"] = os.getloadavg()
        # as KnowledgeBase.search (CLI, API) runs them: scoped to the shared corpus's collection
        scoped_samples = measure(workers, LEVER_QUESTIONS, args.lever_rounds, collection=args.scoped)
        load["end"] = os.getloadavg()
        out = {"benchmark": "search_versions", "started": started, "load_1_5_15": load,
               "code": {w.label: w.code for w in workers}, "questions": len(texts), "rounds": args.rounds,
               "lever_questions": len(LEVER_QUESTIONS), "lever_rounds": args.lever_rounds, "warmup": len(warm)}
        for name, samples in (("questions", main_samples), ("lever_questions", lever_samples),
                              (f"lever_questions_in_{args.scoped}", scoped_samples)):
            res = {label: {step: summary(s) for step, s in by_step.items()} for label, by_step in samples.items()}
            res["ratio_p95"] = {s: round(res["current"][s]["p95"] / res["base"][s]["p95"], 3) for s in STEPS}
            res["ratio_p50"] = {s: round(res["current"][s]["p50"] / res["base"][s]["p50"], 3) for s in STEPS}
            res["named_documents_found"] = sum(x["documents"] > 0 for x in samples["current"]["hybrid"])
            res["same_top10"] = sum(a["hits"] == b["hits"] for a, b in
                                    zip(samples["current"]["hybrid"], samples["base"]["hybrid"]))
            out[name] = res
        out["target_hybrid_p95_le_1.2x"] = out["questions"]["ratio_p95"]["hybrid"] <= 1.2
        print(json.dumps(out))
    finally:
        for w in workers:
            w.close()
        stop_embedded(work / "pgdata")


if __name__ == "__main__":
    main()
