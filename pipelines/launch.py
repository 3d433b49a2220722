"""`rag materialize` through the code location: register the roots, sync the partitions, then
create each run for the code location's own job (a remote job origin, as the UI's launch does),
submit it to the instance (the run queue when its daemon beats, else launch it directly,
`--parallel` at a time; one at a time, it runs in this process), wait, and summarize stages, checks and failed partitions from the event log.
Files that are current and materialized get no run unless forced; files a run already queued or in
progress covers get none either, and that run is waited for. What the user waits on (a run held in
the queue, a daemon that stopped, runs over the same files) is said in one line, not waited out in silence."""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_lib import quality
from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.errors import ConfigError
from rag_lib.log import get_logger
from rag_lib.models import CorpusRoot
from rag_lib.search.notes import plural
from rag_lib.corpus_scan import FileTarget

from pipelines import dagster_private
from pipelines.jobs import INGEST_JOB, runs_covering
from pipelines.partitions import (CORPUS_FILES, PartitionMap, decode_key,
                                  keys_needing_runs, plan_ranges, range_tags, record_refused, sync_partitions,
                                  waiting_text)
from pipelines.gc_policy import collections_paused
from pipelines.resources import stage_runner
from pipelines.workers import fail_if_gone, worker_tags

LOCATION = "rag_pipeline"
QUEUE_DAEMON = "QUEUED_RUN_COORDINATOR"
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}
# Dagster's daemon heartbeat interval and the tolerance its liveness check allows past it
# (dagster/_daemon/controller.py: DEFAULT_HEARTBEAT_INTERVAL_SECONDS, DEFAULT_DAEMON_HEARTBEAT_TOLERANCE_SECONDS)
HEARTBEAT_SECONDS, HEARTBEAT_TOLERANCE_SECONDS = 30, 1800
# A live daemon beats every interval: it checks between steps of its loop, and each step is short
# (one run's launch, or half a second idle). Silent for this long, it has stopped (or hangs), and
# its queue would hold runs until it runs again: Dagster's status still calls it running for 30 min.
STALE_HEARTBEAT_SECONDS = 3 * HEARTBEAT_SECONDS
# A run still queued this long after its submission: say why, once (a live daemon dequeues within seconds).
QUEUED_NOTICE_SECONDS = 30.0
# Between reads of a run's status: quick at first (short runs end soon), then at most once a
# second. A read costs ~2.6 ms of CPU here and about as much in Postgres: at a steady 5 reads a
# second, waiting on a cold 3-minute run took ~2.3 s of CPU from an embedding using both cores.
POLL_FIRST_SECONDS, POLL_MAX_SECONDS = 0.1, 1.0
# Between looks at whether a started run's process is still there (`workers.worker_gone`: its engine
# events read, then the process looked up); a process killed mid-run is noticed within this.
WORKER_CHECK_SECONDS = 5.0

log = get_logger(__name__)


def poll_delays() -> Iterator[float]:
    """Seconds to sleep between status reads: 0.1 s, growing by half each time, up to 1 s."""
    delay = POLL_FIRST_SECONDS
    while True:
        yield delay
        delay = min(delay * 1.5, POLL_MAX_SECONDS)


@dataclass
class CheckSummary:
    name: str
    asset: str
    passed: bool
    severity: str
    description: str


