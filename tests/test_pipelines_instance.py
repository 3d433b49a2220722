"""The instance dagster.yaml configures (its event log storage is pipelines/event_log.py's) against
Dagster's own Postgres storage: a new run plans each partitioned asset with one event carrying its
partitions (not one per file), written in one batch; a failed run's partitions read back as failed
exactly as Dagster's own storage reports them (a queued run failed, and a real run that fails
mid-way); a batch that fails half-way is taken back out before Dagster writes its events one by
one; partition keys are read once per block, and again only after they changed."""

from __future__ import annotations

import traceback
import uuid

from dagster import (AssetCheckResult, AssetKey, AssetRecordsFilter, AssetMaterialization, AssetPartitionStatus, BackfillPolicy,
                     DagsterEventType, DagsterInstance, MaterializeResult, MetadataValue, asset, asset_check,
                     materialize)
from dagster_postgres.event_log import PostgresEventLogStorage
import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from pipelines.definitions import defs
from pipelines.event_log import RagEventLogStorage, partition_keys_read_once
from pipelines.instance import get_instance, prepare_dagster_home, sqlalchemy_url
from pipelines.partitions import CORPUS_FILES, RANGE_END_TAG, RANGE_START_TAG, corpus_files
from pipelines import resources
from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.embedding.local import LocalProvider
from testkit import create_database

pytestmark = pytest.mark.slow

# file names as users write them: a run's planned event carries them serialized, so quotes, backslashes
# and non-ASCII must read back as given
KEYS = sorted([f"corpus/notes/n{i:02d}.md" for i in range(10)]
              + ['corpus/notes/Bericht "Q3" \\ März.md', "corpus/notes/日本 株式.md"])
PARTITIONED = ["raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table", "knowledge_graph"]


DAGSTERS_OWN = "storage:\n  postgres:\n    postgres_url:\n      env: DAGSTER_PG_URL\n"


def _instance(pg_server: str, database_url: str, home, monkeypatch, ours: bool) -> DagsterInstance:
    """A fresh instance: ours (the repo's dagster.yaml), or Dagster's own Postgres storage."""
    db = f"dagster_{uuid.uuid4().hex[:8]}"
    create_database(pg_server, db)
    monkeypatch.setenv("DAGSTER_PG_URL", sqlalchemy_url(pg_server, db))
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "500")  # both instances hand the storage one batch
    settings = Settings(database_url=database_url, home=home)
    if ours:
        return get_instance(settings, home=home / "dagster_home")
    (home / "dagster_home").mkdir(parents=True)
    (home / "dagster_home" / "dagster.yaml").write_text(DAGSTERS_OWN)
    prepare_dagster_home(settings, home / "dagster_home")  # exports DAGSTER_HOME; our yaml is copied over
    (home / "dagster_home" / "dagster.yaml").write_text(DAGSTERS_OWN)
    return DagsterInstance.get()


def _plan_run_over_keys(instance: DagsterInstance) -> tuple:
    """Register KEYS, create one `ingest_files` run over them, and return it with its planned
    (asset, partition or the partitions it carries) events in the order stored."""
    instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
    run = instance.create_run_for_job(defs.resolve_job_def("ingest_files"),
                                      tags={RANGE_START_TAG: KEYS[0], RANGE_END_TAG: KEYS[-1]})
    return run, _planned_of(instance, run.run_id)


def _planned_of(instance: DagsterInstance, run_id: str) -> list[tuple[str, str]]:
    """A run's planned events, as stored: (asset, its partition or the partitions it carries)."""
    records = instance.get_records_for_run(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                                           limit=10_000).records
    planned = []
    for r in records:
        data = r.event_log_entry.dagster_event.event_specific_data
        keys = sorted(data.partitions_subset.get_partition_keys()) if data.partitions_subset is not None else None
        planned.append((data.asset_key.to_user_string(), data.partition or (", ".join(keys) if keys else "")))
    return planned


