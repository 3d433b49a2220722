"""Every use of a Dagster name outside its public API, in one place (the rest of `pipelines/` uses
only `dagster`'s public surface, the instance's methods and the storage class in dagster.yaml).

`rag materialize` creates runs of the code location's job as the UI's "Materialize" does: a run
with a remote job origin, planned by the code server, so it shows on the job's page and the
Overview and can be re-executed from the UI. Dagster offers that publicly only through the
webserver's GraphQL API (`DagsterGraphQLClient`), and starting a webserver for each `rag
materialize` would add its start-up (seconds) to every command, when no `rag dev` runs; the
public in-process alternatives (`materialize`, `execute_job`) make runs without that origin
(null `repositoryOrigin`: not on the job page, not re-executable from the UI). Measured
2026-11-26 (load average 22 on 2 cores): our workspace was ready to create runs after 17 s, a
`dagster-webserver` on the same workspace answered GraphQL with the location loaded after 42-48 s;
the difference would be paid by every `rag materialize`. So, one function per private name:

- `location_workspace`: `WorkspaceProcessContext`, `WorkspaceFileTarget` (load workspace.yaml:
  start the code server, as `dagster dev` does);
- `create_location_run`: `JobSubsetSelector` and `DagsterInstance.create_run`'s internal
  signature (what GraphQL's launchPipelineExecution does before `submit_run`);
- `location_in_process` and `execute_location_run`: `InProcessCodeLocationOrigin`, `RemoteJobOrigin`,
  `RemoteRepositoryOrigin`, `recon_job_from_origin` and `core_execute_run` (the location loaded in
  this process, its run executed here as the run worker would execute it). Without a daemon,
  `rag materialize` ran each run in a run worker that the code server spawned: the code server and
  the worker each imported Dagster and the code location again (the `spawn` start method is the
  only one Dagster's server uses). Measured 2026-11-26 on a warm `--force` of the shared corpus
  (load average 9-14 on 2 cores): 4.1-11 s from creating the run to its start in the worker, the
  code server's own start not counted, against 0.9-1.6 s from creating the run to its start here
  (`benchmarks/dagster_overhead.py`; README, dagster_overhead).
- `code_server_runs`: the code server's gRPC client and `dagster._serdes.deserialize_value`
  (which run processes the code server still has). Dagster's documented alternative, `code_servers:
  wait_for_local_processes_on_shutdown` in dagster.yaml, would also make `rag dev` wait on Ctrl-C
  for every run a UI launched (and fail after 30 s). Measured 2026-11-26 (load 14): when a run's
  status was final its process was still there in one of two `rag materialize` runs, for 0.42 s;
  without the wait the code server outlives the command by as long, reading a database that a test
  or benchmark may be stopping.
- `worker_health`: `CheckRunHealthResult` and `WorkerStatus`, what a run launcher answers Dagster's
  run monitoring (`pipelines.workers.LocalRunLauncher`); `execute_location_run` reports its process
  with `EngineEventData.in_process`, as Dagster's run worker does, so that check finds it.

`check_names()` resolves each of them; `tests/test_dagster_private.py` runs it and each function
against the installed Dagster, so an upgrade that renames one fails there, by name."""

from __future__ import annotations

import importlib
import os
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# module → names this file uses from it (a method is `Class.method`)
PRIVATE_NAMES: dict[str, tuple[str, ...]] = {
    "dagster._core.workspace.context": ("WorkspaceProcessContext",),
    "dagster._core.workspace.load_target": ("WorkspaceFileTarget",),
    "dagster._core.definitions.selector": ("JobSubsetSelector",),
    "dagster._serdes": ("deserialize_value",),
    "dagster._grpc.client": ("DagsterGrpcClient.get_current_runs",),
    "dagster._core.instance": ("DagsterInstance.create_run",),
    "dagster._core.remote_origin": ("InProcessCodeLocationOrigin", "RemoteJobOrigin", "RemoteRepositoryOrigin"),
    "dagster._utils.hosted_user_process": ("recon_job_from_origin",),
    "dagster._grpc.impl": ("core_execute_run",),
    "dagster._core.launcher.base": ("CheckRunHealthResult", "WorkerStatus"),
    "dagster._core.events": ("EngineEventData.in_process",),
}
# DagsterInstance.create_run's keyword arguments, all required (it changed in 1.8 and 1.10)
CREATE_RUN_ARGS = frozenset({
    "job_name", "run_id", "run_config", "status", "tags", "root_run_id", "parent_run_id", "step_keys_to_execute",
    "execution_plan_snapshot", "job_snapshot", "parent_job_snapshot", "asset_selection", "asset_check_selection",
    "resolved_op_selection", "op_selection", "remote_job_origin", "job_code_origin", "asset_graph",
})


def check_names() -> list[str]:
    """The private names above that the installed Dagster lacks (empty when all resolve), and a
    `create_run` whose keyword arguments are not the ones `create_location_run` passes."""
    import inspect

    missing = []
    for module_name, names in PRIVATE_NAMES.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            missing.extend(f"{module_name}.{n}" for n in names)
            continue
        for name in names:
            obj: Any = module
            for part in name.split("."):
                obj = getattr(obj, part, None)
            if obj is None:
                missing.append(f"{module_name}.{name}")
    from dagster import DagsterInstance

    params = set(inspect.signature(DagsterInstance.create_run).parameters) - {"self"}
    if params != CREATE_RUN_ARGS:
        missing.append(f"DagsterInstance.create_run(...) arguments now {sorted(params ^ CREATE_RUN_ARGS)} differ")
    return missing


