"""`rag dev` (the Dagster webserver, daemon and code server) started as a subprocess, and a small client for the GraphQL calls
the UI's buttons make (launches through `DagsterGraphQLClient`, the rest as raw queries)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from testkit import free_port

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LOCATION = "rag_pipeline"  # workspace.yaml
REPOSITORY = "__repository__"  # the repository name Dagster gives a `Definitions` object
ASSET_JOB = "__ASSET_JOB"  # the implicit job "Materialize" launches
FINISHED = {"SUCCESS", "FAILURE", "CANCELED"}

_META = """fragment Meta on MetadataEntry { label __typename
  ... on TextMetadataEntry { text } ... on MarkdownMetadataEntry { mdStr }
  ... on IntMetadataEntry { intValue intRepr } ... on FloatMetadataEntry { floatValue }
  ... on BoolMetadataEntry { boolValue } ... on JsonMetadataEntry { jsonString }
  ... on PathMetadataEntry { path } ... on UrlMetadataEntry { url } }"""

_PYERR = "fragment Err on PythonError { message stack }"


def metadata_dict(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """GraphQL metadata entries → {label: value} (markdown as its text, JSON parsed)."""
    out: dict[str, Any] = {}
    for e in entries:
        kind = e["__typename"]
        if kind == "JsonMetadataEntry":
            out[e["label"]] = json.loads(e["jsonString"])
        elif kind == "IntMetadataEntry":
            out[e["label"]] = e["intValue"] if e["intValue"] is not None else int(e["intRepr"])
        else:
            value = next((v for k, v in e.items() if k not in ("label", "__typename")), None)
            out[e["label"]] = value
    return out


def asset_keys_input(names: list[str]) -> list[dict[str, list[str]]]:
    return [{"path": [n]} for n in names]


class DagsterUI:
    """The webserver's GraphQL API at `url` (one code location, `rag_pipeline`)."""

    def __init__(self, port: int):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.url, timeout=60)

    # ---- plumbing ----------------------------------------------------------------------------

    def query(self, text: str, **variables: Any) -> dict[str, Any]:
        """POST a query; the data, or an AssertionError naming the GraphQL errors."""
        r = self.http.post("/graphql", json={"query": text, "variables": variables})
        body = r.json()
        assert not body.get("errors"), f"GraphQL errors: {body['errors']}"
        return body["data"]

    def client(self):
        from dagster_graphql import DagsterGraphQLClient

        return DagsterGraphQLClient("127.0.0.1", port_number=self.port, timeout=60)

    def wait_loaded(self, procs: list[subprocess.Popen], timeout: float) -> None:
        """Until /server_info answers and the code location is loaded (else the load error)."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            for p in procs:
                assert p.poll() is None, f"{p.args[0]} exited with {p.returncode}"
            try:
                if self.http.get("/server_info", timeout=5).status_code == 200:
                    data = self.query("""{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
                        locationOrLoadError { __typename ... on PythonError { message } } } } } }""")
                    entries = data["workspaceOrError"]["locationEntries"]
                    entry = next((e for e in entries if e["name"] == LOCATION), None)
                    if entry and entry["loadStatus"] == "LOADED":
                        error = entry["locationOrLoadError"]
                        assert error and error["__typename"] == "RepositoryLocation", f"code location failed: {error}"
                        return
                    last = f"location: {entry}"
            except (httpx.HTTPError, ValueError) as exc:
                last = repr(exc)
            time.sleep(1)
        raise AssertionError(f"webserver not ready after {timeout:.0f}s ({last})")

    # ---- runs -------------------------------------------------------------------------------

    def launch_assets(self, assets: list[str], partition: str) -> str:
        """What "Materialize selected" on one partition launches: the asset job, partition tag."""
        return self.client().submit_job_execution(
            ASSET_JOB, repository_location_name=LOCATION, repository_name=REPOSITORY, run_config={},
            tags={"dagster/partition": partition}, asset_selection=[[a] for a in assets])

    def run(self, run_id: str) -> dict[str, Any]:
        data = self.query("""query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { runId status jobName
            tags { key value } repositoryOrigin { repositoryLocationName repositoryName }
            assetSelection { path } } } }""", id=run_id)
        run = data["runOrError"]
        assert run["__typename"] == "Run", run
        run["tags"] = {t["key"]: t["value"] for t in run["tags"]}
        return run

    def runs(self, *, tags: dict[str, str] | None = None, job: str | None = None, limit: int = 100) -> list[dict]:
        """Runs, newest first (tags as a dict)."""
        flt: dict[str, Any] = {}
        if tags:
            flt["tags"] = [{"key": k, "value": v} for k, v in tags.items()]
        if job:
            flt["pipelineName"] = job
        data = self.query("""query($f: RunsFilter, $n: Int) { runsOrError(filter: $f, limit: $n) {
            __typename ... on Runs { results { runId status jobName creationTime tags { key value }
            repositoryOrigin { repositoryLocationName } } } } }""", f=flt, n=limit)
        results = data["runsOrError"]["results"]
        for r in results:
            r["tags"] = {t["key"]: t["value"] for t in r["tags"]}
        return results

    def run_events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's event log as the run page shows it: {__typename, message, level, stepKey, error}."""
        data = self.query("""query($id: ID!) { logsForRun(runId: $id, limit: 5000) { __typename
            ... on EventConnection { events { __typename ... on MessageEvent { message level stepKey }
            ... on ExecutionStepFailureEvent { error { message } }
            ... on RunFailureEvent { error { message } } } } } }""", id=run_id)
        return (data["logsForRun"] or {}).get("events") or []

    def run_errors(self, run_id: str) -> str:
        """The run's warnings, errors and step failures, one per line (for failure messages)."""
        lines = []
        for e in self.run_events(run_id):
            if e.get("level") in ("WARNING", "ERROR", "CRITICAL") or e["__typename"] in ("ExecutionStepFailureEvent", "RunFailureEvent"):
                err = (e.get("error") or {}).get("message") or ""
                lines.append(f"[{e.get('stepKey') or '-'}] {e.get('message', '')} {err}".strip())
        return "\n".join(lines[-20:]) or "(no error events)"

    def wait_run(self, run_id: str, timeout: float) -> dict[str, Any]:
        """Until the run finishes; asserts SUCCESS (else its error events)."""
        started = time.monotonic()
        run = self.run(run_id)
        while run["status"] not in FINISHED and time.monotonic() < started + timeout:
            time.sleep(1)
            run = self.run(run_id)
        assert run["status"] == "SUCCESS", (
            f"run {run_id} ({run['jobName']}, tags {run['tags']}) is {run['status']} after "
            f"{time.monotonic() - started:.0f}s (limit {timeout:.0f}s):\n" + self.run_errors(run_id))
        return run

    def launch_multiple(self, params: list[dict[str, Any]]) -> list[str]:
        """`launchMultipleRuns` (a schedule's "Launch all" in the UI); the new run ids."""
        data = self.query("""mutation($p: [ExecutionParams!]!) { launchMultipleRuns(executionParamsList: $p) {
            __typename ... on LaunchMultipleRunsResult { launchMultipleRunsResult { __typename
              ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
              ... on RunConfigValidationInvalid { errors { message } } ... on InvalidSubsetError { message } } }
            ... on PythonError { message } } }""", p=params)
        result = data["launchMultipleRuns"]
        assert result["__typename"] == "LaunchMultipleRunsResult", result
        launched = result["launchMultipleRunsResult"]
        assert all(r["__typename"] == "LaunchRunSuccess" for r in launched), launched
        return [r["run"]["runId"] for r in launched]

    # ---- backfills --------------------------------------------------------------------------

    def launch_backfill(self, assets: list[str], partitions: list[str]) -> str:
        """`launchPartitionBackfill` as the partitions dialog sends it for the asset job."""
        data = self.query(f"""mutation($p: LaunchBackfillParams!) {{ launchPartitionBackfill(backfillParams: $p) {{
            __typename ... on LaunchBackfillSuccess {{ backfillId }} ... on PythonError {{ ...Err }}
            ... on InvalidSubsetError {{ message }} ... on PartitionSetNotFoundError {{ message }} }} }} {_PYERR}""",
                          p={"assetSelection": asset_keys_input(assets), "partitionNames": partitions,
                             "fromFailure": False, "tags": []})
        result = data["launchPartitionBackfill"]
        assert result["__typename"] == "LaunchBackfillSuccess", result
        return result["backfillId"]

    def backfill(self, backfill_id: str) -> dict[str, Any]:
        data = self.query(f"""query($id: String!) {{ partitionBackfillOrError(backfillId: $id) {{ __typename
            ... on PartitionBackfill {{ id status numPartitions error {{ ...Err }}
              runs {{ runId status tags {{ key value }} }} }} }} }} {_PYERR}""", id=backfill_id)
        return data["partitionBackfillOrError"]

    def wait_backfill(self, backfill_id: str, timeout: float) -> dict[str, Any]:
        """Until the backfill is no longer REQUESTED; asserts it completed and every run succeeded."""
        deadline = time.monotonic() + timeout
        bf = self.backfill(backfill_id)
        while bf["status"] in ("REQUESTED", "CANCELING", "FAILING") and time.monotonic() < deadline:
            time.sleep(2)
            bf = self.backfill(backfill_id)
        bad = [r for r in bf["runs"] if r["status"] != "SUCCESS"]
        assert bf["status"] in ("COMPLETED", "COMPLETED_SUCCESS") and not bad, (
            f"backfill {backfill_id} is {bf['status']} after {timeout:.0f}s, error {bf.get('error')}; runs "
            + "; ".join(f"{r['runId']} {r['status']}:\n{self.run_errors(r['runId'])}" for r in bad or bf["runs"]))
        return bf

    # ---- assets and checks ------------------------------------------------------------------

    def partition_keys(self, asset: str) -> list[str]:
        data = self.query("""query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) {
            ... on AssetNode { partitionKeys } } }""", k={"path": [asset]})
        return data["assetNodeOrError"]["partitionKeys"]

    def materializations(self, asset: str, partition: str | None = None, limit: int = 1) -> list[dict[str, Any]]:
        """Newest first: {runId, partition, timestamp, metadata: {label: value}}."""
        data = self.query(f"""query($k: AssetKeyInput!, $p: [String!], $n: Int) {{ assetNodeOrError(assetKey: $k) {{
            ... on AssetNode {{ assetMaterializations(partitions: $p, limit: $n) {{ runId partition timestamp
              metadataEntries {{ ...Meta }} }} }} }} }} {_META}""",
                          k={"path": [asset]}, p=[partition] if partition else None, n=limit)
        mats = data["assetNodeOrError"]["assetMaterializations"]
        for m in mats:
            m["metadata"] = metadata_dict(m.pop("metadataEntries"))
        return mats

    def checks(self, asset: str) -> dict[str, dict[str, Any]]:
        """name → {status, blocking, evaluation: {success, severity, description, metadata}} of the
        check's execution for the asset's latest materialization."""
        data = self.query(f"""query($k: AssetKeyInput!) {{ assetNodeOrError(assetKey: $k) {{ ... on AssetNode {{
            assetChecksOrError {{ __typename ... on AssetChecks {{ checks {{ name blocking
              executionForLatestMaterialization {{ runId status evaluation {{ success severity description
                metadataEntries {{ ...Meta }} }} }} }} }} }} }} }} }} {_META}""", k={"path": [asset]})
        found = data["assetNodeOrError"]["assetChecksOrError"]
        assert found["__typename"] == "AssetChecks", found
        out = {}
        for c in found["checks"]:
            ex = c["executionForLatestMaterialization"] or {}
            ev = ex.get("evaluation")
            if ev:
                ev["metadata"] = metadata_dict(ev.pop("metadataEntries"))
            out[c["name"]] = {"status": ex.get("status"), "runId": ex.get("runId"), "blocking": c["blocking"],
                              "evaluation": ev}
        return out

    # ---- sensors and schedules --------------------------------------------------------------

    def sensor_ticks(self, name: str, limit: int = 5) -> list[dict[str, Any]]:
        data = self.query("""query($s: SensorSelector!, $n: Int) { sensorOrError(sensorSelector: $s) { __typename
            ... on Sensor { sensorState { status ticks(limit: $n) { status timestamp skipReason runIds
              error { message } } } } } }""",
                          s={"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": name},
                          n=limit)
        return data["sensorOrError"]["sensorState"]["ticks"]

    def schedule_dry_run(self, name: str, timestamp: float) -> dict[str, Any]:
        """`scheduleDryRun` ("Test schedule" → "Evaluate"): the tick's evaluation result."""
        data = self.query(f"""mutation($s: ScheduleSelector!, $t: Float) {{ scheduleDryRun(selectorData: $s, timestamp: $t) {{
            __typename ... on DryRunInstigationTick {{ timestamp evaluationResult {{ skipReason error {{ ...Err }}
              runRequests {{ runKey jobName runConfigYaml tags {{ key value }} assetSelection {{ path }} }} }} }}
            ... on PythonError {{ ...Err }} ... on ScheduleNotFoundError {{ scheduleName }} }} }} {_PYERR}""",
                          s={"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "scheduleName": name},
                          t=timestamp)
        tick = data["scheduleDryRun"]
        assert tick["__typename"] == "DryRunInstigationTick", tick
        result = tick["evaluationResult"]
        assert result and not result["error"], f"{name} failed: {result and result['error']}"
        return result

    @staticmethod
    def schedule_launch_params(run_requests: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
        """The execution params the UI builds from a dry run's run requests ("Launch all")."""
        return [{
            "runConfigData": r["runConfigYaml"] or "{}",
            "selector": {"jobName": r["jobName"] or job, "repositoryLocationName": LOCATION,
                         "repositoryName": REPOSITORY, "assetSelection": [], "assetCheckSelection": []},
            "mode": "default",
            "executionMetadata": {"tags": [{"key": t["key"], "value": t["value"]} for t in r["tags"]]},
        } for r in run_requests]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group we started (the server, its code server, run workers), then SIGKILL
    what is left of it: a code server or run worker may outlive its parent's graceful exit."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=20)
    time.sleep(1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@dataclass
class RunningDev:
    """A `rag dev` process (UI, daemon and code server of `dagster dev`) and the client of its UI."""

    ui: DagsterUI
    proc: subprocess.Popen
    log: Path


@contextlib.contextmanager
def running_rag_dev(env: dict[str, str], cwd: Path, log: Path, timeout: float = 180) -> Iterator[RunningDev]:
    """`rag dev` on a free loopback port as an operator starts it in the background (its own
    process group, SIGINT ignored), stopped with everything it started on exit; output to `log`."""
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(BIN / "rag"), "dev", "--port", str(port)], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        ui = DagsterUI(port)
        ui.wait_loaded([proc], timeout)
        yield RunningDev(ui, proc, log)
    finally:
        _stop(proc)