def _run_then_fail(pg_server: str, database_url: str, home, monkeypatch, ours: bool) -> dict:
    """Create a run of `ingest_files` over KEYS on a fresh instance (ours, or Dagster's own),
    read back what the UI reads while it is queued, then fail it and read again."""
    instance = _instance(pg_server, database_url, home, monkeypatch, ours)
    assert isinstance(instance.event_log_storage, RagEventLogStorage) == ours
    single_writes: list[str] = []
    store_event = instance.event_log_storage.store_event
    instance.event_log_storage.store_event = lambda e: (single_writes.append(e.dagster_event_type), store_event(e))[1]
    try:
        run, planned = _plan_run_over_keys(instance)
        storage = instance.event_log_storage
        in_progress = {a: sorted(storage.get_latest_asset_partition_materialization_attempts_without_materializations(
            AssetKey(a))) for a in PARTITIONED}
        last_runs = {r.asset_entry.asset_key.to_user_string(): r.asset_entry.last_run_id
                     for r in instance.get_asset_records([AssetKey(a) for a in PARTITIONED + ["hnsw_index"]])}
        instance.report_run_failed(run)
        planned_on_failure = sorted(_planned_of(instance, run.run_id)[len(planned):])
        failed = {}
        for asset in PARTITIONED:  # what the UI's partition bars read
            status = instance.get_status_by_partition(AssetKey(asset), KEYS, corpus_files)
            failed[asset] = sorted(k for k, v in status.items() if v == AssetPartitionStatus.FAILED)
        return {"run_id": run.run_id, "planned": sorted(planned), "planned_on_failure": planned_on_failure,
                "in_progress": in_progress, "last_runs": last_runs,
                "failed": failed, "single_writes": single_writes}
    finally:
        instance.dispose()


def test_planned_events_are_one_batch_that_dagster_reads_as_its_own(pg_server, database_url, tmp_path, monkeypatch):
    ours = _run_then_fail(pg_server, database_url, tmp_path / "ours", monkeypatch, ours=True)
    dagsters = _run_then_fail(pg_server, database_url, tmp_path / "dagster", monkeypatch, ours=False)

    # Dagster's: one planned event per file per partitioned asset, one for the index, each written alone
    assert len(dagsters["planned"]) == len(KEYS) * len(PARTITIONED) + 1
    assert dagsters["single_writes"].count("ASSET_MATERIALIZATION_PLANNED") == len(dagsters["planned"])
    # ours: one per asset, carrying the run's files (a run's creation no longer grows with its files),
    # in one batch, and none when the run fails (its files are read from that one event)
    assert ours["planned"] == sorted([(a, ", ".join(KEYS)) for a in PARTITIONED] + [("hnsw_index", "")])
    assert ours["planned_on_failure"] == dagsters["planned_on_failure"] == []
    assert "ASSET_MATERIALIZATION_PLANNED" not in ours["single_writes"]
    assert sorted(ours["single_writes"]) == sorted(w for w in dagsters["single_writes"]
                                                   if w != "ASSET_MATERIALIZATION_PLANNED")  # check plans

    # what the UI's partition bars read: in progress while queued, failed once the run failed, on both
    assert ours["in_progress"] == dagsters["in_progress"] == {a: KEYS for a in PARTITIONED}
    for result in (ours, dagsters):
        assert result["failed"] == {a: KEYS for a in PARTITIONED}
        assert set(result["last_runs"].values()) == {result["run_id"]}


def _partition_statuses_after_mixed_runs(pg_server: str, database_url: str, home, monkeypatch, ours: bool) -> dict:
    """On a fresh instance (ours, or Dagster's own): a run over every file fails; three files are
    materialized for `chunks` afterwards; one run over one file and one over two files are left
    queued; `knowledge_graph` is wiped. Returns each asset's status per file, as the UI reads it."""
    instance = _instance(pg_server, database_url, home, monkeypatch, ours)
    job = defs.resolve_job_def("ingest_files")
    try:
        instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
        failed = instance.create_run_for_job(job, tags={RANGE_START_TAG: KEYS[0], RANGE_END_TAG: KEYS[-1]})
        instance.report_run_failed(failed)
        for key in KEYS[:3]:
            instance.report_runless_asset_event(AssetMaterialization("chunks", partition=key))
        instance.create_run_for_job(job, tags={"dagster/partition": KEYS[5]})
        instance.create_run_for_job(job, tags={RANGE_START_TAG: KEYS[0], RANGE_END_TAG: KEYS[1]})
        instance.wipe_assets([AssetKey("knowledge_graph")])
        return {a: instance.get_status_by_partition(AssetKey(a), KEYS, corpus_files) for a in PARTITIONED}
    finally:
        instance.dispose()


