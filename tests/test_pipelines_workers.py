"""A started run whose process is gone (SIGKILL, the OOM killer, a machine restart) never ends by
itself: Dagster's run monitoring marks it failed through our launcher's health check (dagster.yaml),
and `rag materialize`, the sensor and the schedules mark it failed themselves instead of waiting
for it. Real Postgres-backed instances; the gone process is a real process that has exited."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import pytest
from dagster import DagsterRunStatus
from dagster._daemon.monitoring.run_monitoring import monitor_started_run  # test-only: the daemon's check

from pipelines import launch
from pipelines.definitions import defs
from pipelines.launch import QueueWatch, materialize_corpus, wait_for_run
from pipelines.partitions import CORPUS_FILES, RANGE_END_TAG, RANGE_START_TAG, range_tags
from pipelines.resources import preload_provider
from pipelines.workers import LocalRunLauncher, process_alive
from rag_lib.config import Settings
from rag_lib.models import CorpusRoot
from testkit import exited_pid, started_run as started

RELS = ["tradegent/fixtures/sample_research.yaml", "tradegent/fixtures/sample_trade.yaml"]
KEYS = [f"corpus/{rel}" for rel in RELS]


def started_run(instance, key: str, pid: int, host: str | None = None):
    """The corpus sensor's ingest_files run over `key`, STARTED, its process `pid` on `host` (this machine)."""
    return started(instance, "ingest_files", {**range_tags(key, key), "rag/trigger": "corpus_sensor"}, pid, host)


def test_a_process_is_the_runs_only_if_it_started_before_the_run_reported_it():
    assert process_alive(os.getpid(), time.time())
    assert not process_alive(os.getpid(), time.time() - 3600)  # started after: the pid was reused
    assert not process_alive(exited_pid(), time.time())


def test_run_monitoring_fails_a_started_run_whose_process_is_gone_and_leaves_the_others(pg_instance):
    """dagster.yaml's launcher answers the daemon's health check: Dagster's default one cannot, so
    a run whose process was killed stayed STARTED for ever. A run whose process runs, one on another
    machine and one that recorded no machine (launched before this launcher) are left as they are."""
    assert isinstance(pg_instance.run_launcher, LocalRunLauncher)
    pg_instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
    gone = started_run(pg_instance, KEYS[0], exited_pid())
    alive = started_run(pg_instance, KEYS[1], os.getpid())
    elsewhere = started_run(pg_instance, KEYS[1], exited_pid(), host="another-machine")
    unknown = pg_instance.create_run_for_job(defs.resolve_job_def("ingest_files"), status=DagsterRunStatus.STARTED)
    for run in (gone, alive, elsewhere, unknown):
        monitor_started_run(pg_instance, None, pg_instance.get_run_record_by_id(run.run_id), logging.getLogger("test"))
    assert pg_instance.get_run_by_id(gone.run_id).status == DagsterRunStatus.FAILURE
    assert {pg_instance.get_run_by_id(r.run_id).status for r in (alive, elsewhere, unknown)} == {DagsterRunStatus.STARTED}


def test_waiting_for_a_run_whose_process_is_gone_ends_with_it_failed(pg_instance, monkeypatch):
    """`rag materialize` waiting for a run (its own, or one over its files) whose process was killed
    returned never; it marks the run failed and says so in one line."""
    monkeypatch.setattr(launch, "WORKER_CHECK_SECONDS", 0.0)
    pg_instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
    pid = exited_pid()
    run = started_run(pg_instance, KEYS[0], pid)
    lines: list[str] = []
    waiter = threading.Thread(target=wait_for_run, args=(pg_instance, run.run_id, QueueWatch(say=lines.append)),
                              daemon=True)
    waiter.start()
    waiter.join(timeout=30)
    assert not waiter.is_alive(), "still waiting for a run whose process is gone"
    assert pg_instance.get_run_by_id(run.run_id).status == DagsterRunStatus.FAILURE
    assert lines == [f"run {run.run_id} (ingest_files) was left STARTED, but its process (pid {pid} on "
                     f"{socket.gethostname()}) is gone (killed, or the machine restarted): marked failed; run "
                     "`rag materialize` again for its files"]


@pytest.mark.slow
@pytest.mark.warm_cache
@pytest.mark.timeout(300)  # before: waited for ever
def test_materialize_runs_the_files_of_a_started_run_whose_process_is_gone(pg_instance, corpus_copy, database_url,
                                                                          provider, tmp_path):
    """A `rag materialize` after a crash (the sensor's run over a file was killed, or the machine
    restarted) used to wait for ever for that run; it marks it failed, says so, and runs its file."""
    root = corpus_copy(*RELS)
    home = tmp_path / ".rag"
    preload_provider(Settings(database_url=database_url, home=home), provider)
    pg_instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
    dead = started_run(pg_instance, KEYS[0], exited_pid())
    lines: list[str] = []
    summary = materialize_corpus(pg_instance, [CorpusRoot(root, "default")], database_url=database_url,
                                 home=str(home), watch=QueueWatch(say=lines.append))
    assert len(lines) == 1 and lines[0].startswith(f"run {dead.run_id} (ingest_files) was left STARTED, but its "
                                                   "process (pid ") and lines[0].endswith(": marked failed; its files "
                                                                                          "get a run now")
    assert pg_instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
    (run,) = summary.run_ids
    tags = pg_instance.get_run_by_id(run).tags
    assert (tags[RANGE_START_TAG], tags[RANGE_END_TAG]) == tuple(KEYS) and not summary.waited_for
    assert summary.success and summary.stages["vector_table"] == {"ok": 2}
