"""The instance dagster.yaml configures (its event log storage is pipelines/event_log.py's) writes
what Dagster's own Postgres storage writes: a new run's planned materializations go in as one
batch, and Dagster reads them back the same way (the run's planned events, partitions in progress,
failed partitions after the run fails, each asset's last run); a batch that fails half-way is taken
back out before Dagster writes its events one by one; partition keys are read once per block."""

from __future__ import annotations

import uuid

from dagster import AssetKey, AssetPartitionStatus, DagsterEventType, DagsterInstance
import pytest

from pipelines.definitions import defs
from pipelines.event_log import RagEventLogStorage, partition_keys_read_once
from pipelines.instance import get_instance, prepare_dagster_home, sqlalchemy_url
from pipelines.partitions import CORPUS_FILES, RANGE_END_TAG, RANGE_START_TAG, corpus_files
from rag_lib.config import Settings
from testkit import create_database

pytestmark = pytest.mark.slow

KEYS = [f"corpus/notes/n{i:02d}.md" for i in range(12)]
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
    (asset, partition) events in the order stored."""
    instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
    run = instance.create_run_for_job(defs.resolve_job_def("ingest_files"),
                                      tags={RANGE_START_TAG: KEYS[0], RANGE_END_TAG: KEYS[-1]})
    records = instance.get_records_for_run(run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED,
                                           limit=10_000).records
    return run, [(r.event_log_entry.dagster_event.asset_key.to_user_string(),
                  r.event_log_entry.dagster_event.partition or "") for r in records]


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
        planned = sorted(planned)
        storage = instance.event_log_storage
        in_progress = {a: sorted(storage.get_latest_asset_partition_materialization_attempts_without_materializations(
            AssetKey(a))) for a in PARTITIONED}
        last_runs = {r.asset_entry.asset_key.to_user_string(): r.asset_entry.last_run_id
                     for r in instance.get_asset_records([AssetKey(a) for a in PARTITIONED + ["hnsw_index"]])}
        instance.report_run_failed(run)
        failed = {}
        for asset in PARTITIONED:  # what the UI's partition bars read
            status = instance.get_status_by_partition(AssetKey(asset), KEYS, corpus_files)
            failed[asset] = sorted(k for k, v in status.items() if v == AssetPartitionStatus.FAILED)
        return {"run_id": run.run_id, "planned": planned, "in_progress": in_progress, "last_runs": last_runs,
                "failed": failed, "single_writes": single_writes}
    finally:
        instance.dispose()


def test_planned_events_are_one_batch_that_dagster_reads_as_its_own(pg_server, database_url, tmp_path, monkeypatch):
    ours = _run_then_fail(pg_server, database_url, tmp_path / "ours", monkeypatch, ours=True)
    dagsters = _run_then_fail(pg_server, database_url, tmp_path / "dagster", monkeypatch, ours=False)

    # one planned event per file per partitioned asset, one for the index; the same on both
    assert len(ours["planned"]) == len(KEYS) * len(PARTITIONED) + 1
    assert ours["planned"] == dagsters["planned"]
    # Dagster's own storage writes each of them alone; ours writes none alone
    assert dagsters["single_writes"].count("ASSET_MATERIALIZATION_PLANNED") == len(ours["planned"])
    assert "ASSET_MATERIALIZATION_PLANNED" not in ours["single_writes"]
    assert sorted(ours["single_writes"]) == sorted(w for w in dagsters["single_writes"]
                                                   if w != "ASSET_MATERIALIZATION_PLANNED")  # check plans

    # what the UI's partition bars read: every file in progress while queued, failed once the run failed
    for result in (ours, dagsters):
        assert result["in_progress"] == {a: KEYS for a in PARTITIONED}
        assert result["failed"] == {a: KEYS for a in PARTITIONED}
        assert set(result["last_runs"].values()) == {result["run_id"]}


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
        assert len(planned) == len(set(planned)) == len(KEYS) * len(PARTITIONED) + 1
        status = instance.get_status_by_partition(AssetKey("chunks"), KEYS, corpus_files)
        assert set(status.values()) == {AssetPartitionStatus.IN_PROGRESS}
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