def test_partition_status_over_failed_materialized_queued_and_wiped_runs_reads_as_dagsters_own(
        pg_server, database_url, tmp_path, monkeypatch):
    """The UI's partition bars over a history of runs: ours reads each file's latest plan from the
    runs' one event per asset, and shows what Dagster's storage shows from one event per file."""
    ours = _partition_statuses_after_mixed_runs(pg_server, database_url, tmp_path / "ours", monkeypatch, ours=True)
    dagsters = _partition_statuses_after_mixed_runs(pg_server, database_url, tmp_path / "dagster", monkeypatch,
                                                    ours=False)
    S = AssetPartitionStatus
    queued = {KEYS[0], KEYS[1], KEYS[5]}
    assert dagsters["chunks"] == {k: S.IN_PROGRESS if k in queued else S.MATERIALIZED if k == KEYS[2] else S.FAILED
                                  for k in KEYS}
    assert dagsters["embeddings"] == {k: S.IN_PROGRESS if k in queued else S.FAILED for k in KEYS}
    assert S.FAILED not in (dagsters["knowledge_graph"] or {}).values()  # the wipe forgot the failed run
    assert ours == dagsters


def test_a_batch_that_fails_half_way_is_taken_back_before_dagster_writes_each_event(pg_server, database_url,
                                                                                    tmp_path, monkeypatch):
    instance = _instance(pg_server, database_url, tmp_path, monkeypatch, ours=True)
    storage = instance.event_log_storage
    store_asset_event = storage.store_asset_event
    calls = []

    def fails_once(event, event_id):  # the batch's asset rows fail after its events were inserted
        calls.append(event_id)
        if len(calls) == 1:
            raise RuntimeError("connection lost")
        return store_asset_event(event, event_id)

    monkeypatch.setattr(storage, "store_asset_event", fails_once)
    try:
        _, planned = _plan_run_over_keys(instance)
        assert calls, "the batch never reached the asset rows"
        # every planned event once: the failed batch left nothing behind for the fallback to repeat
        assert len(planned) == len(set(planned)) == len(PARTITIONED) + 1
        assert [asset for asset, _ in planned].count("chunks") == 1
    finally:
        instance.dispose()


def test_partition_keys_are_read_once_within_the_block(pg_server, database_url, tmp_path, monkeypatch):
    """What a many-file step's `add_asset_metadata(partition_key=)` calls read: the keys as they were
    when the block began (one query), every key and membership check from them."""
    instance = _instance(pg_server, database_url, tmp_path, monkeypatch, ours=True)
    try:
        instance.add_dynamic_partitions(CORPUS_FILES, KEYS[:6])
        with partition_keys_read_once(instance):
            assert list(instance.get_dynamic_partitions(CORPUS_FILES)) == KEYS[:6]
            instance.add_dynamic_partitions(CORPUS_FILES, KEYS[6:])  # as a sensor would, meanwhile
            assert list(instance.get_dynamic_partitions(CORPUS_FILES)) == KEYS[:6]
            assert instance.has_dynamic_partition(CORPUS_FILES, KEYS[0])
            assert not instance.has_dynamic_partition(CORPUS_FILES, KEYS[6])
        assert list(instance.get_dynamic_partitions(CORPUS_FILES)) == KEYS  # read from the database again
        assert instance.has_dynamic_partition(CORPUS_FILES, KEYS[6])
    finally:
        instance.dispose()


