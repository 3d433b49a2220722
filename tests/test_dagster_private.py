"""The Dagster names outside its public API that pipelines/dagster_private.py uses, checked against
the installed Dagster: an upgrade that renames or reshapes one fails here, naming it. Each
function is exercised for real on a Postgres-backed instance and the code location's code server."""

from __future__ import annotations

import ast
from pathlib import Path

import dagster
import pytest

from pipelines import dagster_private
from pipelines.partitions import CORPUS_FILES, RANGE_END_TAG, RANGE_START_TAG
from pipelines.launch import LOCATION

REPO = Path(__file__).resolve().parents[1]
KEYS = ["corpus/a.md", "corpus/b.md", "corpus/c.md"]
# A named tuple's documented methods (Dagster's event records are named tuples): public, not private.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}


def test_every_private_name_resolves_on_the_installed_dagster():
    missing = dagster_private.check_names()
    assert not missing, f"dagster {dagster.__version__} changed what pipelines/dagster_private.py uses: {missing}"


def test_no_other_module_uses_a_private_dagster_name():
    """`dagster._…` imports and patches of Dagster objects live in dagster_private.py only."""
    offenders = []
    for path in sorted((REPO / "pipelines").glob("*.py")):
        if path.name == "dagster_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dagster._"):
                offenders.append(f"{path.name}:{node.lineno} from {node.module}")
            elif isinstance(node, ast.Import) and any(a.name.startswith("dagster._") for a in node.names):
                offenders.append(f"{path.name}:{node.lineno} import")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and node.attr not in NAMEDTUPLE_API \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                offenders.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert not offenders, offenders


@pytest.fixture
def workspace(pg_instance):
    """The code location's workspace on a Postgres-backed instance (its code server started)."""
    from pipelines.instance import WORKSPACE_YAML

    pg_instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
    with dagster_private.location_workspace(pg_instance, str(WORKSPACE_YAML)) as workspace:
        yield pg_instance, workspace


@pytest.mark.subprocess
@pytest.mark.slow
def test_the_workspace_loads_the_location_and_creates_its_runs_as_the_ui_does(workspace):
    instance, ws = workspace
    # location_workspace + location_load_error: the code server serves the location
    assert dagster_private.location_load_error(ws, LOCATION) is None

    # create_location_run: a run of the location's job, with its remote origin (the job page, re-execute)
    run = dagster_private.create_location_run(instance, ws, LOCATION, "ingest_files", {},
                                              {RANGE_START_TAG: KEYS[0], RANGE_END_TAG: KEYS[-1], "rag/trigger": "t"})
    stored = instance.get_run_by_id(run.run_id)
    assert stored.status == dagster.DagsterRunStatus.NOT_STARTED and stored.job_name == "ingest_files"
    assert stored.remote_job_origin is not None
    assert stored.remote_job_origin.location_name == LOCATION
    assert stored.tags[RANGE_START_TAG] == KEYS[0] and stored.tags["rag/trigger"] == "t"
    assert "raw_documents" in stored.step_keys_to_execute and stored.execution_plan_snapshot_id

    # code_server_runs: nothing launched, nothing running
    assert dagster_private.code_server_runs(ws, LOCATION) == []


def test_daemon_health_from_heartbeats_agrees_with_dagsters_daemon_status():
    """`daemon_running` reads the instance's heartbeats (public methods) where it used Dagster's
    private `get_daemon_statuses`; both judge the same at every age of the last heartbeat. The
    private names here are the test's own: what the daemon writes, and Dagster's rule."""
    from dagster import instance_for_test
    from dagster._daemon.controller import get_daemon_statuses
    from dagster._daemon.types import DaemonHeartbeat
    from dagster_shared.error import SerializableErrorInfo

    from pipelines.launch import QUEUE_DAEMON, daemon_running

    queued = {"run_coordinator": {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator"}}
    with instance_for_test(overrides=queued) as instance:
        assert daemon_running(instance) is False  # no heartbeat yet
        error = SerializableErrorInfo("a logged error", [], "Exception")
        instance.add_daemon_heartbeat(DaemonHeartbeat(1_000_000.0, QUEUE_DAEMON, None, [error]))
        for age in (0, 29, 31, 1_829, 1_831, 5_000):
            now = 1_000_000.0 + age
            dagsters = get_daemon_statuses(instance, [QUEUE_DAEMON], curr_time_seconds=now,
                                           ignore_errors=True)[QUEUE_DAEMON].healthy
            assert daemon_running(instance, now=now) == dagsters, age
    with instance_for_test() as instance:  # runs are launched directly: no queue daemon to wait for
        assert daemon_running(instance) is False


@pytest.mark.slow
def test_a_run_created_and_executed_in_process_is_the_locations_run(pg_instance, database_url):
    """location_in_process + create_location_run + execute_location_run: a run of the location's
    job executed in this process (no code server, no run worker) records the origin the code
    server's runs record (the UI finds its job page and can re-execute it) and finishes."""
    import os

    from dagster._core.workspace.load_target import WorkspaceFileTarget  # the code server's origin

    from pipelines.instance import WORKSPACE_YAML
    from pipelines.launch import runs_in_process

    assert runs_in_process(pg_instance, parallel=1)  # no queue daemon, Dagster's default launcher
    assert not runs_in_process(pg_instance, parallel=2)  # runs at once need their own processes
    served = [o for o in WorkspaceFileTarget(paths=[str(WORKSPACE_YAML)]).create_origins() if o.location_name == LOCATION]
    config = {"resources": {"rag": {"config": {"database_url": database_url}}}}
    with dagster_private.location_in_process(pg_instance, str(WORKSPACE_YAML), LOCATION) as location:
        run = dagster_private.create_location_run(pg_instance, location, LOCATION, "index_maintenance", config,
                                                  {"rag/trigger": "t"})
        dagster_private.execute_location_run(pg_instance, run)
    stored = pg_instance.get_run_by_id(run.run_id)
    assert stored.status == dagster.DagsterRunStatus.SUCCESS, stored.status
    assert stored.remote_job_origin.repository_origin.code_location_origin == served[0]
    assert stored.remote_job_origin.repository_origin.repository_name == "__repository__"
    assert stored.tags["rag/trigger"] == "t"
    engine = [e.message for e in pg_instance.all_logs(run.run_id, of_type=dagster.DagsterEventType.ENGINE_EVENT)]
    assert f"Started in process for run (pid: {os.getpid()})." in engine
