"""`rag materialize` as a user runs it (a subprocess): the root is registered, and its runs are
runs of the code location's job (remote job origin, what the UI's job page and Overview need)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterEventType

from pipelines.instance import get_instance, sqlalchemy_url
from pipelines.partitions import CORPUS_FILES
from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings

RELS = ["tradegent/fixtures/sample_trade.yaml", "tradegent/fixtures/sample_research.yaml"]
BIN = Path(sys.executable).parent


@pytest.mark.subprocess
@pytest.mark.slow
def test_materialize_runs_through_the_code_location(corpus_copy, pg_server, database_url, provider, tmp_path,
                                                    monkeypatch):
    name = "dagster_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    pg_url = sqlalchemy_url(pg_server, name)
    root = corpus_copy(*RELS)
    home = tmp_path / ".rag"
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "RAG_HOME": str(home), "DAGSTER_PG_URL": pg_url,
           "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"}
    env.pop("RAG_CONFIG", None)
    proc = subprocess.run([str(BIN / "rag"), "materialize", str(root), "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["success"] and summary["partitions"] == 2 and len(summary["run_ids"]) == 1
    assert summary["stages"]["vector_table"] == {"ok": 2} and not summary["failed_partitions"]
    assert {c["name"] for c in summary["checks"] if c["passed"]} >= {"embeddings_valid", "vector_table_orphans"}

    monkeypatch.setenv("DAGSTER_PG_URL", pg_url)
    settings = Settings(database_url=database_url, home=home)
    instance = get_instance(settings)  # the instance the command used (DAGSTER_HOME under the rag home)
    try:
        (run,) = instance.get_runs()
        assert run.run_id == summary["run_ids"][0] and run.is_success and run.job_name == "ingest_files"
        origin = run.remote_job_origin  # null for execute_in_process runs: those miss the job page
        assert origin is not None and origin.location_name == "rag_pipeline"
        assert origin.repository_origin.repository_name == "__repository__"
        assert run.tags["rag/trigger"] == "rag materialize"
        # no daemon: the command executed its run itself, with no code server and run worker to start
        engine = [e.message for e in instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)]
        assert any(m.startswith("Started in process for run") for m in engine), engine
        assert instance.get_dynamic_partitions(CORPUS_FILES) == [f"corpus/{rel}" for rel in sorted(RELS)]
    finally:
        instance.dispose()
    with KnowledgeBase(settings, provider=provider) as kb:
        (registered,) = kb.roots()
        assert registered.path == root.resolve() and registered.collection == "default"
        assert kb.show(RELS[0])["chunk_count"] > 0
        # the run worker's embedding calls are in `rag metrics`, as a library ingest's are
        embedding = kb.metrics_summary()["embedding"]
        assert embedding["calls"] >= 1 and embedding["failures"] == 0 and embedding["by_provider"] == {
            "local": embedding["calls"]}


def test_rag_lib_imports_nothing_from_pipelines():
    import ast

    offenders = []
    for path in (Path(__file__).resolve().parents[1] / "rag_lib").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n == "pipelines" or n.startswith("pipelines.")]
    assert not offenders, offenders


@pytest.mark.subprocess
def test_dagster_commands_come_from_the_entry_point():
    from rag_lib.cli.plugins import command_plugins

    (plugin,) = [ep for ep in command_plugins() if ep.name == "pipelines"]
    assert plugin.value == "pipelines.cli:register"
    proc = subprocess.run([str(BIN / "rag"), "--help"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0 and "materialize" in proc.stdout and " dev " in proc.stdout


# `rag materialize` with its validation process observed: when it starts (whether Dagster is
# imported by then) and what is left of it when the command is done.
OBSERVED_RAG = """
import sys
from rag_lib import quality

start, discard = quality.preload_great_expectations, getattr(quality, "discard_unused_validator", lambda: None)

def observed_start(**kwargs):
    if quality._validator is None:
        print("validation process starts; dagster imported:", "dagster" in sys.modules, file=sys.stderr, flush=True)
    start(**kwargs)

def observed_discard():
    pool = quality._validator
    workers = list(pool._processes.values()) if pool is not None else []
    discard()
    if pool is not None:
        print("validation process", "kept" if quality._validator is pool else "stopped",
              [w.exitcode for w in workers], file=sys.stderr, flush=True)

quality.preload_great_expectations, quality.discard_unused_validator = observed_start, observed_discard
from rag_lib.cli import main
sys.argv = ["rag", *sys.argv[1:]]
main()
"""


@pytest.mark.subprocess
@pytest.mark.slow
def test_materialize_imports_great_expectations_beside_dagster(corpus_copy, pg_server, database_url, tmp_path):
    """A `rag materialize` of new files starts the chunk_sizes check's validation process (seconds
    of importing Great Expectations on one core) before it imports Dagster, so the two imports
    overlap and the check does not wait for it at the run's end; the process then validates the
    run's frame. When nothing runs (every file current) it is stopped at once, not waited for; a
    forced re-run of an unchanged corpus (its frame validated before) starts none."""
    name = "dagster_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    root = corpus_copy(*RELS)
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "RAG_HOME": str(tmp_path / ".rag"),
           "DAGSTER_PG_URL": sqlalchemy_url(pg_server, name), "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"}
    env.pop("RAG_CONFIG", None)

    def materialize(*args: str) -> tuple[dict, str]:
        proc = subprocess.run([sys.executable, "-c", OBSERVED_RAG, "materialize", str(root), "--json", *args],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout), proc.stderr

    summary, log = materialize()
    assert summary["stages"]["chunks"] == {"ok": 2}
    chunk_sizes = next(c for c in summary["checks"] if c["name"] == "chunk_sizes")
    assert chunk_sizes["passed"] and chunk_sizes["description"].endswith("tokens")
    assert "validation process starts; dagster imported: False" in log
    assert "validation process kept" in log  # it validated the run's new frame

    summary, log = materialize()  # every file current: no run
    assert not summary["run_ids"] and summary["current"] == 2
    assert "validation process starts; dagster imported: False" in log
    assert "validation process stopped [-9]" in log, log  # killed, its import not waited for

    summary, log = materialize("--force")
    assert summary["stages"]["chunks"] == {"ok": 2}
    assert "validation process starts" not in log  # the same frame: its validation was kept
    assert next(c for c in summary["checks"] if c["name"] == "chunk_sizes")["passed"]


def test_a_step_that_raised_is_named_in_the_summary_and_its_printout(pg_instance, capsys):
    """A check that crashes emits no check result: `rag materialize` used to list every stage "ok"
    and leave the check out of its table, with only the exit code saying something failed."""
    from collections import Counter, defaultdict

    from dagster import job, op

    from pipelines.cli import _print_summary
    from pipelines.launch import PipelineRunSummary, summarize_run

    @op
    def orphans_check():
        raise TypeError("document_sources() missing 1 required positional argument: 'collection'")

    @job
    def broken():
        orphans_check()

    run = broken.execute_in_process(instance=pg_instance, raise_on_error=False)
    summary = PipelineRunSummary(run_ids=[run.run_id], partitions=1)
    summarize_run(pg_instance, run.run_id, summary, defaultdict(Counter))
    assert not summary.success
    assert summary.failed_steps == [{"run_id": run.run_id, "step": "orphans_check",
                                     "error": "TypeError: document_sources() missing 1 required positional argument: "
                                              "'collection'"}]
    _print_summary(summary, False)
    out = capsys.readouterr().out
    assert "step orphans_check failed" in out and "TypeError: document_sources()" in out
