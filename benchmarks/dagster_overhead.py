"""Dagster overhead: `rag ingest CORPUS` (the library) against `rag materialize CORPUS` (the code
location's job, all partitions in one run), each into a fresh database with an empty embedding
cache; as fresh processes (`--commands`: imports, model load and exit included), or in this
process (default: the library with its model already loaded, Dagster through `materialize_corpus`,
which without a daemon executes its run in this process and loads the model once, in its first
run); `--rounds` times in ABBA order; then both again with `--force` (cache hits: the orchestration
share is largest; `--warm-rounds` times, ABBA; `dagster_warm_breakdown`); then both again without (every file unchanged); and the corpus sensor's tick time on a tree of 10,000 files.
Prints one JSON line; `dagster_cold_breakdown` says where each Dagster run's time went, and
`*_encoder_ratio` each side's cold encoded chunks/s against the raw encoder on the same texts (first
round; `*_encoder_ratio_rounds` / `_mean` every round, `dagster_step_*` the run's first step alone,
where its stages run and encode).

Like with like: both sides start from databases whose schemas exist (the library's migrations, the
Dagster instance's tables: made once per database, timed apart as `*_schema_seconds`), with an
empty embedding cache and corpus; both load the model once (in-process: the same loaded model); as
commands both print JSON (`--json`: the library's progress bar is not drawn). Both build the HNSW
index and the ticker profiles; the Dagster run also reports every file per stage, the
`knowledge_graph` asset's per-file graph, and runs the asset checks (what operators see).

    .venv/bin/python benchmarks/dagster_overhead.py [--corpus DIR] [--commands] [--rounds 2] [--warm-rounds 2] [--sensor-files N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from contextlib import contextmanager
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

from _bench_db import SHARED, unique_texts  # noqa: E402  (the shared folder beside the repo, or RAG_SHARED)
from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.db import start_embedded, stop_embedded  # noqa: E402
from rag_lib.embedding import get_provider  # noqa: E402
from rag_lib.models import CorpusRoot  # noqa: E402


def create_db(admin: str, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def fresh_db(admin: str, prefix: str) -> str:
    return admin.replace("/postgres?", f"/{create_db(admin, prefix)}?", 1)


def make_tree(root: Path, n: int) -> None:
    for i in range(n):
        folder = root / f"d{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"note_{i:05d}.yaml").write_text(f"_meta:\n  type: learning\n  id: n{i}\nsummary: note {i} " + "x" * 200 + "\n")


def sensor_ticks(tmp: Path, n: int) -> dict:
    from dagster import build_sensor_context, instance_for_test

    from pipelines.resources import RagResource
    from pipelines.sensors import corpus_sensor

    root = tmp / "tree"
    make_tree(root, n)
    rag = RagResource(home=str(tmp / "sensor_home"))
    rag.kb().add_root(root)  # roots are registry state (sql/006), not resource config
    out = {"sensor_files": n}
    with instance_for_test() as instance:
        t = time.perf_counter()
        with build_sensor_context(instance=instance, cursor=None, resources={"rag": rag}) as ctx:
            first = corpus_sensor(ctx)
        out["sensor_first_tick_seconds"] = round(time.perf_counter() - t, 3)
        out["sensor_first_tick_runs"] = len(first.run_requests)
        out["cursor_bytes"] = len(first.cursor)
        for req in first.dynamic_partitions_requests:
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        t = time.perf_counter()
        with build_sensor_context(instance=instance, cursor=first.cursor, resources={"rag": rag}) as ctx:
            idle = corpus_sensor(ctx)
        out["sensor_idle_tick_seconds"] = round(time.perf_counter() - t, 3)
        for i in range(0, n, n // 10):  # ten changed files
            path = root / f"d{i // 100:03d}" / f"note_{i:05d}.yaml"
            path.write_text(path.read_text() + "changed: true\n")
        t = time.perf_counter()
        with build_sensor_context(instance=instance, cursor=idle.cursor, resources={"rag": rag}) as ctx:
            changed = corpus_sensor(ctx)
        out["sensor_change_tick_seconds"] = round(time.perf_counter() - t, 3)
        out["sensor_change_tick_runs"] = len(changed.run_requests)
    return out


def run_breakdown(instance, limit: int | None = None) -> dict:
    """Where the time of the runs on `instance` went: creating a run to its RUN_START (split into
    creating the run, mostly its planned-materialization events; the code server starting the run
    worker; the worker's own start-up; a run executed in the calling process has no worker:
    creating it to its start is all `create_seconds`), RUN_START to the run's end, and each step's
    seconds (summed over runs)."""
    from dagster import DagsterEventType

    out: dict = {"launch_seconds": 0.0, "create_seconds": 0.0, "spawn_seconds": 0.0, "worker_start_seconds": 0.0,
                 "run_seconds": 0.0, "steps": {}}
    for record in instance.get_run_records(limit=limit):
        created = record.create_timestamp.timestamp()
        out["launch_seconds"] += record.start_time - created
        out["run_seconds"] += record.end_time - record.start_time
        started: dict[str, float] = {}
        launched = worker = None
        for entry in instance.all_logs(record.dagster_run.run_id):
            event = entry.dagster_event
            if event is None:
                continue
            if event.event_type == DagsterEventType.PIPELINE_STARTING:
                launched = entry.timestamp
            elif event.event_type == DagsterEventType.ENGINE_EVENT and worker is None and launched is not None:
                worker = entry.timestamp  # "Started process for run": the worker has imported the code
            elif event.event_type == DagsterEventType.STEP_START:
                started[event.step_key] = entry.timestamp
            elif event.event_type in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE):
                out["steps"][event.step_key] = round(out["steps"].get(event.step_key, 0.0)
                                                     + entry.timestamp - started[event.step_key], 2)
        if launched is not None and worker is not None:
            out["create_seconds"] += launched - created
            out["spawn_seconds"] += worker - launched
            out["worker_start_seconds"] += record.start_time - worker
        elif launched is None:  # executed in the calling process (pipelines.launch.runs_in_process)
            out["create_seconds"] += record.start_time - created
    for name in ("launch_seconds", "create_seconds", "spawn_seconds", "worker_start_seconds", "run_seconds"):
        out[name] = round(out[name], 2)
    return out


def encoder_pace(results: dict, lib: "Side", dag: "Side", provider, tmp: Path) -> dict:
    """Issue 32 item 2 for both sides: the chunks each cold run encoded (its fresh embedding cache)
    per second of the run, against the raw encoder on the same texts (the Dagster side's unique
    chunk texts, the configured provider, one call): `*_encoder_ratio`. The cold runs' seconds are
    their first round's; as commands they include the process's imports and model load, so
    `dagster_run_encoder_ratio` also divides by the Dagster run's own seconds (RUN_START to end)."""
    counts = {}
    for name, side in (("library", lib), ("dagster", dag)):
        with psycopg.connect(side.url) as conn:
            counts[name] = conn.execute("SELECT count(*) FROM rag_embedding_cache").fetchone()[0]
    texts = unique_texts(dag.url)
    if provider is None:  # --commands: nothing loaded in this process yet
        provider = get_provider(Settings(database_url=dag.url, home=tmp / "raw_encoder"))
        provider.embed(["warm-up", "a second text"])
    started = time.perf_counter()
    provider.embed(texts)
    raw_rate = len(texts) / (time.perf_counter() - started)
    run_seconds = results["dagster_cold_breakdown"][0]["run_seconds"]
    out = {"raw_encoder_texts": len(texts), "raw_encoder_chunks_per_s": round(raw_rate, 2),
           "library_encoded_chunks": counts["library"], "dagster_encoded_chunks": counts["dagster"]}
    for name, seconds in (("library", results["library_seconds"][0]), ("dagster", results["dagster_seconds"][0]),
                          ("dagster_run", run_seconds)):
        rate = counts[name.split("_")[0]] / seconds
        out[f"{name}_encoded_chunks_per_s"] = round(rate, 2)
        out[f"{name}_encoder_ratio"] = round(rate / raw_rate, 3)
    # Every cold round (one round is within the noise of the encoder's pace on a shared machine),
    # and the Dagster run's first step alone: the stages, the step that encodes (the steps after it
    # report, check and build the index, as the library's ingest ends with the index and profiles).
    rounds = {"library": results["library_seconds"], "dagster": results["dagster_seconds"],
              "dagster_run": [b["run_seconds"] for b in results["dagster_cold_breakdown"]],
              "dagster_step": [b["steps"].get("raw_documents", 0.0) for b in results["dagster_cold_breakdown"]]}
    for name, seconds in rounds.items():
        ratios = [counts[name.split("_")[0]] / s / raw_rate for s in seconds if s > 0]
        out[f"{name}_encoder_ratio_rounds"] = [round(r, 3) for r in ratios]
        out[f"{name}_encoder_ratio_mean"] = round(sum(ratios) / len(ratios), 3) if ratios else None
    return out


