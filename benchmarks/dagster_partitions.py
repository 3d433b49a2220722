"""Dagster at many files: one dynamic partition per file (pipelines/partitions.py), measured at
`--files` generated files. Small real YAML: the shared corpus's YAML files under 8 kB, copied in
turn with a comment naming the copy (so every file has its own hash), 1,000 per folder.

Measured, in order, against the product's Postgres-backed instance (dagster.yaml, its event log
storage) on a throwaway embedded server:

1. partition registration (`register_partitions`, what `rag materialize` does first: walk the
   root, add every key);
2. the corpus sensor's first tick (no cursor: hashes every file, plans runs), an idle tick and a
   tick after 10 files changed, evaluated in this process as the daemon's sensor evaluation does;
3. materializing one partition as the UI or a daemon launches it (code server, run worker, the
   local model loaded in the worker: the only files encoded in the whole benchmark, so encoding
   cost stays out of every other figure), then another one as `rag materialize` runs it without a
   daemon (in this process, no code server: `pipelines.launch.runs_in_process`; the model loads
   here);
4. the webserver (`dagster-webserver -w workspace.yaml`, no daemon: the running sensor would start
   real runs) and the GraphQL queries the UI issues on the asset page (AssetViewDefinitionQuery,
   trimmed to its own fields) and for the partition status bar and list (PartitionHealthQuery,
   FullPartitionsQuery, copied from the UI's source), first and second call;
5. a backfill of every partition as the UI's dialog launches it (`launchPartitionBackfill`;
   without a daemon nothing runs) and the single run such a backfill creates (`BackfillPolicy.
   single_run`: a run over the whole key range, created but not launched, as `rag materialize`
   creates it);
6. that run reported failed before it did anything (what the daemon's run monitoring reports when
   a run's worker died), and the partition status bar's query after it (how many files it shows
   failed: every one, as Dagster shows a failed run's unmaterialized partitions).

Prints one JSON line (seconds per step, the load average before and after).

    nice -n 10 .venv/bin/python benchmarks/dagster_partitions.py --files 10000
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
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
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PARTITIONED = ["raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table"]
LOCATION = "rag_pipeline"

# The UI's own queries (dagster-webserver's bundled app source), AssetViewDefinitionQuery without
# its nested display fragments.
PARTITION_HEALTH = """query PartitionHealthQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) { ... on AssetNode { id
    partitionKeysByDimension { name type partitionKeys }
    assetPartitionStatuses {
      ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
      ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
      ... on MultiPartitionStatuses { primaryDimensionName ranges { primaryDimStartKey primaryDimEndKey
        primaryDimStartTime primaryDimEndTime secondaryDim {
          ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
          ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions } } } } } } } }"""
FULL_PARTITIONS = """query FullPartitionsQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) { ... on AssetNode { id partitionKeysByDimension { name type partitionKeys } } } }"""
ASSET_VIEW = """query AssetViewDefinitionQuery($assetKey: AssetKeyInput!) {
  assetOrError(assetKey: $assetKey) { ... on Asset { id key { path } hasDefinitionOrRecord
    assetMaterializations(limit: 1) { timestamp runId }
    definition { id groupName isExecutable
      partitionDefinition { description dimensionTypes { type dynamicPartitionsDefinitionName } }
      partitionKeysByDimension { name } backfillPolicy { description }
      repository { id name location { id name } } } } } }"""
BACKFILL = """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message }
  ... on InvalidSubsetError { message } ... on PartitionSetNotFoundError { message } } }"""


def templates(corpus: Path) -> list[str]:
    found = sorted(p for p in corpus.rglob("*.yaml") if p.stat().st_size < 8192)
    if not found:
        raise SystemExit(f"no YAML files under 8 kB in {corpus} (--corpus)")
    return [p.read_text(encoding="utf-8") for p in found]


def make_tree(root: Path, n: int, shapes: list[str]) -> None:
    for i in range(n):
        folder = root / f"d{i // 1000:03d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True, exist_ok=True)
        (folder / f"doc_{i:06d}.yaml").write_text(f"{shapes[i % len(shapes)]}\n# generated copy {i}\n",
                                                 encoding="utf-8")


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, round(time.perf_counter() - t, 3)


def progress(out: dict) -> None:
    """The figures so far on stderr: a long run stopped midway still leaves them."""
    print(f"progress: {json.dumps(out)}", file=sys.stderr, flush=True)


def planned_events(instance, run_id: str) -> list:
    from dagster import DagsterEventType

    return instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                                        limit=10_000_000).records


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sensor_ticks(instance, rag, root: Path, n: int) -> dict:
    from dagster import build_sensor_context

    from pipelines.sensors import corpus_sensor

    def tick(cursor):
        with build_sensor_context(instance=instance, cursor=cursor, resources={"rag": rag}) as ctx:
            return timed(corpus_sensor, ctx)

    out: dict = {}
    first, out["sensor_first_tick_seconds"] = tick(None)
    out["sensor_first_tick_runs"] = len(first.run_requests or [])
    out["sensor_cursor_bytes"] = len(first.cursor or "")
    for req in first.dynamic_partitions_requests or []:  # none expected: registration came first
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    idle, out["sensor_idle_tick_seconds"] = tick(first.cursor)
    step = max(1, n // 10)
    for i in range(0, n, step):  # ten changed files
        path = root / f"d{i // 1000:03d}" / f"doc_{i:06d}.yaml"
        path.write_text(path.read_text(encoding="utf-8") + "# changed\n", encoding="utf-8")
    changed, out["sensor_change_tick_seconds"] = tick(idle.cursor)
    out["sensor_change_tick_runs"] = len(changed.run_requests or [])
    position = {k: i for i, k in enumerate(instance.get_dynamic_partitions("corpus_files"))}
    out["sensor_change_tick_keys_covered"] = sum(  # partitions its runs cover: 10 when only the changed ones
        position[r.tags["dagster/asset_partition_range_end"]] - position[r.tags["dagster/asset_partition_range_start"]] + 1
        for r in changed.run_requests or [])
    return out


class Webserver:
    """`dagster-webserver -w workspace.yaml` on a free loopback port (no daemon)."""

    def __init__(self, log: Path):
        import httpx

        self.port = free_port()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("dagster-webserver")), "-w", "workspace.yaml", "-h", "127.0.0.1",
                 "-p", str(self.port)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=600)
        self.log = log

    def query(self, text: str, **variables) -> dict:
        r = self.http.post("/graphql", json={"query": text, "variables": variables})
        body = r.json()
        if body.get("errors"):
            raise RuntimeError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def wait_loaded(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dagster-webserver exited {self.proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                if self.http.get("/server_info", timeout=5).status_code == 200:
                    data = self.query("{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus "
                                      "locationOrLoadError { __typename ... on PythonError { message } } } } } }")
                    entry = next((e for e in data["workspaceOrError"]["locationEntries"] if e["name"] == LOCATION), None)
                    if entry and entry["loadStatus"] == "LOADED":
                        if entry["locationOrLoadError"]["__typename"] != "RepositoryLocation":
                            raise RuntimeError(f"code location failed: {entry['locationOrLoadError']}")
                        return
            except Exception as exc:  # noqa: BLE001 (not up yet: retried until the deadline)
                if isinstance(exc, RuntimeError):
                    raise
            time.sleep(1)
        raise RuntimeError(f"webserver not ready after {timeout:.0f}s")

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def ui_queries(web: Webserver, keys: list[str]) -> dict:
    out: dict = {}
    asset = {"path": ["vector_table"]}
    for name, text in (("asset_view", ASSET_VIEW), ("partition_health", PARTITION_HEALTH),
                       ("full_partitions", FULL_PARTITIONS)):
        seconds = []
        for _ in range(2):
            data, s = timed(web.query, text, assetKey=asset)
            seconds.append(s)
        out[f"ui_{name}_seconds"] = seconds
    node = data["assetNodeOrError"]
    out["ui_partition_keys_returned"] = len(node["partitionKeysByDimension"][0]["partitionKeys"])
    data, out["ui_backfill_all_seconds"] = timed(web.query, BACKFILL, p={
        "assetSelection": [{"path": [a]} for a in PARTITIONED], "partitionNames": keys,
        "fromFailure": False, "tags": []})
    result = data["launchPartitionBackfill"]
    if result["__typename"] != "LaunchBackfillSuccess":
        raise RuntimeError(f"backfill of {len(keys)} partitions failed: {result}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=10_000, help="generated files (partitions)")
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"),
                        help="where the YAML shapes come from")
    args = parser.parse_args()

    import psycopg

    from rag_lib.api import KnowledgeBase
    from rag_lib.config import Settings
    from rag_lib.db import start_embedded, stop_embedded
    from rag_lib.models import CorpusRoot

    shapes = templates(Path(args.corpus).resolve())
    out: dict = {"files": args.files, "load_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        admin = start_embedded(tmp / "pgdata")
        web = None
        try:
            from pipelines.instance import get_instance, sqlalchemy_url
            from pipelines.launch import (launch_runs, location_in_process, location_workspace, register_partitions,
                                         wait_for_run)
            from pipelines.partitions import CORPUS_FILES, range_tags
            from pipelines.resources import RagResource
            from pipelines import dagster_private

            names = [f"bench_{kind}_{uuid.uuid4().hex[:8]}" for kind in ("rag", "dagster")]
            with psycopg.connect(admin, autocommit=True) as conn:
                for name in names:
                    conn.execute(f'CREATE DATABASE "{name}"')
            lib_url = admin.replace("/postgres?", f"/{names[0]}?", 1)
            home = tmp / "home"
            # the code server, run workers and webserver read these, as under `rag dev`; an empty
            # settings file keeps a developer's rag.yaml out
            (tmp / "rag.yaml").write_text("{}\n")
            os.environ.update(RAG_DATABASE_URL=lib_url, RAG_HOME=str(home), RAG_CONFIG=str(tmp / "rag.yaml"),
                              DAGSTER_PG_URL=sqlalchemy_url(admin, names[1]), DAGSTER_DISABLE_TELEMETRY="1")
            root = tmp / "corpus"
            _, out["generate_seconds"] = timed(make_tree, root, args.files, shapes)
            settings = Settings(database_url=lib_url, home=home)
            instance = get_instance(settings)
            with KnowledgeBase(settings) as kb:  # the model is never loaded here: nothing is encoded
                (targets, ordered, _), out["register_seconds"] = timed(
                    register_partitions, instance, kb, [CorpusRoot(root, "default")])
            out["partitions"] = len(instance.get_dynamic_partitions(CORPUS_FILES))
            rag = RagResource(database_url=lib_url, home=str(home))
            out.update(sensor_ticks(instance, rag, root, args.files))
            progress(out)

            run_config = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
            t = time.perf_counter()
            with location_workspace(instance) as workspace:
                out["code_server_seconds"] = round(time.perf_counter() - t, 3)
                key = ordered[len(ordered) // 2]
                t = time.perf_counter()
                (run_id,) = launch_runs(instance, workspace, "ingest_files", run_config, [(key, key)])
                run = wait_for_run(instance, run_id)
                out["one_partition_seconds"] = round(time.perf_counter() - t, 3)
                out["one_partition_status"] = run.status.value
                if run.status.value != "SUCCESS":
                    raise RuntimeError(f"the one-partition run {run_id} ended {run.status.value}")
                progress(out)
                with location_in_process(instance) as here:
                    key = ordered[len(ordered) // 3]
                    (run_id,), out["one_partition_in_process_seconds"] = timed(
                        launch_runs, instance, here, "ingest_files", run_config, [(key, key)])
                    status = instance.get_run_by_id(run_id).status.value
                    if status != "SUCCESS":
                        raise RuntimeError(f"the in-process one-partition run {run_id} ended {status}")
                progress(out)

                web = Webserver(tmp / "webserver.log")
                _, out["webserver_ready_seconds"] = timed(web.wait_loaded)
                out.update(ui_queries(web, ordered))
                progress(out)

                run, out["backfill_run_create_seconds"] = timed(
                    dagster_private.create_location_run, instance, workspace, LOCATION, "ingest_files", run_config,
                    {**range_tags(ordered[0], ordered[-1]), "rag/trigger": "benchmark"})
                out["backfill_run_planned_events"] = len(planned_events(instance, run.run_id))
                progress(out)
                # the run's worker dies before doing anything: what the daemon's run monitoring then
                # reports, and what the UI's partition bar shows afterwards
                _, out["failed_run_report_seconds"] = timed(instance.report_run_failed, run)
                out["failed_run_planned_events"] = len(planned_events(instance, run.run_id))
                data, out["ui_partition_health_after_failure_seconds"] = timed(
                    web.query, PARTITION_HEALTH, assetKey={"path": ["vector_table"]})
                statuses = data["assetNodeOrError"]["assetPartitionStatuses"]
                out["ui_failed_partitions_after_failure"] = len(statuses["failedPartitions"])
            out["load_after"] = [round(x, 2) for x in os.getloadavg()]
            instance.dispose()
        finally:
            if web is not None:
                web.stop()
            stop_embedded(tmp / "pgdata")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
