"""Ingest benchmark: the shared corpus, copied N times into separate databases (each with its own
embedding cache, so every copy is really encoded) to exceed 5,000 chunks. Prints one JSON line:
end-to-end chunks/s against the raw encoder on the same texts and batch size (each copy's raw
encoding right after its ingest, so the load's drift meets both sides), the unchanged
re-run speed-up, peak RSS and the machine's load average before and after (the machine is shared:
read the figures beside it). The CPU each phase used (this process; the database server's
processes) is beside it: on a busy machine the wall-time ratio moves with the other jobs, while
`cpu_ratio` (the raw encoder's CPU per chunk over the ingest's, database included) says how much
work an ingest does beyond encoding.

`--dagster`: each copy is also ingested by the Dagster run (`rag materialize`'s path in process:
`materialize_corpus` over the copy, with the same loaded model, into databases of its own), and
its raw encoder measured right after it too: `dagster_ratio` is the run's encoded chunks/s
against the raw encoder's, `dagster_run_ratio` the same over the run's own seconds (RUN_START to
its end: without registering partitions and creating the run), `dagster_steps` where the runs'
seconds went (each step, `stages`: the first step's stages before its events, `run_start` /
`run_end`: the run's own start and end around its steps; summed over copies), `dagster_cpu_s` and
`dagster_cpu_ratio` its CPU as `ingest_cpu_s` and `cpu_ratio` are the library's. The Dagster run
also runs the asset checks and reports every file per stage (what operators see); the library and
the Dagster run take turns in going first. As `rag materialize` does, the benchmark starts the
chunk check's validation process (importing Great Expectations) with Dagster's imports, before
any clock starts; a run in a process without it imports at idle priority while it encodes.

    .venv/bin/python benchmarks/ingest.py [--corpus ../shared/corpus] [--copies 2] [--dagster]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import SHARED, create_database, scratch_server, tree_cpu, unique_texts  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.embedding.local import LOCAL_BATCH_SIZE, LocalProvider  # noqa: E402
from rag_lib.models import CorpusRoot  # noqa: E402


def dagster_copy(admin: str, work: Path, n: int, root: Path, provider) -> dict:
    """The Dagster run over one copy, in process (databases of its own, the loaded model): its
    encoded chunks, wall seconds (`materialize_corpus`), the run's own seconds, and the raw
    encoder's rate on its texts right after it."""
    import psycopg
    from pipelines.instance import get_instance, sqlalchemy_url
    from pipelines.launch import materialize_corpus
    from pipelines.resources import preload_provider

    url = create_database(admin, f"dag{n}")
    settings = Settings(database_url=url, home=work / f".rag-dag{n}")
    with KnowledgeBase(settings) as kb:
        kb.store.active_space()  # the schema, made before the clock starts (as the library's first copy)
    create_database(admin, f"dagster{n}")
    os.environ["DAGSTER_PG_URL"] = sqlalchemy_url(admin, f"dagster{n}")
    preload_provider(settings, provider)  # the run's resource takes this model, not a second one
    instance = get_instance(settings)
    try:
        started, cpu0, db0 = time.perf_counter(), tree_cpu(os.getpid()), server_cpu(work / "pgdata")
        materialize_corpus(instance, [CorpusRoot(root, "default")], database_url=url, home=str(settings.home))
        seconds = time.perf_counter() - started
        cpu, db_cpu = tree_cpu(os.getpid()) - cpu0, server_cpu(work / "pgdata") - db0
        run_seconds = sum(r.end_time - r.start_time for r in instance.get_run_records())
        steps = step_timeline(instance)
    finally:
        instance.dispose()
    with psycopg.connect(url) as conn:
        encoded = conn.execute("SELECT count(*) FROM rag_embedding_cache").fetchone()[0]
    texts = unique_texts(url)
    started, cpu0 = time.perf_counter(), time.process_time()
    provider.embed(texts)
    raw_rate = len(texts) / (time.perf_counter() - started)
    raw_cpu_per_chunk = (time.process_time() - cpu0) / len(texts)
    return {"encoded": encoded, "seconds": seconds, "run_seconds": run_seconds, "raw_rate": raw_rate,
            "steps": steps, "cpu": cpu, "db_cpu": db_cpu, "raw_cpu_per_chunk": raw_cpu_per_chunk}