@dataclass
class PipelineRunSummary:
    run_ids: list[str] = field(default_factory=list)
    success: bool = True
    partitions: int = 0
    removed: list[str] = field(default_factory=list)
    current: int = 0  # files left alone: current, and materialized on this instance
    in_flight: int = 0  # files needing a run left to runs already queued or in progress (`waited_for`)
    waited_for: list[str] = field(default_factory=list)  # those runs: not this command's, waited for and summarized
    skipped: list[dict[str, str]] = field(default_factory=list)  # path, reason, detail of files not ingested
    stages: dict[str, dict[str, int]] = field(default_factory=dict)  # asset → status → partitions
    checks: list[CheckSummary] = field(default_factory=list)
    failed_partitions: list[str] = field(default_factory=list)
    failed_steps: list[dict[str, str]] = field(default_factory=list)  # run id, step key, error (a crashed check too)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_ids": self.run_ids, "success": self.success, "partitions": self.partitions,
            "removed": self.removed, "current": self.current, "in_flight": self.in_flight,
            "waited_for": self.waited_for, "skipped": self.skipped, "stages": self.stages,
            "checks": [c.__dict__ for c in self.checks], "failed_partitions": self.failed_partitions,
            "failed_steps": self.failed_steps,
            "seconds": round(self.seconds, 3),
        }


def register_partitions(instance, kb: KnowledgeBase, roots: list[CorpusRoot], force: bool = False,
                        refused: list | None = None) -> tuple[list[FileTarget], list[str], list[str]]:
    """Register `roots` (with their collections), then sync the partitions of every registered
    root. Returns (the files under `roots`, partition order, removed keys); files that cannot be
    partitions (`path_too_long`) are recorded as skipped and added to `refused`."""
    chosen = {kb.add_root(r.path, r.collection, source="materialize").name for r in roots}
    pmap = PartitionMap(kb.roots())
    files = pmap.files()
    for skip in record_refused(kb, pmap):
        if refused is not None and skip.collection in {r.collection for r in roots}:
            refused.append(skip)
    # forgetting a gone file needs the database only (the runner loads the model on first stage)
    sync = sync_partitions(instance.get_dynamic_partitions(CORPUS_FILES), pmap, files,
                           lambda target: stage_runner(kb, force).forget(target), holding=kb.store.documents_under)
    sync.apply(instance)
    targets = [pmap.target(k) for k in files if pmap.root_of(k).name in chosen]
    return targets, sync.ordered, sync.removed


def heartbeat_age(instance, now: float | None = None) -> float | None:
    """Seconds since the run-queue daemon's last heartbeat; None when the instance has no run queue
    or the daemon never beat."""
    if QUEUE_DAEMON not in instance.get_required_daemon_types():
        return None
    beat = instance.get_daemon_heartbeats().get(QUEUE_DAEMON)
    if beat is None:
        return None
    return (now if now is not None else time.time()) - beat.timestamp


def daemon_running(instance, now: float | None = None) -> bool:
    """Dagster's daemon status: the run-queue daemon beat within its heartbeat interval plus the
    tolerance the status allows (errors the daemon reported do not count: it still dequeues)."""
    return running_at(heartbeat_age(instance, now))


def running_at(age: float | None) -> bool:
    """`daemon_running` for a last heartbeat `age` seconds old (None: none)."""
    return age is not None and age <= HEARTBEAT_SECONDS + HEARTBEAT_TOLERANCE_SECONDS


def queue_takes_runs(instance, stale_after: float = STALE_HEARTBEAT_SECONDS, now: float | None = None) -> bool:
    """Whether to submit runs to the queue: its daemon is running and beat within `stale_after`
    seconds. Dagster's status gives a daemon 30 minutes (`daemon_running`); runs queued behind one
    that stopped minutes ago would wait, unseen, until it runs again, so they are launched here."""
    return beats_within(heartbeat_age(instance, now), stale_after)


def beats_within(age: float | None, stale_after: float) -> bool:
    """`queue_takes_runs` for a last heartbeat `age` seconds old (None: none)."""
    return running_at(age) and age <= stale_after


