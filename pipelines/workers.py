"""Whether a started run's process is still there. Dagster's default launcher runs each run in a
process on this machine (a child of the code server, or `rag materialize` itself) and gives
Dagster's run monitoring no way to ask about it: a run whose process was killed (SIGKILL, the
OOM killer, a machine restart) stayed STARTED for ever, and `rag materialize`, the corpus sensor
and the schedules left its files to it and waited. `LocalRunLauncher` (dagster.yaml) records the
machine a run starts on and answers run monitoring's health check, so the daemon marks such a run
failed; the same answer lets `rag materialize`, the sensor and the schedules do so when no daemon
runs (`fail_if_gone`)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass

import psutil
from dagster import DagsterEventType, DagsterRun, DagsterRunStatus, DefaultRunLauncher

from pipelines import dagster_private

WORKER_HOST_TAG = "rag/worker_host"
# A process started this long after the run's "started process" event is not the run's: the pid was
# reused (a process's start time is known to the tick of the kernel's clock and the boot time's second).
START_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class Worker:
    """A run's process: its machine, pid, and the time of the event that reported it."""

    host: str
    pid: int
    reported_at: float

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host}"


def worker_tags() -> dict[str, str]:
    """The tag naming the machine a run's process starts on (this one)."""
    return {WORKER_HOST_TAG: socket.gethostname()}


def run_worker(instance, run: DagsterRun) -> Worker | None:
    """The run's latest process, from its engine events' `pid` (Dagster's "Started process for run",
    ours for a run executed in `rag materialize`); None before it reported one, or when the run
    records no machine (launched by another launcher, or before this launcher)."""
    host = run.tags.get(WORKER_HOST_TAG)
    if not host:
        return None
    for entry in reversed(instance.all_logs(run.run_id, of_type=DagsterEventType.ENGINE_EVENT)):
        pid = entry.dagster_event.engine_event_data.metadata.get("pid")
        if pid is not None and str(pid.value).isdigit():
            return Worker(host, int(pid.value), entry.timestamp)
    return None


def process_alive(pid: int, started_by: float) -> bool:
    """Whether process `pid` exists, is not a zombie and started by `started_by` (a later one reuses the pid)."""
    try:
        process = psutil.Process(pid)
        return process.status() != psutil.STATUS_ZOMBIE and process.create_time() <= started_by + START_SLACK_SECONDS
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # there, and not ours to read
        return True


def worker_gone(instance, run: DagsterRun) -> Worker | None:
    """The process of a STARTED run when it is gone from this machine; None while it runs, or when
    this machine cannot tell (not started, no process reported yet, another machine's run)."""
    if run.status != DagsterRunStatus.STARTED:
        return None
    worker = run_worker(instance, run)
    if worker is None or worker.host != socket.gethostname() or process_alive(worker.pid, worker.reported_at):
        return None
    return worker


def gone_text(worker: Worker) -> str:
    return f"its process ({worker}) is gone (killed, or the machine restarted)"


def fail_if_gone(instance, run: DagsterRun, say: Callable[[str], None], after: str) -> bool:
    """Mark the run failed when its process is gone (`worker_gone`), as Dagster's run monitoring
    does, and say so in one line ending with `after` (what becomes of its files); True if it was."""
    worker = worker_gone(instance, run)
    if worker is None:
        return False
    instance.report_run_failed(run, f"Run worker gone: {gone_text(worker)}; marked failed")
    say(f"run {run.run_id} ({run.job_name}) was left STARTED, but {gone_text(worker)}: marked failed; {after}")
    return True


class LocalRunLauncher(DefaultRunLauncher):
    """Dagster's default launcher (a process per run beside the code server) that records the
    machine each run starts on and tells run monitoring whether the run's process is there."""

    def launch_run(self, context) -> None:
        self._instance.add_run_tags(context.dagster_run.run_id, worker_tags())
        super().launch_run(context)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: DagsterRun):
        worker = worker_gone(self._instance, run)
        return dagster_private.worker_health(None if worker is None else gone_text(worker))
