"""Dagster overhead: the same corpus ingested by the library alone and through Dagster (all
partitions in one run, as `rag materialize` does), each into a fresh database with an empty
embedding cache; then both again with `force` (cache hits: the orchestration share is largest);
then both again without `force` (every file unchanged); and the corpus sensor's tick time on a
tree of 10,000 files. Dagster runs go through `pipelines.runner.materialize_corpus` (what
`rag materialize` runs). Prints one JSON line.

    .venv/bin/python benchmarks/dagster_overhead.py [--corpus DIR] [--sensor-files 10000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg  # noqa: E402

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


def run_breakdown(instance, run_ids: list[str]) -> dict:
    """Where a Dagster run's time goes: submit to RUN_START (run worker start-up), RUN_START to
    the run's end, and each step's seconds (summed over runs)."""
    from dagster import DagsterEventType

    out: dict = {"launch_seconds": 0.0, "run_seconds": 0.0, "steps": {}}
    for record in instance.get_run_records():
        if record.dagster_run.run_id not in run_ids:
            continue
        out["launch_seconds"] += record.start_time - record.create_timestamp.timestamp()
        out["run_seconds"] += record.end_time - record.start_time
        started: dict[str, float] = {}
        for entry in instance.all_logs(record.dagster_run.run_id, of_type={
                DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE}):
            key = entry.dagster_event.step_key
            if entry.dagster_event.event_type == DagsterEventType.STEP_START:
                started[key] = entry.timestamp
            else:
                out["steps"][key] = round(out["steps"].get(key, 0.0) + entry.timestamp - started[key], 2)
    out["launch_seconds"] = round(out["launch_seconds"], 2)
    out["run_seconds"] = round(out["run_seconds"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default=str(Path(__file__).resolve().parents[2] / "shared" / "corpus"))
    parser.add_argument("--sensor-files", type=int, default=10_000)
    args = parser.parse_args()
    corpus = Path(args.corpus).resolve()

    from pipelines.instance import get_instance, sqlalchemy_url
    from pipelines.resources import preload_provider
    from pipelines.runner import materialize_corpus

    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        admin = start_embedded(tmp / "pgdata")
        try:
            lib_url, dag_url = fresh_db(admin, "bench_lib"), fresh_db(admin, "bench_dagster")
            lib_settings = Settings(database_url=lib_url, home=tmp / "home")
            dag_settings = Settings(database_url=dag_url, home=tmp / "home")
            provider = get_provider(lib_settings)
            # The library's figures exclude the model load; a Dagster run's worker is a process of
            # its own and loads the model inside the Dagster figure, as every run does.
            provider.embed(["warm-up"])
            preload_provider(dag_settings, provider)

            results: dict = {"corpus": str(corpus)}
            with KnowledgeBase(lib_settings, provider=provider) as kb:
                t = time.perf_counter()
                report = kb.ingest([corpus])
                results["library_seconds"] = round(time.perf_counter() - t, 2)
                results["chunks"] = report.chunks
                results["files"] = len(report.outcomes)
                kb.build_hnsw_index()
                results["library_seconds_with_index"] = round(time.perf_counter() - t, 2)
            print(f"progress: {results}", file=sys.stderr, flush=True)

            os.environ["DAGSTER_PG_URL"] = sqlalchemy_url(admin, create_db(admin, "dagster"))
            instance = get_instance(dag_settings, home=tmp / "dagster_home")
            try:
                t = time.perf_counter()
                summary = materialize_corpus(instance, [CorpusRoot(corpus, "default")], database_url=dag_url,
                                             home=str(tmp / "home"))
                results["dagster_seconds"] = round(time.perf_counter() - t, 2)
                results["dagster_runs"] = len(summary.run_ids)
                results["dagster_success"] = summary.success
                results["ratio"] = round(results["dagster_seconds"] / results["library_seconds_with_index"], 3)
                results["dagster_cold_breakdown"] = run_breakdown(instance, summary.run_ids)
                print(f"progress: {results}", file=sys.stderr, flush=True)

                with KnowledgeBase(lib_settings, provider=provider) as kb:
                    t = time.perf_counter()
                    kb.ingest([corpus], force=True)
                    results["warm_library_seconds"] = round(time.perf_counter() - t, 2)
                t = time.perf_counter()
                materialize_corpus(instance, [CorpusRoot(corpus, "default")], database_url=dag_url,
                                   home=str(tmp / "home"), force=True)
                results["warm_dagster_seconds"] = round(time.perf_counter() - t, 2)
                results["warm_ratio"] = round(results["warm_dagster_seconds"] / results["warm_library_seconds"], 3)
                print(f"progress: {results}", file=sys.stderr, flush=True)

                # Unchanged re-run (no force): every file is current, both paths only confirm it.
                with KnowledgeBase(lib_settings, provider=provider) as kb:
                    t = time.perf_counter()
                    kb.ingest([corpus])
                    results["unchanged_library_seconds"] = round(time.perf_counter() - t, 2)
                t = time.perf_counter()
                materialize_corpus(instance, [CorpusRoot(corpus, "default")], database_url=dag_url,
                                   home=str(tmp / "home"))
                results["unchanged_dagster_seconds"] = round(time.perf_counter() - t, 2)
                results["unchanged_ratio"] = round(
                    results["unchanged_dagster_seconds"] / max(results["unchanged_library_seconds"], 0.01), 3)
            finally:
                instance.dispose()
            results.update(sensor_ticks(tmp, args.sensor_files))
        finally:
            stop_embedded(tmp / "pgdata")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