def age_text(seconds: float) -> str:
    """`45 s`, `5 min`, `2.5 h`: an age as a user reads it."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


@dataclass
class QueueWatch:
    """What `rag materialize` tells its user about the run queue, each in one line through `say`:
    runs launched here because the daemon stopped beating (`stale_after`), a run still queued
    `notice_after` seconds after its submission (once), and, on Ctrl-C, which runs stay queued."""

    say: Callable[[str], None] = log.warning
    stale_after: float = STALE_HEARTBEAT_SECONDS
    notice_after: float = QUEUED_NOTICE_SECONDS
    waiting: list[str] = field(default_factory=list)  # submitted to the queue, not yet seen finished
    others: list[str] = field(default_factory=list)  # runs not this command's it waits for (`waits_for`)
    submitted_at: float = 0.0  # time.monotonic() of the last submission
    told: bool = False  # the still-queued line was said

    def takes_runs(self, instance, runs: int) -> bool:
        """`queue_takes_runs`; when Dagster still counts a stale daemon running, say that the `runs`
        start here instead (a daemon gone for longer is the usual no-daemon case: nothing to say)."""
        age = heartbeat_age(instance)
        if beats_within(age, self.stale_after):
            return True
        if running_at(age):
            self.say(f"Dagster's run-queue daemon last reported {age_text(age)} ago (every {HEARTBEAT_SECONDS} s "
                     f"while it runs, so it has stopped): running {plural(runs, 'run')} from here, not through its "
                     "queue (dagster.yaml's queue limits do not apply; --parallel does)")
        return False

    def submitted(self, run_id: str) -> None:
        self.waiting.append(run_id)
        self.submitted_at = time.monotonic()

    def waits_for(self, run_ids: list[str]) -> None:
        """Runs already queued or in progress over this command's files: it waits for them as for its own."""
        self.others.extend(run_ids)
        self.submitted_at = time.monotonic()

    def still_waiting(self, instance, run) -> None:
        """Called at each read of an unfinished run: once a queued run has waited `notice_after`
        seconds, say why it waits (the first time only)."""
        if self.told or run.run_id not in self.waiting + self.others or run.status.value != "QUEUED" \
                or time.monotonic() - self.submitted_at < self.notice_after:
            return
        self.told = True
        self.say(f"run {run.run_id} has waited {age_text(time.monotonic() - self.submitted_at)} in Dagster's run "
                 f"queue: {self._why_queued(instance)}; still waiting (Ctrl-C leaves the runs queued)")

    def _why_queued(self, instance) -> str:
        """The facts a user needs to tell a busy queue from a daemon that is not running."""
        from dagster import DagsterRunStatus, RunsFilter

        age = heartbeat_age(instance)
        running = instance.get_runs_count(RunsFilter(statuses=[DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]))
        reported = "has never reported" if age is None else f"last reported {age_text(age)} ago"
        return (f"its daemon starts queued runs within dagster.yaml's limits ({plural(running, 'run')} in progress "
                f"now) and {reported} (every {HEARTBEAT_SECONDS} s while it runs; `rag dev` starts it)")

    def finished(self, run_id: str) -> None:
        for runs in (self.waiting, self.others):
            if run_id in runs:
                runs.remove(run_id)

    def interrupted_note(self) -> str | None:
        """What an interrupt leaves when runs wait in the queue: they stay there (None: no run does)."""
        if not self.waiting:
            return None
        them = "it" if len(self.waiting) == 1 else "them"
        return (f"{'its run' if len(self.waiting) == 1 else 'its runs'} went to Dagster's run queue and go"
                f"{'es' if len(self.waiting) == 1 else ''} on without it (a queued run starts when the daemon runs: "
                f"`rag dev`): {', '.join(self.waiting)}; to cancel {them}, terminate {them} in the Dagster UI (Runs)")


def _code_server_env(settings: Settings) -> None:
    """The code server and its runs start in the repo folder: give them this process's settings."""
    from pipelines.instance import REPO

    if "RAG_CONFIG" not in os.environ and Path("rag.yaml").is_file():
        os.environ["RAG_CONFIG"] = str(Path("rag.yaml").resolve())
    os.environ.setdefault("RAG_HOME", str(Path(settings.home).resolve()))
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(REPO) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), *paths]))