@contextmanager
def location_workspace(instance, workspace_file: str, log_level: str = "WARNING") -> Iterator[Any]:
    """A workspace request context on workspace.yaml, its code servers started for the block
    (`WorkspaceProcessContext`, `WorkspaceFileTarget`). `instance.submit_run` / `launch_run`
    take it."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    with WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[workspace_file]),
                                 code_server_log_level=log_level) as process:
        yield process.create_request_context()


def location_load_error(workspace, location_name: str) -> str | None:
    """Why the location failed to load (None: it loaded), from the same workspace context."""
    if not workspace.has_code_location_error(location_name):
        return None
    return str(workspace.get_code_location_error(location_name))


@dataclass(frozen=True)
class InProcessLocation:
    """A code location loaded in this process, and the origin the code server's location has (the
    one its runs record, so the UI finds their job)."""

    location: Any
    served_origin: Any


@contextmanager
def location_in_process(instance, workspace_file: str, location_name: str) -> Iterator[InProcessLocation]:
    """The location of workspace.yaml loaded in this process, no code server started
    (`InProcessCodeLocationOrigin`). `create_location_run` takes it in place of a workspace."""
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.workspace.load_target import WorkspaceFileTarget

    (origin,) = [o for o in WorkspaceFileTarget(paths=[workspace_file]).create_origins()
                 if o.location_name == location_name]
    with InProcessCodeLocationOrigin(origin.loadable_target_origin, location_name=location_name
                                     ).create_location(instance) as location:
        yield InProcessLocation(location, origin)


def execute_location_run(instance, run) -> None:
    """Execute a created run in this process, as the run worker the code server would start does
    (`recon_job_from_origin`, `core_execute_run`: the job rebuilt from the run's code origin, the
    run's events and status written, a failure recorded on the run, not raised)."""
    from dagster._core.events import EngineEventData
    from dagster._grpc.impl import core_execute_run
    from dagster._utils.hosted_user_process import recon_job_from_origin

    instance.report_engine_event(f"Started in process for run (pid: {os.getpid()}).", run,
                                 EngineEventData.in_process(os.getpid()))
    for _ in core_execute_run(recon_job_from_origin(run.job_code_origin), run, instance, inject_env_vars=True):
        pass


def worker_health(gone: str | None):
    """What a run launcher answers Dagster's run monitoring about a run's process: running, or
    failed for the reason `gone` (`CheckRunHealthResult`, `WorkerStatus`). Run monitoring marks a
    run failed on any answer but running or success."""
    from dagster._core.launcher.base import CheckRunHealthResult, WorkerStatus

    return CheckRunHealthResult(WorkerStatus.RUNNING) if gone is None else CheckRunHealthResult(WorkerStatus.FAILED, gone)


def create_location_run(instance, workspace, location_name: str, job_name: str, run_config: Mapping[str, Any],
                        tags: Mapping[str, str], assets: Collection[str] | None = None):
    """Create (not start) a run of the location's job as the UI's launch does: the code server's
    job snapshot and execution plan, its remote origin, the repository's asset graph
    (`JobSubsetSelector`, `DagsterInstance.create_run`); with `assets`, of those assets only (the
    UI's "Materialize selected"). `workspace` is a workspace request context, or an
    `InProcessLocation` (then the run records the code server's origin)."""
    from dagster import AssetKey, DagsterRunStatus
    from dagster._core.definitions.selector import JobSubsetSelector
    from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin

    if isinstance(workspace, InProcessLocation):
        location, served = workspace.location, workspace.served_origin
    else:
        location, served = workspace.get_code_location(location_name), None
    (repo,) = location.get_repositories().values()
    selection = frozenset(AssetKey(a) for a in assets) if assets is not None else None
    remote_job = location.get_job(JobSubsetSelector(location_name=location_name, repository_name=repo.name,
                                                    job_name=job_name, op_selection=None, asset_selection=selection))
    plan = location.get_execution_plan(remote_job, dict(run_config), step_keys_to_execute=None, known_state=None,
                                       instance=instance)
    return instance.create_run(
        job_name=job_name, run_id=None, run_config=dict(run_config),
        resolved_op_selection=remote_job.resolved_op_selection,
        step_keys_to_execute=plan.execution_plan_snapshot.step_keys_to_execute, op_selection=None,
        status=DagsterRunStatus.NOT_STARTED, root_run_id=None, parent_run_id=None,
        tags={**remote_job.tags, **tags}, job_snapshot=remote_job.job_snapshot,
        execution_plan_snapshot=plan.execution_plan_snapshot, parent_job_snapshot=remote_job.parent_job_snapshot,
        remote_job_origin=(RemoteJobOrigin(RemoteRepositoryOrigin(served, repo.name), job_name) if served
                           else remote_job.get_remote_origin()),
        job_code_origin=remote_job.get_python_origin(),
        asset_selection=selection, asset_check_selection=None, asset_graph=repo.asset_graph,
    )


def code_server_runs(workspace, location_name: str) -> list[str]:
    """Run ids whose processes the location's code server still has (its gRPC client's
    `get_current_runs`, `deserialize_value`). A run's status is final before its process exits."""
    from dagster._serdes import deserialize_value

    location = workspace.get_code_location(location_name)
    return list(deserialize_value(location.client.get_current_runs()).current_runs)