def test_partition_keys_are_read_again_only_when_another_process_changed_them(pg_server, database_url, tmp_path,
                                                                               monkeypatch):
    """Dagster reads every partition key many times a run (a one-file run at 100,000 files: ~16
    reads of 1.4 s each): a process fetches them again only after they changed, and then sees
    every change another process made (keys added, deleted, deleted and added back at the end)."""
    instance = _instance(pg_server, database_url, tmp_path, monkeypatch, ours=True)
    other = get_instance(Settings(database_url=database_url, home=tmp_path), home=tmp_path / "dagster_home")
    fetched = []
    fetch = PostgresEventLogStorage.get_dynamic_partitions
    monkeypatch.setattr(PostgresEventLogStorage, "get_dynamic_partitions",
                        lambda self, name: (fetched.append(name), fetch(self, name))[1])
    try:
        other.add_dynamic_partitions(CORPUS_FILES, KEYS[:6])
        for _ in range(3):
            keys = instance.get_dynamic_partitions(CORPUS_FILES)
            assert list(keys) == KEYS[:6]
            keys.clear()  # a caller's copy: the next read is whole
        assert len(fetched) == 1
        other.add_dynamic_partitions(CORPUS_FILES, KEYS[6:])
        assert list(instance.get_dynamic_partitions(CORPUS_FILES)) == KEYS
        other.delete_dynamic_partition(CORPUS_FILES, KEYS[0])
        assert list(instance.get_dynamic_partitions(CORPUS_FILES)) == KEYS[1:]
        other.delete_dynamic_partition(CORPUS_FILES, KEYS[1])  # as many keys again, in another order
        other.add_dynamic_partitions(CORPUS_FILES, [KEYS[1]])
        assert list(instance.get_dynamic_partitions(CORPUS_FILES)) == KEYS[2:] + [KEYS[1]]
        assert len(fetched) == 4
    finally:
        other.dispose()
        instance.dispose()


class _ProviderDown(LocalProvider):
    """The local model's tokenizer (chunking works), but every embedding request fails, as a
    remote provider that went down would: the run stops at `embeddings`."""

    def prepare(self) -> None:
        pass

    def embed(self, texts):
        raise ConnectionError("embedding provider unreachable")

    def embed_counted(self, texts):
        raise ConnectionError("embedding provider unreachable")

    def start_counted(self, texts):  # the local model's own starts its batch on ONNX: a remote one's waits
        return lambda: self.embed_counted(texts)


def _fail_mid_way(pg_server: str, migrated_template: str, home, monkeypatch, ours: bool) -> dict:
    """Run `ingest_files` over one new file (not in any embedding cache) with the provider down,
    on a fresh instance (ours, or Dagster's own) and library database: the run's first stages
    materialize its partition, `embeddings` raises. Returns what the UI's partition bars read."""
    database_url = create_database(pg_server, template=migrated_template)
    root = home / "corpus"
    root.mkdir(parents=True)
    (root / "note.yaml").write_text(f"title: provider outage drill\nticker: ZZZ\nbody: {uuid.uuid4().hex} was here\n")
    settings = Settings(database_url=database_url, home=home / ".rag")
    # the run's resource takes this process's provider for these settings; restored after the test
    monkeypatch.setitem(resources._PROVIDERS, resources._provider_key(settings), _ProviderDown("all-MiniLM-L6-v2", 384))
    with KnowledgeBase(settings, provider=resources.provider_for(settings)) as kb:
        kb.add_root(root)
    key = "corpus/note.yaml"
    instance = _instance(pg_server, database_url, home, monkeypatch, ours)
    try:
        instance.add_dynamic_partitions(CORPUS_FILES, [key])
        config = {"database_url": database_url, "home": str(home / ".rag")}
        result = defs.resolve_job_def("ingest_files").execute_in_process(
            instance=instance, partition_key=key, raise_on_error=False,
            run_config={"resources": {"rag": {"config": config}},
                        "loggers": {"console": {"config": {"log_level": "ERROR"}}}})
        assert not result.success
        status = {a: instance.get_status_by_partition(AssetKey(a), [key], corpus_files)[key] for a in PARTITIONED}
        return {"status": status, "planned": len(_planned_of(instance, result.run_id))}
    finally:
        instance.dispose()


def test_a_run_that_fails_mid_way_shows_the_same_failed_partitions_as_dagsters_storage(
        pg_server, migrated_template, tmp_path, monkeypatch):
    ours = _fail_mid_way(pg_server, migrated_template, tmp_path / "ours", monkeypatch, ours=True)
    dagsters = _fail_mid_way(pg_server, migrated_template, tmp_path / "dagster", monkeypatch, ours=False)
    # what the UI shows for the file: the stages before the outage materialized, the rest failed
    assert dagsters["status"]["chunks"] == AssetPartitionStatus.MATERIALIZED
    assert dagsters["status"]["embeddings"] == AssetPartitionStatus.FAILED
    assert ours["status"] == dagsters["status"]
    # ours planned one event per asset at creation and none at the failure
    assert ours["planned"] == len(PARTITIONED) + 1