def run_finished(instance, run_id: str) -> bool:
    return instance.get_run_by_id(run_id).status.value in FINISHED


@contextmanager
def location_workspace(instance, log_level: str = "WARNING") -> Iterator[Any]:
    """A request context on the code location (its code server started for the block)."""
    from pipelines.instance import WORKSPACE_YAML

    with dagster_private.location_workspace(instance, str(WORKSPACE_YAML), log_level) as workspace:
        error = dagster_private.location_load_error(workspace, LOCATION)
        if error:
            raise ConfigError(f"code location {LOCATION} failed to load: {error}")
        yield workspace
        _wait_for_run_processes(workspace)


@contextmanager
def location_in_process(instance) -> Iterator[Any]:
    """The code location loaded in this process (no code server): `launch_runs` executes its
    runs here, as the run worker the code server would start does."""
    from pipelines.instance import WORKSPACE_YAML

    with ExitStack() as stack:
        with collections_paused():
            location = stack.enter_context(dagster_private.location_in_process(instance, str(WORKSPACE_YAML), LOCATION))
        yield location


def runs_in_process(instance, parallel: int, stale_after: float = STALE_HEARTBEAT_SECONDS) -> bool:
    """Run here rather than in a run worker the code server starts: no run queue to submit to, one
    run at a time, and runs the instance would launch locally anyway (Dagster's default launcher,
    not e.g. Kubernetes'). The runs are the same (the location's job, its origin, events, tags);
    what goes is starting the code server and the run worker, each importing Dagster and the code
    location again: 5-8 s of a warm `rag materialize` (see README, dagster_overhead)."""
    from dagster import DefaultRunLauncher

    return parallel == 1 and not queue_takes_runs(instance, stale_after) \
        and isinstance(instance.run_launcher, DefaultRunLauncher)


def _wait_for_run_processes(workspace, timeout: float = 30.0) -> None:
    """A run's status is final before its process exits, and the code server only stops after
    clearing every run process (it reads the run from the database to do so): wait for that while
    the database is certainly up, or the server can outlive us."""
    deadline = time.monotonic() + timeout
    while dagster_private.code_server_runs(workspace, LOCATION) and time.monotonic() < deadline:
        time.sleep(0.2)


def launch_runs(instance, workspace, job_name: str, run_config: dict[str, Any], ranges: list[tuple[str, str]],
                parallel: int = 1, trigger: str = "rag materialize", watch: QueueWatch | None = None) -> list[str]:
    """One run per partition range: submitted to the queue when its daemon beats (dagster.yaml's
    limits apply; `QueueWatch.takes_runs`), else launched here, at most `parallel` at once, or with a
    `location_in_process` workspace executed in this process one after the other. Returns the run ids."""
    watch = watch or QueueWatch()
    queued = watch.takes_runs(instance, len(ranges))
    run_ids: list[str] = []
    in_flight: list[str] = []
    here = isinstance(workspace, dagster_private.InProcessLocation)  # one run after the other, here
    for start, end in ranges:
        # Wait for a free slot before creating the run: a run created and left NOT_STARTED by a Ctrl-C
        # or a kill here would hold its files for every later `rag materialize` and sensor tick.
        delays = poll_delays()
        while not (queued or here) and len(in_flight) >= parallel:
            time.sleep(next(delays))
            in_flight = [r for r in in_flight if not run_finished(instance, r)]
        run = dagster_private.create_location_run(instance, workspace, LOCATION, job_name, run_config,
                                                  {**range_tags(start, end), "rag/trigger": trigger,
                                                   **(worker_tags() if here else {})})
        run_ids.append(run.run_id)
        if here:
            dagster_private.execute_location_run(instance, run)
        elif queued:
            instance.submit_run(run.run_id, workspace)
            watch.submitted(run.run_id)
        else:
            instance.launch_run(run.run_id, workspace)
            in_flight.append(run.run_id)
    return run_ids