def step_timeline(instance) -> dict[str, float]:
    """Where the runs' seconds went, from their event logs: each step's seconds (its STEP_START to
    its end), `run_start` (RUN_START to the first step), `run_end` (the last step to the run's
    end), and `stages` (the first step's start to its first per-file materialization: the stages
    themselves, which that step runs for every stage; the rest of that step writes events)."""
    from dagster import DagsterEventType

    out: dict[str, float] = {}

    def add(name: str, seconds: float) -> None:
        out[name] = out.get(name, 0.0) + seconds

    for record in instance.get_run_records():
        started: dict[str, float] = {}
        first_step = last_step = first_materialization = None
        for entry in instance.all_logs(record.dagster_run.run_id):
            event = entry.dagster_event
            if event is None:
                continue
            if event.event_type == DagsterEventType.STEP_START:
                started[event.step_key] = entry.timestamp
                first_step = first_step if first_step is not None else entry.timestamp
            elif event.event_type in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE):
                add(event.step_key, entry.timestamp - started[event.step_key])
                last_step = entry.timestamp
            elif event.event_type == DagsterEventType.ASSET_MATERIALIZATION and first_materialization is None:
                first_materialization = entry.timestamp
        if first_step is not None:
            add("run_start", first_step - record.start_time)
            add("run_end", record.end_time - last_step)
            if first_materialization is not None:
                add("stages", first_materialization - first_step)
    return out