def _two_runs_of_per_file_metadata(pg_server: str, database_url: str, home, monkeypatch, ours: bool) -> dict:
    """On a fresh instance (ours, or Dagster's own), two runs of a step that reports each of KEYS
    with its own metadata (as the stage steps do) and a check on its asset. Returns each file's
    latest materialization metadata as stored, the check's result, and the catalog queries
    (schema lookups) the second run made."""
    @asset(partitions_def=corpus_files, backfill_policy=BackfillPolicy.single_run())
    def per_file(context) -> MaterializeResult:
        for n, key in enumerate(context.partition_keys):
            context.add_asset_metadata({"status": "ok", "chunks": n, "preview": MetadataValue.md(f"| {key} |")},
                                       partition_key=key)
        return MaterializeResult(metadata={"run_partitions": len(context.partition_keys)})

    @asset_check(asset=per_file)
    def sizes() -> AssetCheckResult:
        return AssetCheckResult(passed=True, metadata={"chunks": len(KEYS)})

    instance = _instance(pg_server, database_url, home, monkeypatch, ours)
    catalog: list[str] = []

    def on_query(conn, cursor, statement, *args):  # the event log storage's (the run storage is Dagster's)
        if "pg_catalog" in statement or "information_schema" in statement:
            stack = traceback.extract_stack()
            if any("event_log" in frame.filename for frame in stack):
                catalog.append(" > ".join(frame.name for frame in stack[-16:-8]))

    try:
        instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
        tags = {RANGE_START_TAG: KEYS[0], RANGE_END_TAG: KEYS[-1]}
        assert materialize([per_file, sizes], instance=instance, tags=tags).success
        event.listen(Engine, "before_cursor_execute", on_query)
        try:
            result = materialize([per_file, sizes], instance=instance, tags=tags)
        finally:
            event.remove(Engine, "before_cursor_execute", on_query)
        assert result.success
        metadata = {}
        for key in KEYS:
            (record,) = instance.fetch_materializations(
                AssetRecordsFilter(asset_key=AssetKey("per_file"), asset_partitions=[key]), limit=1).records
            assert record.run_id == result.run_id
            metadata[key] = {k: v.value for k, v in record.asset_materialization.metadata.items()}
        status = instance.get_status_by_partition(AssetKey("per_file"), KEYS, corpus_files)
        (check,) = result.get_asset_check_evaluations()
        return {"metadata": metadata, "status": status, "check": (check.passed, check.metadata["chunks"].value),
                "catalog": catalog}
    finally:
        instance.dispose()


def test_a_run_writes_every_files_metadata_without_looking_the_schema_up_again(pg_server, database_url, tmp_path,
                                                                               monkeypatch):
    """Each file's materialization and its metadata (what the asset's partition page shows), the
    partition status and the check's result read back as from Dagster's own storage; but where
    Dagster looks its tables and columns up in the database again for every batch of asset events
    and every check (a connection and catalog queries each), ours found them in the first run."""
    ours = _two_runs_of_per_file_metadata(pg_server, database_url, tmp_path / "ours", monkeypatch, ours=True)
    dagsters = _two_runs_of_per_file_metadata(pg_server, database_url, tmp_path / "dagster", monkeypatch, ours=False)
    assert dagsters["metadata"] == {k: {"status": "ok", "chunks": n, "preview": f"| {k} |", "run_partitions": len(KEYS)}
                                    for n, k in enumerate(KEYS)}
    assert ours["metadata"] == dagsters["metadata"]
    assert ours["status"] == dagsters["status"] == {k: AssetPartitionStatus.MATERIALIZED for k in KEYS}
    assert ours["check"] == dagsters["check"] == (True, len(KEYS))
    assert dagsters["catalog"], "Dagster's storage no longer looks its schema up per run: this test is moot"
    assert ours["catalog"] == [], "\n".join(ours["catalog"])