def wait_for_run(instance, run_id: str, watch: QueueWatch | None = None):
    """The run once its status is final (read at `poll_delays`); `watch` hears of each read. A
    STARTED run whose process is gone (looked at every WORKER_CHECK_SECONDS) is marked failed."""
    delays = poll_delays()
    checked = time.monotonic()
    while (run := instance.get_run_by_id(run_id)).status.value not in FINISHED:
        if watch is not None:
            watch.still_waiting(instance, run)
        if time.monotonic() - checked >= WORKER_CHECK_SECONDS:
            checked = time.monotonic()
            if fail_if_gone(instance, run, watch.say if watch is not None else log.warning,
                            "run `rag materialize` again for its files"):
                continue
        time.sleep(next(delays))
    if watch is not None:
        watch.finished(run_id)
    return run


def summarize_run(instance, run_id: str, summary: PipelineRunSummary, stages: dict[str, Counter]) -> None:
    """Add one finished run's materializations (by status) and check results to `summary`."""
    from dagster import DagsterEventType

    run = instance.get_run_by_id(run_id)
    summary.success = summary.success and run.status.value == "SUCCESS"
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION):
        event = entry.dagster_event
        mat = event.step_materialization_data.materialization
        status = mat.metadata.get("status")
        stages[mat.asset_key.to_user_string()][status.value if status is not None else "ok"] += 1
        if status is not None and status.value == "failed" and event.partition not in summary.failed_partitions:
            summary.failed_partitions.append(event.partition)
        reason = mat.metadata.get("skip_reason")
        if mat.asset_key.to_user_string() == "raw_documents" and status is not None and status.value == "skipped" \
                and reason is not None:
            detail = mat.metadata.get("skip_detail")
            summary.skipped.append({"path": decode_key(event.partition or "").partition("/")[2], "reason": str(reason.value),
                                    "detail": str(detail.value) if detail is not None else ""})
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        error = entry.dagster_event.step_failure_data.error
        while error is not None and error.cause is not None:  # Dagster wraps what the step raised
            error = error.cause
        message = (error.message if error is not None else "").strip().splitlines()
        summary.failed_steps.append({"run_id": run_id, "step": entry.dagster_event.step_key or "",
                                     "error": message[0] if message else "failed"})
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION):
        ev = entry.dagster_event.asset_check_evaluation_data
        detail = ev.description or (str(ev.metadata["summary"].value) if "summary" in ev.metadata else "")
        summary.checks.append(CheckSummary(ev.check_name, ev.asset_key.to_user_string(), ev.passed,
                                           ev.severity.value, detail))


def in_flight_line(waiting: dict[str, Any]) -> str:
    """What `rag materialize` says of the files it leaves to runs in flight: how many, which runs, that it waits."""
    files, runs = len(waiting), len({run.run_id for run in waiting.values()})
    one = runs == 1
    return (f"{waiting_text(waiting)}; no second run for {'it' if files == 1 else 'them'}, waiting for "
            f"{'that run' if one else 'those runs'} too (Ctrl-C stops waiting; {'it goes' if one else 'they go'} on)")


