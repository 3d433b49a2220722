"""`rag materialize` and the run queue: runs go to the queue only while its daemon beats (Dagster's
status still calls a daemon running 30 minutes after it stopped), and what the runs wait on is said
in one line: runs launched here past a stale heartbeat, a run held in the queue, Ctrl-C leaving the
queued runs behind. Real Postgres-backed instances (dagster.yaml: a QueuedRunCoordinator) with a
daemon heartbeat planted as the daemon writes it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import DagsterEvent, DagsterEventType, DagsterRunStatus, RunsFilter, instance_for_test
from dagster._daemon.types import DaemonHeartbeat  # what the daemon writes (test-only private name)

from pipelines import dagster_private
from pipelines.cli import _print_summary
from pipelines.launch import (LOCATION, QUEUE_DAEMON, QueueWatch, daemon_running, launch_runs, location_in_process,
                              location_workspace, materialize_corpus, queue_takes_runs, runs_in_process, wait_for_run)
from pipelines.partitions import CORPUS_FILES, RANGE_END_TAG, RANGE_START_TAG, range_tags
from pipelines.resources import preload_provider
from rag_lib.cli.app import STATE, interrupted_line, leave_on_interrupt
from rag_lib.config import Settings
from rag_lib.models import CorpusRoot

RELS = ["tradegent/fixtures/sample_trade.yaml"]
KEYS = ["corpus/a.md", "corpus/b.md"]
BIN = Path(sys.executable).parent


def _beat(instance, seconds_ago: float) -> None:
    instance.add_daemon_heartbeat(DaemonHeartbeat(time.time() - seconds_ago, QUEUE_DAEMON, None, []))


def test_runs_go_to_the_queue_only_while_its_daemon_beats():
    """Dagster's status (`daemon_running`) keeps a silent daemon for 30 minutes; the queue takes
    runs only within `stale_after` (default: three missed heartbeats)."""
    queued = {"run_coordinator": {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"}}
    with instance_for_test(overrides=queued) as instance:
        assert not queue_takes_runs(instance)  # never beat
        instance.add_daemon_heartbeat(DaemonHeartbeat(1_000_000.0, QUEUE_DAEMON, None, []))
        for age, takes in ((0, True), (89, True), (91, False), (1_000, False), (5_000, False)):
            assert queue_takes_runs(instance, now=1_000_000.0 + age) is takes, age
        assert daemon_running(instance, now=1_001_000.0)  # what Dagster's status says at 1,000 s
        assert queue_takes_runs(instance, stale_after=1_200, now=1_001_000.0)


@pytest.mark.slow
@pytest.mark.warm_cache
def test_a_stale_heartbeat_runs_here_and_says_so(pg_instance, corpus_copy, database_url, provider, tmp_path):
    """`rag dev` stopped 5 minutes ago: Dagster still counts its daemon running, and the runs once
    went to its queue and waited, silent, for the next `rag dev`. They run here, after one line."""
    root = corpus_copy(*RELS)
    home = tmp_path / ".rag"
    preload_provider(Settings(database_url=database_url, home=home), provider)
    _beat(pg_instance, 300)
    assert daemon_running(pg_instance) and runs_in_process(pg_instance, parallel=1)
    lines: list[str] = []
    summary = materialize_corpus(pg_instance, [CorpusRoot(root, "default")], database_url=database_url,
                                 home=str(home), watch=QueueWatch(say=lines.append))
    assert summary.success and summary.stages["vector_table"] == {"ok": 1}
    (line,) = lines
    assert "daemon last reported 5 min ago" in line and "running 1 run from here, not through its queue" in line
    run = pg_instance.get_run_by_id(summary.run_ids[0])
    engine = [e.message for e in pg_instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)]
    assert any(m.startswith("Started in process for run") for m in engine), engine


@pytest.mark.subprocess
@pytest.mark.slow
def test_a_run_held_in_the_queue_is_reported_once_and_ctrl_c_says_the_runs_stay(pg_instance):
    """A live daemon (a fresh heartbeat) that does not start the runs: after `notice_after` the
    wait says why, once; an interrupt then names the runs left in the queue and how to cancel them."""
    pg_instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
    _beat(pg_instance, 1)
    lines: list[str] = []

    def cancel_from_the_ui(line: str) -> None:  # the user reads the line and terminates the first run
        lines.append(line)
        pg_instance.run_coordinator.cancel_run(first)

    watch = QueueWatch(say=cancel_from_the_ui, notice_after=0.0)
    with location_workspace(pg_instance) as workspace:
        first, second = launch_runs(pg_instance, workspace, "ingest_files", {}, [(k, k) for k in KEYS], watch=watch)
    assert lines == [] and watch.waiting == [first, second]  # submitted to a live daemon: nothing to say yet
    held = pg_instance.get_run_by_id(second)
    assert held.status == DagsterRunStatus.QUEUED and held.tags[RANGE_START_TAG] == KEYS[1]

    assert wait_for_run(pg_instance, first, watch).status == DagsterRunStatus.CANCELED
    (line,) = lines
    assert line.startswith(f"run {first} has waited ") and "in Dagster's run queue" in line
    assert "0 runs in progress" in line and "last reported" in line and "`rag dev` starts it" in line
    watch.still_waiting(pg_instance, held)  # the second run waits too: said once per command
    assert len(lines) == 1

    note = watch.interrupted_note()
    assert second in note and first not in note and "terminate it in the Dagster UI" in note
    try:
        leave_on_interrupt(note)
        assert interrupted_line("materialize") == f"interrupted: rag materialize stopped before it finished; {note}"
    finally:
        leave_on_interrupt(None)
    assert "run the same command again" in interrupted_line("materialize")
    assert STATE["interrupt_kept"] is None


@pytest.mark.subprocess
@pytest.mark.slow
def test_ctrl_c_of_rag_materialize_waiting_on_the_queue_says_its_runs_stay_queued(pg_instance, corpus_copy,
                                                                                   database_url, tmp_path):
    """The command as a user runs it: its run queued behind a live daemon, Ctrl-C prints that the
    run stays queued and how to cancel it, not "run the same command again" (which queues it twice)."""
    root = corpus_copy(*RELS)
    _beat(pg_instance, 1)
    env = {**os.environ, "RAG_DATABASE_URL": database_url, "RAG_HOME": str(tmp_path / ".rag"),
           "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"}  # DAGSTER_PG_URL: pg_instance's database
    env.pop("RAG_CONFIG", None)
    proc = subprocess.Popen([str(BIN / "rag"), "materialize", str(root)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (queued := pg_instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED]))) \
                and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # until the command has submitted its run
        (run,) = queued
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out + err
    assert f"its run went to Dagster's run queue and goes on without it (a queued run starts when the daemon " \
           f"runs: `rag dev`): {run.run_id}; to cancel it, terminate it in the Dagster UI (Runs)" in err, err
    assert "run the same command again" not in err
    assert pg_instance.get_run_by_id(run.run_id).status == DagsterRunStatus.QUEUED


def plant_run(instance, key: str, event: DagsterEventType, run_config: dict):
    """The corpus sensor's ingest_files run over `key`, as the daemon's queue holds it (RUN_ENQUEUED)
    or once it started (RUN_START)."""
    with location_in_process(instance) as location:
        run = dagster_private.create_location_run(instance, location, LOCATION, "ingest_files", run_config,
                                                  {**range_tags(key, key), "rag/trigger": "corpus_sensor"})
    instance.report_dagster_event(DagsterEvent(event.value, "ingest_files"), run.run_id)
    return instance.get_run_by_id(run.run_id)


@pytest.mark.slow
@pytest.mark.warm_cache
def test_a_file_a_queued_run_covers_is_left_to_it_and_that_run_is_waited_for(pg_instance, corpus_copy, database_url,
                                                                              provider, tmp_path, capsys, monkeypatch):
    """`rag materialize` run again while the sensor's run (or its own, left queued by a Ctrl-C)
    waits in the queue over a file used to launch the same work beside it. It launches nothing for
    that file, says which run holds it, and returns once that run ended, its outcome in the summary.
    A file every run is done with is current (nothing waits); --force still runs every file."""
    monkeypatch.delenv("COLUMNS", raising=False)  # captured like a pipe: a pytest-xdist worker inherits 80
    rels = ["tradegent/fixtures/sample_research.yaml", "tradegent/fixtures/sample_trade.yaml"]
    root = corpus_copy(*rels)
    home = tmp_path / ".rag"
    preload_provider(Settings(database_url=database_url, home=home), provider)
    keys = [f"corpus/{rel}" for rel in rels]
    pg_instance.add_dynamic_partitions(CORPUS_FILES, keys)
    config = {"resources": {"rag": {"config": {"database_url": database_url, "home": str(home)}}}}
    queued = plant_run(pg_instance, keys[0], DagsterEventType.RUN_ENQUEUED, config)
    assert queued.status == DagsterRunStatus.QUEUED
    lines: list[str] = []

    def the_daemon_starts_it(line: str) -> None:  # told the command waits on it, the daemon runs it
        lines.append(line)
        if line.startswith(f"run {queued.run_id} has waited"):
            pg_instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_STARTING.value, "ingest_files"),
                                             queued.run_id)
            dagster_private.execute_location_run(pg_instance, pg_instance.get_run_by_id(queued.run_id))

    def materialize(**kwargs):
        return materialize_corpus(pg_instance, [CorpusRoot(root, "default")], database_url=database_url,
                                  home=str(home), watch=QueueWatch(say=the_daemon_starts_it, notice_after=0.0), **kwargs)

    summary = materialize()
    assert lines[0] == (f"1 file needing a run is in runs already queued or in progress: {queued.run_id} "
                        "(ingest_files, queued, corpus_sensor); no second run for it, waiting for that run too "
                        "(Ctrl-C stops waiting; it goes on)")
    assert lines[1].startswith(f"run {queued.run_id} has waited ") and len(lines) == 2
    (own,) = summary.run_ids  # the other file only
    tags = pg_instance.get_run_by_id(own).tags
    assert tags[RANGE_START_TAG] == tags[RANGE_END_TAG] == keys[1]
    assert pg_instance.get_run_by_id(queued.run_id).status == DagsterRunStatus.SUCCESS
    assert summary.waited_for == [queued.run_id] and summary.in_flight == 1 and summary.current == 0
    assert summary.success and summary.stages["vector_table"] == {"ok": 2}  # both runs' files
    _print_summary(summary, False)
    out = capsys.readouterr().out
    assert "2 files (0 current, 1 in runs in flight), 1 run(s) + 1 waited for" in out
    assert f"runs: {own}; waited for: {queued.run_id}" in out

    # Both current now: a run started over one of them holds nothing that needs a run, so nothing waits.
    started = plant_run(pg_instance, keys[0], DagsterEventType.RUN_START, config)
    assert started.status == DagsterRunStatus.STARTED
    again = materialize()
    assert not again.run_ids and not again.waited_for and again.current == 2 and len(lines) == 2
    # --force redoes every stage of every file: a run in flight redoes only what is not current, so it holds none.
    forced = materialize(force=True)
    (run,) = forced.run_ids
    tags = pg_instance.get_run_by_id(run).tags
    assert (tags[RANGE_START_TAG], tags[RANGE_END_TAG]) == tuple(keys) and not forced.waited_for and len(lines) == 2
    assert forced.success and forced.stages["vector_table"] == {"ok": 2}
