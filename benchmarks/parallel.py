"""Parallel runs: `rag materialize --parallel N` (pipelines.launch.materialize_corpus) with 1, 2 and
4 runs at once, each on a fresh database and a cold embedding cache, (a) against the OpenAI-compatible
stub (tests/openai_stub.py, its own process) at 50 ms per request, and (b) with the local model
(CPU-bound: on 2 cores, more runs mostly share the same cores). Prints ONE JSON line.

    .venv/bin/python benchmarks/parallel.py [--runs 1,2,4] [--local-files 40] [--latency 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

from _bench_db import SHARED, copy_corpus_files, create_database, scratch_server  # noqa: E402
from embedding import MODEL, DIMS, StubProcess  # noqa: E402

import psycopg  # noqa: E402

from rag_lib.config import Settings  # noqa: E402
from rag_lib.models import CorpusRoot  # noqa: E402

STUB_ENV = {"RAG_EMBEDDING__PROVIDER": "openai_compatible", "RAG_EMBEDDING__MODEL": MODEL,
            "RAG_EMBEDDING__DIMENSIONS": str(DIMS), "RAG_EMBEDDING__CONCURRENCY": "4"}


def materialize(admin: str, tag: str, corpus: Path, home: Path, parallel: int) -> dict:
    """One `rag materialize --parallel N` on fresh databases (library and Dagster)."""
    from pipelines.instance import get_instance, sqlalchemy_url
    from pipelines.launch import materialize_corpus

    url = create_database(admin, f"par_{tag}")
    os.environ["DAGSTER_PG_URL"] = sqlalchemy_url(admin, f"par_{tag}_dagster")
    create_database(admin, f"par_{tag}_dagster")
    instance = get_instance(Settings(database_url=url, home=home), home=home / f"dagster_{tag}")
    try:
        started = time.perf_counter()
        summary = materialize_corpus(instance, [CorpusRoot(corpus, "default")], database_url=url, home=str(home),
                                     parallel=parallel)
        seconds = time.perf_counter() - started
        steps = step_seconds(instance, summary.run_ids)
    finally:
        instance.dispose()
    assert summary.success and not summary.failed_partitions, summary.to_dict()
    with psycopg.connect(url) as conn:
        chunks = conn.execute("SELECT count(*) FROM rag_chunks").fetchone()[0]
    return {"runs": len(summary.run_ids), "seconds": round(seconds, 2), "files": summary.partitions,
            "chunks": chunks, "files_per_s": round(summary.partitions / seconds, 2),
            "chunks_per_s": round(chunks / seconds, 1), "step_seconds_summed_over_runs": steps}


def step_seconds(instance, run_ids: list[str]) -> dict[str, float]:
    """Where the time went: each step's duration summed over the runs, plus each run's start-up
    (run start to its first step: process spawn and code location load)."""
    totals: dict[str, float] = {"run_startup": 0.0}
    for run_id in run_ids:
        run_start = instance.get_run_stats(run_id).launch_time or 0.0
        stats = instance.get_run_step_stats(run_id)
        if stats:
            totals["run_startup"] += min(s.start_time for s in stats) - run_start
        for s in stats:
            totals[s.step_key] = totals.get(s.step_key, 0.0) + (s.end_time - s.start_time)
    return {k: round(v, 2) for k, v in totals.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=SHARED / "corpus")
    parser.add_argument("--runs", default="1,2,4")
    parser.add_argument("--local-files", type=int, default=40, help="files of the corpus used with the local model")
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--only", choices=("stub", "local"), help="run one of the two parts")
    args = parser.parse_args()
    counts = [int(n) for n in args.runs.split(",")]
    out: dict = {"corpus": str(args.corpus), "cores": os.cpu_count()}
    parts = [args.only] if args.only else ["stub", "local"]
    with scratch_server("rag-par-") as (admin, work), tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        if "stub" in parts:
            with StubProcess(latency=args.latency) as stub:
                os.environ.update({**STUB_ENV, "RAG_EMBEDDING__BASE_URL": stub.base_url})
                try:
                    out["stub"] = {"latency_s": args.latency, **{
                        f"runs_{n}": materialize(admin, f"stub{n}", args.corpus, home, n) for n in counts}}
                finally:
                    for key in (*STUB_ENV, "RAG_EMBEDDING__BASE_URL"):
                        os.environ.pop(key, None)
            print(f"progress: {out}", file=sys.stderr, flush=True)
        if "local" in parts:
            local = Path(tmp) / "local_corpus"
            copy_corpus_files(local, args.local_files, args.corpus)
            out["local"] = {f"runs_{n}": materialize(admin, f"local{n}", local, home, n) for n in counts}
    for kind in parts:
        base = out[kind][f"runs_{counts[0]}"]["seconds"]
        out[kind]["speedup"] = {f"runs_{n}": round(base / out[kind][f"runs_{n}"]["seconds"], 2) for n in counts}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
