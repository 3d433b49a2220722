"""The operator's path, through the Dagster webserver's GraphQL API (what the UI's buttons call):
`make demo` (`rag materialize` over a copy of the demo corpus), then the webserver and daemon of
`rag dev`; one partition, a backfill of all, the running corpus sensor on new / changed / deleted
files, the schedules launched as "Test schedule" → "Launch all" does, and what the asset and
check pages show. One webserver for the module; every wait is bounded."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from pipelines.instance import DAGSTER_YAML, sqlalchemy_url
from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from conftest import DEMO_CORPUS
from dagster_ui import ASSET_JOB, BIN, LOCATION, REPO, DagsterUI, RunningDev, running_rag_dev

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

PARTITIONED = ["raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table"]
ALL_ASSETS = PARTITIONED + ["hnsw_index"]
RUN_TIMEOUT = 360  # one run: a process that imports the code location and loads the model (slow on a busy 2-core box)
SENSOR_TIMEOUT = 360  # a sensor tick (every 5 s here) plus the run it requests


def _new_database(admin_url: str, prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


class Operator:
    """What a test needs: the UI's API, the corpus root the demo ingested, the library over it."""

    def __init__(self, dev: RunningDev, root: Path, kb: KnowledgeBase):
        self.dev, self.ui, self.root, self.kb = dev, dev.ui, root, kb

    def key_for(self, rel: str) -> str:
        """The partition key of a file (whatever prefix the code location gives it)."""
        keys = self.ui.partition_keys("raw_documents")
        found = [k for k in keys if k == rel or k.endswith("/" + rel)]
        assert found, f"no partition for {rel} among {keys}"
        return found[0]

    def paths(self) -> set[str]:
        return {d["path"] for d in self.kb.list_documents()}

    def explain(self) -> str:
        """The sensor's last ticks and the newest runs, for a failure message."""
        ticks = self.ui.sensor_ticks("corpus_sensor", 5)
        runs = self.ui.runs(limit=5)
        return ("corpus_sensor ticks: " + "; ".join(
            f"{t['status']} {t['skipReason'] or ''} {(t['error'] or {}).get('message', '')[:300]} runs={t['runIds']}"
            for t in ticks) + "\nruns: " + "; ".join(f"{r['runId'][:8]} {r['jobName']} {r['status']}" for r in runs))

    def wait_for(self, what: str, predicate, timeout: float = SENSOR_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(2)
        raise AssertionError(f"{what}: not within {timeout:.0f}s\n{self.explain()}")


@pytest.fixture(scope="module")
def operator(pg_server: str, provider, tmp_path_factory):
    """`make demo` on a copy of the demo corpus, then `rag dev` over it (UI, daemon, code server)."""
    base = tmp_path_factory.mktemp("operator")
    root = base / "corpus"
    shutil.copytree(DEMO_CORPUS, root)
    lib_url = pg_server.replace("/postgres?", f"/{_new_database(pg_server, 'ui_rag')}?", 1)
    home = base / ".rag"
    dagster_home = home / "dagster_home"  # where `rag materialize` / `rag dev` put it
    dagster_home.mkdir(parents=True)
    shutil.copyfile(DAGSTER_YAML, dagster_home / "dagster.yaml")
    (base / "rag.yaml").write_text("{}\n")
    env = {
        **os.environ,
        "RAG_DATABASE_URL": lib_url,
        "RAG_HOME": str(home),
        "RAG_CONFIG": str(base / "rag.yaml"),  # empty: nothing from a developer's rag.yaml
        "RAG_PIPELINE__SENSOR_INTERVAL_SECONDS": "5",
        "DAGSTER_HOME": str(dagster_home),
        "DAGSTER_PG_URL": sqlalchemy_url(pg_server, _new_database(pg_server, "ui_dagster")),
        "DAGSTER_DISABLE_TELEMETRY": "1",
        "PYTHONPATH": str(REPO),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    demo = subprocess.run([str(BIN / "rag"), "materialize", str(root)], cwd=base, env=env,
                          capture_output=True, text=True, timeout=600)
    assert demo.returncode == 0, f"rag materialize failed:\n{demo.stdout}\n{demo.stderr}"
    kb = KnowledgeBase(Settings(database_url=lib_url, home=home), provider=provider)
    try:
        with running_rag_dev(env, base, base / "dev.log", timeout=RUN_TIMEOUT) as dev:
            yield Operator(dev, root, kb)
    finally:
        kb.close()


def test_demo_runs_are_the_code_locations(operator: Operator):
    """The demo's runs belong to the code location: they show on the job page and the timeline."""
    ui = operator.ui
    runs = ui.runs(job="ingest_files")
    assert runs, "the ingest_files job page shows no runs after `rag materialize`"
    for run in runs:
        origin = run["repositoryOrigin"] or {}
        assert origin.get("repositoryLocationName") == LOCATION, f"run {run['runId']} has no code location: {run}"


def test_materialize_one_partition(operator: Operator):
    """(a) "Materialize selected" on one partition: the asset job, partition tag, five assets."""
    ui = operator.ui
    key = operator.key_for("notes/stop-loss-checklist.md")
    run_id = ui.launch_assets(PARTITIONED, key)
    run = ui.wait_run(run_id, RUN_TIMEOUT)
    assert run["jobName"] == ASSET_JOB and run["tags"]["dagster/partition"] == key
    assert run["repositoryOrigin"]["repositoryLocationName"] == LOCATION
    # one process for the whole run, as `rag materialize`'s runs: not a process per step
    spawned = [e["stepKey"] for e in ui.run_events(run_id) if "subprocess" in (e.get("message") or "")]
    assert not spawned, f"the UI's asset job started a process per step: {spawned}"
    for asset in PARTITIONED:
        latest = ui.materializations(asset, key)
        assert latest and latest[0]["runId"] == run_id, f"{asset}[{key}] not materialized by {run_id}: {latest}"
        assert latest[0]["metadata"].get("status") in ("ok", "unchanged"), latest[0]["metadata"]


def test_backfill_all_partitions(operator: Operator):
    """(b) "Materialize all partitions": a backfill of every partition runs as one run per range."""
    ui = operator.ui
    keys = ui.partition_keys("raw_documents")
    assert len(keys) >= 15, keys
    backfill = ui.wait_backfill(ui.launch_backfill(PARTITIONED, keys), 480)
    runs = backfill["runs"]
    assert len(runs) == 1, f"expected one run for the one range of {len(keys)} partitions, got {runs}"
    tags = {t["key"]: t["value"] for t in runs[0]["tags"]}
    assert (tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")) == (
        keys[0], keys[-1]), tags
    statuses = {}
    for key in keys:
        latest = ui.materializations("vector_table", key)
        assert latest and latest[0]["runId"] == runs[0]["runId"], f"vector_table[{key}]: {latest}"
        statuses[key] = latest[0]["metadata"].get("status")
    # a many-file run goes on past a failed file: the run succeeds, the file's status says failed
    failed = {k: s for k, s in statuses.items() if s not in ("ok", "unchanged", "skipped", "upstream_skipped")}
    assert not failed, f"files not published by the backfill: {failed}\n" + ui.run_errors(runs[0]["runId"])


PROBE = "notes/sensor-probe.md"


def _probe_text(word: str) -> str:
    return (f"# Sensor probe\n\n## Setup\n\nThe {word} setup: a pullback to the rising 20-day average with "
            f"volume drying up, entered on the first higher low.\n\n## Risk\n\nStop below the swing low; "
            f"size so that one {word} loss costs at most half a percent of equity.\n")


def _found(kb: KnowledgeBase, word: str) -> bool:
    return any(h.path == PROBE for h in kb.search(word, mode="lexical", top_k=5).hits)


def test_sensor_follows_new_changed_deleted_files(operator: Operator):
    """(c) The running corpus sensor: a new file is materialized, a changed one re-materialized,
    a deleted one loses its rows and its partition."""
    ui, kb = operator.ui, operator.kb
    probe = operator.root / PROBE
    probe.write_text(_probe_text("quokkaprobe"))
    operator.wait_for("new file searchable", lambda: PROBE in operator.paths() and _found(kb, "quokkaprobe"))
    key = operator.key_for(PROBE)
    # A run publishes its files in its first step (the stages overlap) and records vector_table's
    # materialization in that asset's own step, later: searchable comes first.
    first = operator.wait_for(f"a vector_table materialization for {key}",
                              lambda: ui.materializations("vector_table", key))
    run = ui.wait_run(first[0]["runId"], RUN_TIMEOUT)  # its checks run after vector_table
    assert run["repositoryOrigin"]["repositoryLocationName"] == LOCATION, run

    probe.write_text(_probe_text("wombatprobe"))
    operator.wait_for("changed file re-materialized",
                      lambda: _found(kb, "wombatprobe") and not _found(kb, "quokkaprobe"))
    latest = operator.wait_for("a new vector_table materialization",
                               lambda: [m for m in ui.materializations("vector_table", key)
                                        if m["runId"] != first[0]["runId"]])
    assert latest[0]["metadata"].get("status") == "ok", latest[0]["metadata"]

    probe.unlink()
    operator.wait_for("deleted file's partition gone", lambda: key not in ui.partition_keys("raw_documents"))
    assert PROBE not in operator.paths()
    assert not _found(kb, "wombatprobe")


def _set_sensor(ui: DagsterUI, running: bool) -> None:
    """The sensor's toggle in the UI (`startSensor` / `stopSensor`)."""
    sel = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "sensorName": "corpus_sensor"}
    state = ui.query("""query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) { ... on Sensor {
        id sensorState { id selectorId status } } } }""", s=sel)["sensorOrError"]
    if running:
        ui.query("mutation($s: SensorSelector!) { startSensor(sensorSelector: $s) { __typename } }", s=sel)
    else:
        ui.query("""mutation($o: String!, $i: String!) { stopSensor(id: $o, jobSelectorId: $i) { __typename } }""",
                 o=state["sensorState"]["id"], i=state["sensorState"]["selectorId"])


def _launch_schedule(ui: DagsterUI, name: str, job: str) -> list[dict]:
    """"Test schedule" → "Evaluate" → "Launch all": the runs, finished and successful."""
    result = ui.schedule_dry_run(name, time.time())
    assert result["runRequests"], f"{name} requested no runs: {result['skipReason']}"
    run_ids = ui.launch_multiple(ui.schedule_launch_params(result["runRequests"], job))
    return [ui.wait_run(r, RUN_TIMEOUT) for r in run_ids]


def _age_vectors(kb: KnowledgeBase, rel: str) -> None:
    """Make one file's published vectors look made under an older embedding configuration."""
    with psycopg.connect(kb.settings.database_url, autocommit=True) as conn:
        n = conn.execute("UPDATE rag_stage_outputs SET payload = jsonb_set(payload, '{fingerprint}', '\"older\"')"
                         " WHERE stage = 'vector_table' AND path = %s", (rel,)).rowcount
    assert n == 1, f"no published stage row for {rel}"


def test_schedules_launched_from_the_ui(operator: Operator):
    """(d) nightly_reconcile materializes a file the sensor never saw; reembed_schedule re-embeds
    only files whose vectors are stale, and skips when all are current."""
    ui, kb = operator.ui, operator.kb
    _set_sensor(ui, running=False)  # so only the schedule can pick the new file up
    try:
        rel = "notes/reconcile-probe.md"
        (operator.root / rel).write_text(_probe_text("narwhalprobe").replace("Sensor probe", "Reconcile probe"))
        runs = _launch_schedule(ui, "nightly_reconcile", "ingest_files")
        assert all(r["jobName"] == "ingest_files" and r["tags"].get("rag/trigger") == "nightly_reconcile" for r in runs)
        assert rel in operator.paths(), "nightly_reconcile did not ingest the new file"
        assert operator.key_for(rel)

        skipped = ui.schedule_dry_run("reembed_schedule", time.time())
        assert not skipped["runRequests"] and "current" in (skipped["skipReason"] or ""), skipped

        _age_vectors(kb, "notes/stop-loss-checklist.md")
        runs = _launch_schedule(ui, "reembed_schedule", "reembed")
        assert [r["jobName"] for r in runs] == ["reembed"], runs
        tags = runs[0]["tags"]
        key = operator.key_for("notes/stop-loss-checklist.md")
        assert (tags.get("dagster/asset_partition_range_start"), tags.get("dagster/asset_partition_range_end")) == (
            key, key), tags
        again = ui.schedule_dry_run("reembed_schedule", time.time())
        assert not again["runRequests"], f"still stale after the re-embed run: {again}"
    finally:
        _set_sensor(ui, running=True)


def test_assets_and_checks_show_their_metadata(operator: Operator):
    """(e) Every asset's latest materialization carries its metadata; check results are readable."""
    ui = operator.ui
    key = operator.key_for("knowledge/analysis/stock/NVDA_20260112T0930.yaml")
    for asset in PARTITIONED:
        latest = ui.materializations(asset, key)
        assert latest, f"{asset}[{key}] never materialized"
        assert "status" in latest[0]["metadata"], (asset, latest[0]["metadata"])
    chunk_meta = ui.materializations("chunks", key)[0]["metadata"]
    assert "chunk_size_histogram" in chunk_meta and "preview" in chunk_meta, chunk_meta
    assert "tokens" in chunk_meta["preview"] and chunk_meta["chunk_size_histogram"].strip(), chunk_meta
    index = ui.materializations("hnsw_index")
    assert index and index[0]["metadata"].get("valid") is True and index[0]["metadata"].get("rows_at_last_build", 0) > 0, index
    assert index[0]["metadata"]["rows"] >= index[0]["metadata"]["rows_at_last_build"], index
    expected = {"raw_documents": {"skipped_inputs", "metadata_warnings"}, "chunks": {"chunk_sizes"},
                "embeddings": {"embeddings_valid"},
                "vector_table": {"vector_table_orphans", "failed_files"}, "hnsw_index": {"hnsw_recall", "retrieval_quality"}}
    for asset, names in expected.items():
        checks = ui.checks(asset)
        assert names <= set(checks), (asset, checks)
        for name in names:
            ev = checks[name]["evaluation"]
            assert ev is not None, f"{asset}.{name} has no result: {checks[name]}"
            assert ev["metadata"].get("summary"), (name, ev)
            if name != "skipped_inputs":  # the demo has a malformed file and a template: a warning
                assert ev["success"], (name, ev)
    assert checks_have_skips(ui)


def checks_have_skips(ui: DagsterUI) -> bool:
    """The demo's malformed YAML and template show up in the skipped-inputs check (a warning)."""
    ev = ui.checks("raw_documents")["skipped_inputs"]["evaluation"]
    return ev["severity"] == "WARN" and not ev["success"]


# Last in the module: it stops the module's `rag dev`.
def test_rag_dev_stops_on_sigterm(operator: Operator):
    """`rag dev` under a supervisor or started as a background job (SIGINT ignored): SIGTERM stops
    the UI, the daemon and everything they started, and nothing is left of its process group."""
    proc = operator.dev.proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break  # the whole group is gone: UI, daemon, code servers
        time.sleep(0.5)
    else:
        raise AssertionError("processes of `rag dev` outlived it:\n" + operator.dev.log.read_text()[-3000:])
    assert "Dagster services shut down" in operator.dev.log.read_text()