def materialize_corpus(
    instance,
    roots: list[CorpusRoot],
    *,
    database_url: str | None = None,
    home: str | None = None,
    force: bool = False,
    job_name: str = "ingest_files",
    embed_version: str | None = None,
    log_level: str = "WARNING",
    kb: KnowledgeBase | None = None,
    parallel: int | None = None,
    watch: QueueWatch | None = None,
) -> PipelineRunSummary:
    """Materialize the files under `roots` (all registered roots when empty) that need it (all
    with `force`) through the code location's job: one run per partition range, `parallel`
    (default: settings.pipeline.parallel_runs) ranges at once, recorded on `instance`, visible
    in the UI; files a run already queued or in progress covers are left to it, and it is waited
    for and summarized too. `watch` says what the runs wait on."""
    started = time.perf_counter()
    overrides: dict[str, Any] = {k: v for k, v in {"database_url": database_url, "home": Path(home) if home else None
                                                   }.items() if v is not None}
    own_kb = kb is None
    kb = kb or KnowledgeBase(Settings(**overrides))
    summary = PipelineRunSummary()
    watch = watch or QueueWatch()
    waiting: dict[str, Any] = {}
    try:
        if not roots:  # every registered root whose folder is there (a missing one is left alone)
            roots = [r for r in kb.roots() if r.path.is_dir()]
            if not roots:
                raise ConfigError("no corpus roots with an existing folder: give folders, `rag roots add PATH`, "
                                  "or set pipeline.roots in rag.yaml")
        refused: list = []
        targets, ordered, summary.removed = register_partitions(instance, kb, roots, force, refused)
        summary.skipped = [{"path": s.path, "reason": s.reason, "detail": s.detail} for s in refused]
        summary.partitions = len(targets)
        keys = [t.key for t in targets]
        # An ingest of current files would only confirm them: run the ones that need it.
        if not force and job_name == INGEST_JOB and not embed_version:
            keys = keys_needing_runs(instance, kb, targets)
            summary.current = summary.partitions - len(keys)
            # A run still queued or in progress over some of them (the sensor's, an earlier `rag
            # materialize`'s left in the queue by Ctrl-C) does their work: a second beside it would do
            # it again. --force does not defer: such a run redoes only what is not current.
            waiting = runs_covering(instance, keys, ordered, job_name, watch.say)
            keys = [k for k in keys if k not in waiting]
        parallel = parallel or kb.settings.pipeline.parallel_runs
        _code_server_env(kb.settings)
    finally:
        if own_kb:
            kb.close()
    if waiting:
        summary.in_flight = len(waiting)
        summary.waited_for = list(dict.fromkeys(run.run_id for run in waiting.values()))
        watch.waits_for(summary.waited_for)
        watch.say(in_flight_line(waiting))
    stages: dict[str, Counter] = defaultdict(Counter)
    if keys:
        summary.run_ids = run_ranges(instance, job_name, plan_ranges(keys, ordered, parallel), parallel, summary,
                                     stages, watch, {"database_url": database_url, "home": home, "force": force,
                                                     "embed_version": embed_version}, log_level)
    else:  # a validation process `rag materialize` started ahead would serve no run of this process
        quality.discard_unused_validator()
    # The user expects the files materialized when the command returns: the runs holding some wait too
    for run_id in summary.waited_for:
        wait_for_run(instance, run_id, watch)
        summarize_run(instance, run_id, summary, stages)
    summary.stages = {k: dict(v) for k, v in stages.items()}
    summary.seconds = time.perf_counter() - started
    return summary


def run_ranges(instance, job_name: str, ranges: list[tuple[str, str]], parallel: int, summary: PipelineRunSummary,
               stages: dict[str, Counter], watch: QueueWatch, resource_config: dict[str, Any],
               log_level: str) -> list[str]:
    """Launch one run per range (`launch_runs`), wait for each and add it to `summary`; returns the run ids."""
    config = {k: v for k, v in resource_config.items() if v not in (None, False)}
    run_config: dict[str, Any] = {"loggers": {"console": {"config": {"log_level": log_level}}}}
    if config:
        run_config["resources"] = {"rag": {"config": config}}
    here = runs_in_process(instance, parallel, watch.stale_after)
    if not here:  # a validation process `rag materialize` started ahead would serve no run of this process
        quality.discard_unused_validator()
    with (location_in_process(instance) if here else location_workspace(instance, log_level)) as workspace:
        run_ids = launch_runs(instance, workspace, job_name, run_config, ranges, parallel, watch=watch)
        for run_id in run_ids:
            wait_for_run(instance, run_id, watch)
            summarize_run(instance, run_id, summary, stages)
    return run_ids