def server_cpu(pgdata: Path) -> float:
    """CPU seconds the database server's processes have used so far, backends gone since included
    (their time is added to the server's `children_*` once reaped)."""
    return tree_cpu(int((pgdata / "postmaster.pid").read_text().split()[0]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=SHARED / "corpus")
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=LOCAL_BATCH_SIZE)
    parser.add_argument("--dagster", action="store_true", help="also ingest each copy by the Dagster run")
    args = parser.parse_args()
    if args.dagster:
        # As `rag materialize` starts: the validation process importing Great Expectations beside
        # Dagster's imports (pipelines/cli.py), both before any clock starts; the CLI goes on while
        # it imports, here it is waited for (so no clock holds the import).
        from rag_lib import quality

        quality.preload_great_expectations()
        import pipelines.definitions  # noqa: F401

        quality.wait_for_validator()

    load_before = [round(x, 2) for x in os.getloadavg()]
    provider = LocalProvider("all-MiniLM-L6-v2", 384, batch_size=args.batch_size)
    provider.load()
    provider.embed(["warm up"])
    # and the batch session (a batch of two texts): the raw encoder below finds it made, so the
    # first copy's ingest does not pay for making it either
    provider.embed(["warm up", "the batch session"])
    with scratch_server() as (admin, work):
        documents = chunks = embedded = raw_texts = 0
        seconds = cpu = db_cpu = raw_seconds = raw_cpu = 0.0
        per_copy = []
        bases = []
        dagster: list[dict] = []
        for n in range(args.copies):
            root = work / f"copy{n}"
            shutil.copytree(args.corpus, root)
            if args.dagster and n % 2 == 1:  # odd copies: the Dagster run goes first
                dagster.append(dagster_copy(admin, work, n, root, provider))
            url = create_database(admin, f"bench{n}")
            base = KnowledgeBase(Settings(database_url=url, home=work / ".rag"), provider=provider)
            bases.append((base, root))
            started, cpu0, db0 = time.perf_counter(), time.process_time(), server_cpu(work / "pgdata")
            report = base.ingest([root])
            copy_seconds = time.perf_counter() - started
            seconds += copy_seconds
            cpu += time.process_time() - cpu0
            db_cpu += server_cpu(work / "pgdata") - db0
            documents += report.count("new")
            chunks += report.chunks
            embedded += report.texts_embedded
            # Raw encoder: the same texts (this copy's unique chunks), same model and batch size, right
            # after the copy's ingest, so a change of the machine's load meets both sides of the ratio.
            texts = unique_texts(url)
            started, cpu0 = time.perf_counter(), time.process_time()
            provider.embed(texts)
            copy_raw = time.perf_counter() - started
            raw_seconds += copy_raw
            raw_cpu += time.process_time() - cpu0
            raw_texts += len(texts)
            per_copy.append(round((report.texts_embedded / copy_seconds) / (len(texts) / copy_raw), 3))
            if args.dagster and n % 2 == 0:
                dagster.append(dagster_copy(admin, work, n, root, provider))
        raw_rate = raw_texts / raw_seconds
        # Re-run on the unchanged corpus: nothing to embed or publish.
        started = time.perf_counter()
        for base, root in bases:
            rerun = base.ingest([root])
            assert rerun.count("unchanged") == rerun.count("new") + rerun.count("unchanged") and rerun.texts_embedded == 0
        rerun_seconds = time.perf_counter() - started
        for base, _ in bases:
            base.close()
    e2e_encoded_rate = embedded / seconds
    figures = {}
    if dagster:
        raw = sum(d["encoded"] / d["raw_rate"] for d in dagster)  # the raw encoder's seconds on the same texts
        encoded = sum(d["encoded"] for d in dagster)
        figures = {"dagster_seconds": round(sum(d["seconds"] for d in dagster), 2),
                   "dagster_run_seconds": round(sum(d["run_seconds"] for d in dagster), 2),
                   "dagster_chunks_encoded": encoded,
                   "dagster_ratio": round(raw / sum(d["seconds"] for d in dagster), 3),
                   "dagster_ratio_per_copy": [round(d["encoded"] / d["raw_rate"] / d["seconds"], 3) for d in dagster],
                   "dagster_run_ratio": round(raw / sum(d["run_seconds"] for d in dagster), 3),
                   # as `ingest_cpu_s` / `cpu_ratio`: the run's CPU (this process's threads and its
                   # validation process; the database server's) and the raw encoder's CPU on the same texts over it
                   "dagster_cpu_s": {"python": round(sum(d["cpu"] for d in dagster), 1),
                                     "database": round(sum(d["db_cpu"] for d in dagster), 1)},
                   "dagster_cpu_ratio": round(sum(d["encoded"] * d["raw_cpu_per_chunk"] for d in dagster)
                                              / sum(d["cpu"] + d["db_cpu"] for d in dagster), 3),
                   # the runs' seconds by step (summed over copies), the stages beside them
                   "dagster_steps": {k: round(sum(d["steps"].get(k, 0.0) for d in dagster), 2)
                                     for k in sorted({k for d in dagster for k in d["steps"]},
                                                     key=lambda k: -sum(d["steps"].get(k, 0.0) for d in dagster))}}
    print(json.dumps({
        "benchmark": "ingest",
        "copies": args.copies,
        "documents": documents,
        "chunks": chunks,
        "chunks_encoded": embedded,
        "seconds": round(seconds, 2),
        "end_to_end_chunks_per_s": round(chunks / seconds, 2),
        "end_to_end_encoded_chunks_per_s": round(e2e_encoded_rate, 2),
        "raw_encoder_chunks_per_s": round(raw_rate, 2),
        "ratio": round(e2e_encoded_rate / raw_rate, 3),
        "ratio_per_copy": per_copy,
        "batch_size": args.batch_size,
        "ingest_cpu_s": {"python": round(cpu, 1), "database": round(db_cpu, 1)},
        "raw_cpu_s": round(raw_cpu, 1),
        "cpu_ratio": round((raw_cpu / raw_texts) / ((cpu + db_cpu) / embedded), 3),
        "rerun_seconds": round(rerun_seconds, 2),
        "rerun_speedup": round(seconds / rerun_seconds, 1),
        **figures,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }))


if __name__ == "__main__":
    main()