RAG = str(Path(sys.executable).with_name("rag"))


def rag_command(args: list[str], database_url: str, home: Path, dagster_url: str | None = None) -> float:
    """Seconds to run `rag ARGS` as a user would (a fresh process: imports, model load, exit). Exit
    code 1 is expected: the shared corpus holds real bad files, which fail alone."""
    args = [*args, "--json"]  # both sides print one JSON document, neither draws a progress bar
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "RAG_HOME": str(home)}
    if dagster_url:
        env["DAGSTER_PG_URL"] = dagster_url
    t = time.perf_counter()
    done = subprocess.run([RAG, *args], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if done.returncode not in (0, 1):
        raise SystemExit(f"rag {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return seconds


class Side:
    """One side of the comparison, with its own database (and Dagster instance database) and home.
    In-process (default): the library with the model already loaded, Dagster through
    `materialize_corpus` (its run worker still loads the model); `--commands`: `rag ingest` and
    `rag materialize` as fresh processes."""

    def __init__(self, admin: str, tmp: Path, name: str, dagster: bool, commands: bool, provider):
        from pipelines.instance import sqlalchemy_url

        self.url = fresh_db(admin, f"bench_{name}")
        self.home = tmp / name
        self.dagster_url = sqlalchemy_url(admin, create_db(admin, "dagster")) if dagster else None
        self.commands, self.provider = commands, provider
        self.schema_seconds = self.make_schemas()

    def make_schemas(self) -> dict[str, float]:
        """Create the library's schema (and the Dagster instance's tables) before the timed runs:
        once per database for a user, on neither side part of ingesting a corpus."""
        t = time.perf_counter()
        with KnowledgeBase(Settings(database_url=self.url, home=self.home)) as kb:
            kb.store.active_space()  # the first connection applies the migrations
        out = {"library_schema_seconds": round(time.perf_counter() - t, 2)}
        if self.dagster_url:
            t = time.perf_counter()
            with self.instance():
                pass
            out["dagster_schema_seconds"] = round(time.perf_counter() - t, 2)
        return out

    def run(self, corpus: Path, force: bool = False) -> float:
        if self.commands:
            command = "materialize" if self.dagster_url else "ingest"
            return rag_command([command, str(corpus), *(["--force"] if force else [])], self.url, self.home,
                               self.dagster_url)
        if self.dagster_url:
            from pipelines.launch import materialize_corpus
            from pipelines.resources import preload_provider

            # the run's resource uses the model the library side uses (one per embedding config)
            preload_provider(Settings(database_url=self.url, home=self.home), self.provider)
            with self.instance() as instance:
                t = time.perf_counter()
                materialize_corpus(instance, [CorpusRoot(corpus, "default")], database_url=self.url,
                                   home=str(self.home), force=force)
                return time.perf_counter() - t
        t = time.perf_counter()
        with KnowledgeBase(Settings(database_url=self.url, home=self.home), provider=self.provider) as kb:
            kb.ingest([corpus], force=force)
        return time.perf_counter() - t

    @contextmanager
    def instance(self):
        from pipelines.instance import get_instance

        os.environ["DAGSTER_PG_URL"] = self.dagster_url
        instance = get_instance(Settings(database_url=self.url, home=self.home))
        try:
            yield instance
        finally:
            instance.dispose()

    def breakdown(self, last: bool = False) -> dict:
        """Where this side's runs went (a fresh instance per side: its runs are this side's); `last`:
        its latest run only."""
        with self.instance() as instance:
            return run_breakdown(instance, limit=1 if last else None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default=str(SHARED / "corpus"))
    parser.add_argument("--sensor-files", type=int, default=10_000)
    parser.add_argument("--commands", action="store_true",
                        help="time `rag ingest` / `rag materialize` as fresh processes (imports, model load, exit)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="cold rounds, in ABBA order (library, Dagster, Dagster, library, ...): a "
                             "neighbour's load drifting during the minutes of a cold run cancels out")
    parser.add_argument("--warm-rounds", type=int, default=1,
                        help="warm `--force` rounds, in ABBA order too (their seconds are summed for warm_ratio)")
    args = parser.parse_args()
    corpus = Path(args.corpus).resolve()

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        admin = start_embedded(tmp / "pgdata")
        try:
            provider = None
            if not args.commands:  # the in-process library's figures exclude the model load
                provider = get_provider(Settings(database_url=admin, home=tmp / "home"))
                # two texts: the batch path (a single text takes the query path)
                provider.embed(["warm-up", "a second text"])
            results: dict = {"corpus": str(corpus), "commands": args.commands,
                             "load_average_start": [round(x, 2) for x in os.getloadavg()],
                             "library_seconds": [], "dagster_seconds": [],
                             "dagster_cold_breakdown": []}
            for n in range(args.rounds):
                order = (False, True) if n % 2 == 0 else (True, False)
                for dagster in order:
                    side = Side(admin, tmp, f"{'dagster' if dagster else 'library'}_{n}", dagster, args.commands,
                                provider)
                    seconds = side.run(corpus)
                    results["dagster_seconds" if dagster else "library_seconds"].append(round(seconds, 2))
                    for name, value in side.schema_seconds.items():
                        results.setdefault(name, []).append(value)
                    if dagster:
                        results["dagster_cold_breakdown"].append(side.breakdown())
                        dag = side
                    else:
                        lib = side
                print(f"progress: {results}", file=sys.stderr, flush=True)
            with psycopg.connect(lib.url) as conn:
                results["chunks"] = conn.execute("SELECT count(*) FROM rag_chunks").fetchone()[0]
            results.update(encoder_pace(results, lib, dag, provider, tmp))
            results["ratio"] = round(sum(results["dagster_seconds"]) / sum(results["library_seconds"]), 3)
            results["round_ratios"] = [round(d / lb, 3) for d, lb in zip(results["dagster_seconds"],
                                                                          results["library_seconds"])]
            # Warm: every vector in the cache, `--force` redoes every stage (ABBA over --warm-rounds,
            # each Dagster run's breakdown kept); then unchanged (no force).
            warm: dict[str, list[float]] = {"library": [], "dagster": []}
            results["dagster_warm_breakdown"] = []
            for n in range(args.warm_rounds):
                for side in ((lib, dag) if n % 2 == 0 else (dag, lib)):
                    warm["dagster" if side is dag else "library"].append(round(side.run(corpus, True), 2))
                    if side is dag:
                        results["dagster_warm_breakdown"].append(side.breakdown(last=True))
            results["warm_library_seconds"], results["warm_dagster_seconds"] = warm["library"], warm["dagster"]
            results["warm_ratio"] = round(sum(warm["dagster"]) / sum(warm["library"]), 3)
            results["warm_extra_seconds"] = round((sum(warm["dagster"]) - sum(warm["library"])) / args.warm_rounds, 2)
            print(f"progress: {results}", file=sys.stderr, flush=True)
            results["unchanged_library_seconds"] = round(lib.run(corpus, False), 2)
            results["unchanged_dagster_seconds"] = round(dag.run(corpus, False), 2)
            results["unchanged_ratio"] = round(results["unchanged_dagster_seconds"] / results["unchanged_library_seconds"], 3)
            results["extra_seconds"] = round((sum(results["dagster_seconds"]) - sum(results["library_seconds"]))
                                             / args.rounds, 2)
            results["load_average"] = [round(x, 2) for x in os.getloadavg()]
            results.update(sensor_ticks(tmp, args.sensor_files))
        finally:
            stop_embedded(tmp / "pgdata")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
