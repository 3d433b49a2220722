"""The instance's event log storage, named in dagster.yaml (`event_log_storage: module:
pipelines.event_log, class: RagEventLogStorage`): dagster-postgres's storage with these changes,
made by overriding its public methods (Dagster's documented way to change how an instance stores
events; nothing is patched at run time):

- a new run plans each partitioned asset with ONE planned-materialization event carrying the run's
  partitions (`supports_partition_subset_in_asset_materialization_planned_events`, the property
  Dagster's `DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS` sets on its own storages), not one
  per asset per file: creating a run over 10,000 files wrote 60,000 events (75 s), over 100,000
  files 600,000 (9.3 min; docs/scale.md, "Dagster at 100k files"). Dagster's own query for the
  partitions a run planned and did not materialize (what the UI's partition bars show failed or in
  progress) reads only per-partition planned events; ours also reads the runs' partitions from
  those events (`get_latest_asset_partition_materialization_attempts_without_materializations`),
  so a failed run's files show failed and a running run's files in progress, as with Dagster's
  storage, without one event per file;
- a batch of ASSET_MATERIALIZATION_PLANNED events (a new run plans one per asset per file: 961 for
  160 files) is written as dagster-postgres writes a batch of materializations, one multi-row insert
  and each asset's row once, where it would write each event alone (insert, NOTIFY, asset row,
  commit): creating a 160-file run of `ingest_files` took 2.9-5.3 s against 40-80 s with
  Dagster's storage (2026-11-26, load average 25-30 on 2 cores; 0.7-1.0 s against 2.6-6.3 s on a
  quiet day);
- within `partition_keys_read_once()`, the dynamic partition keys are read from the database once
  (see there): one step's 160 per-file metadata checks took 0.03-0.07 s against 3.8-19 s (same
  measurement, same load), and a run has six such steps;
- tables and asset-key columns found in the schema are not looked up again (`has_table`,
  `has_asset_key_col`: Dagster reflected the schema, on a connection of its own, for every batch
  of asset events and every check's step, ~1 s of a cold run's steps after its stages at load 6);
- everywhere else, a process reads a partitions definition's keys again only when they changed
  since it last read them (`_current_keys`: one aggregate row tells): Dagster reads every key to
  resolve a run's range, to attach a partition's metadata and for every asset check on a
  partitioned asset, ~16 times in a one-file run, 1.4 s each at 100,000 files (a run over one
  file took 39 s, 23 s of it reading keys; docs/scale.md, "Dagster at 100k files"). The
  webserver's and the sensor's reads of unchanged keys get cheap too.

Every process that loads dagster.yaml uses it: `rag materialize`, run workers, the webserver and
daemon of `rag dev` (each creates runs: the command, the UI's launches, the sensor's and
schedules' requests and backfills). Elsewhere (an instance without it, e.g. the Helm chart's)
everything works unchanged, only slower."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any

from dagster import AssetKey, DagsterEventType, EventLogEntry, deserialize_value
from dagster_postgres.event_log import PostgresEventLogStorage
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config
import sqlalchemy as sa

# partitions definition name → its keys, while a `partition_keys_read_once()` block runs (per thread)
_READ_ONCE: ContextVar[dict[str, list[str]] | None] = ContextVar("rag_partition_keys_read_once", default=None)
_KEY_SETS: ContextVar[dict[str, set[str]] | None] = ContextVar("rag_partition_key_sets", default=None)

# What changes whenever a definition's keys do: ids come from a sequence (an added key gets a new,
# higher one), a deleted key lowers the count, and a wipe followed by as many new keys has later
# timestamps. Dagster's own table (dagster's event_log/schema.py, `dynamic_partitions`).
_KEYS_STAMP = sa.text("SELECT count(*), max(id), max(create_timestamp) FROM dynamic_partitions "
                      "WHERE partitions_def_name = :name")
# Planned events carrying a run's partitions have no partition of their own (dagster's
# event_log/schema.py, `event_logs`); events written before the asset's last wipe do not count.
_SUBSET_PLANS = sa.text("SELECT id, run_id, event FROM event_logs WHERE asset_key = :asset_key "
                        "AND dagster_event_type = 'ASSET_MATERIALIZATION_PLANNED' AND partition IS NULL "
                        "AND id > :after AND timestamp > :wiped ORDER BY id")


def _is_planned(event) -> bool:
    return (event.dagster_event_type == DagsterEventType.ASSET_MATERIALIZATION_PLANNED
            and bool(event.dagster_event.asset_key))


class RagEventLogStorage(PostgresEventLogStorage):
    """dagster-postgres's event log storage, writing planned materializations in batches."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # partitions definition name → (its stamp, its keys) as this process last read them
        self._known_keys: dict[str, tuple[tuple, list[str]]] = {}
        # tables and asset-key columns found in the schema (see `has_table`)
        self._tables_found: set[str] = set()
        self._asset_key_columns_found: set[str] = set()

    @classmethod
    def from_config_value(cls, inst_data, config_value: Mapping[str, Any]) -> RagEventLogStorage:
        # the parent's builds a PostgresEventLogStorage by name: the same arguments, for this class
        return cls(inst_data=inst_data, postgres_url=pg_url_from_config(config_value),
                   should_autocreate_tables=config_value.get("should_autocreate_tables", True),
                   token_provider=get_token_provider_from_config(config_value))

    @property
    def supports_partition_subset_in_asset_materialization_planned_events(self) -> bool:
        return True

    def get_latest_asset_partition_materialization_attempts_without_materializations(
            self, asset_key: AssetKey, after_storage_id: int | None = None) -> Mapping[str, tuple[str, int]]:
        """Partition → (run id, planned event id) of its latest plan that no materialization
        followed: Dagster's answer from per-partition planned events, with the partitions of the
        runs planned with one event per asset added (the latest plan of a partition wins)."""
        attempts = dict(super().get_latest_asset_partition_materialization_attempts_without_materializations(
            asset_key, after_storage_id))
        plans = self._partition_subset_plans(asset_key, after_storage_id)
        if not plans:
            return attempts
        for plan_id, run_id, keys in plans:  # oldest first
            for key in keys:
                if key not in attempts or attempts[key][1] < plan_id:
                    attempts[key] = (run_id, plan_id)
        materialized = self.get_latest_storage_id_by_partition(
            asset_key, DagsterEventType.ASSET_MATERIALIZATION, after_cursor=plans[0][0])
        return {key: plan for key, plan in attempts.items() if materialized.get(key, 0) < plan[1]}

    def _partition_subset_plans(self, asset_key: AssetKey,
                                after_storage_id: int | None) -> list[tuple[int, str, list[str]]]:
        """The asset's planned events that carry a run's partitions, after the cursor and its last
        wipe, oldest first: (event id, run id, partition keys)."""
        record = next(iter(self.get_asset_records([asset_key])), None)
        details = record.asset_entry.asset_details if record else None
        wiped = (datetime.fromtimestamp(details.last_wipe_timestamp, timezone.utc).replace(tzinfo=None)
                 if details and details.last_wipe_timestamp else datetime.min)
        with self.index_connection() as conn:
            rows = conn.execute(_SUBSET_PLANS, {"asset_key": asset_key.to_string(), "after": after_storage_id or 0,
                                                "wiped": wiped}).all()
        plans = []
        for event_id, run_id, body in rows:
            subset = deserialize_value(body, EventLogEntry).dagster_event.event_specific_data.partitions_subset
            if subset is not None:  # an unpartitioned asset's plan has neither partition nor subset
                plans.append((int(event_id), run_id, list(subset.get_partition_keys())))
        return plans

    def store_event_batch(self, events: Sequence) -> None:
        planned = [e for e in events if _is_planned(e)]
        if len(planned) < 2:
            return super().store_event_batch(events)
        insert = self.prepare_insert_event_batch(planned)
        with self.index_transaction() as conn:
            ids = [int(row[0]) for row in conn.execute(insert.returning(insert.table.c.id)).fetchall()]
        try:
            self.store_asset_event_tags(planned, ids)
            # an asset's row takes the last planned event's run id and timestamp: write it once
            for event, event_id in {e.dagster_event.asset_key: (e, i) for e, i in zip(planned, ids)}.values():
                self.store_asset_event(event, event_id)
        except Exception:
            # Dagster answers a failed batch by writing each event alone: take the events back out
            # first, or they would be there twice.
            with self.index_transaction() as conn:
                conn.execute(insert.table.delete().where(insert.table.c.id.in_(ids)))
            raise
        rest = [e for e in events if not _is_planned(e)]
        if rest:
            super().store_event_batch(rest)

    def has_table(self, table_name: str) -> bool:
        """Whether the table exists, asked of the database until it does. Dagster asks before
        every batch of asset events, every check evaluation and every partition check, each time
        on a connection of its own beside the pooled one it writes on (connect, catalog query,
        close); a table found stays (a migration adds tables, never drops them)."""
        return _found_once(self._tables_found, table_name, super().has_table)

    def has_asset_key_col(self, column_name: str) -> bool:
        """Whether the asset-key table has the column, reflected from the database until it does:
        Dagster reflects the table's columns (catalog queries) for every read of asset records,
        which each asset check's step does."""
        return _found_once(self._asset_key_columns_found, column_name, super().has_asset_key_col)

    @contextmanager
    def partition_keys_read_once(self) -> Iterator[None]:
        """Within the block (this thread), each dynamic partitions definition's keys are read from
        the database once. `context.add_asset_metadata(partition_key=)` checks the key against the
        run's range by reading the range's ends and then every key (a step over n files: 3n queries,
        n of them reading n keys, per asset). A running step's keys do not change."""
        keys, sets = _READ_ONCE.set({}), _KEY_SETS.set({})
        try:
            yield
        finally:
            _READ_ONCE.reset(keys)
            _KEY_SETS.reset(sets)

    def get_dynamic_partitions(self, partitions_def_name: str) -> Sequence[str]:
        cache = _READ_ONCE.get()
        if cache is None:
            return self._current_keys(partitions_def_name)
        if partitions_def_name not in cache:
            cache[partitions_def_name] = self._current_keys(partitions_def_name)
        return cache[partitions_def_name]

    def _current_keys(self, partitions_def_name: str) -> list[str]:
        """The definition's keys: read from the database when they changed since this process last
        read them (or never did), else the copy it read. The stamp is read before the keys: keys
        changed in between are read again next time, never kept under a newer stamp."""
        with self.index_connection() as conn:
            stamp = tuple(conn.execute(_KEYS_STAMP, {"name": partitions_def_name}).one())
        known = self._known_keys.get(partitions_def_name)
        if known is None or known[0] != stamp:
            known = (stamp, list(super().get_dynamic_partitions(partitions_def_name)))
            self._known_keys[partitions_def_name] = known
        return list(known[1])  # a copy: callers may change theirs

    def has_dynamic_partition(self, partitions_def_name: str, partition_key: str) -> bool:
        sets = _KEY_SETS.get()
        if sets is None:
            return super().has_dynamic_partition(partitions_def_name, partition_key)
        if partitions_def_name not in sets:
            sets[partitions_def_name] = set(self.get_dynamic_partitions(partitions_def_name))
        return partition_key in sets[partitions_def_name]


@contextmanager
def partition_keys_read_once(instance) -> Iterator[None]:
    """`RagEventLogStorage.partition_keys_read_once` on the instance's storage when it is ours."""
    storage = instance.event_log_storage
    if not isinstance(storage, RagEventLogStorage):
        yield
        return
    with storage.partition_keys_read_once():
        yield


def _found_once(found: set[str], name: str, ask: Callable[[str], bool]) -> bool:
    """`ask(name)` until it answers yes, then yes from `found` without asking (schema objects are
    added by migrations, never dropped)."""
    if name in found:
        return True
    if ask(name):
        found.add(name)
        return True
    return False
