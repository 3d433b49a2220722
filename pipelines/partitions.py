"""One partition per corpus file, and the one partition sync used by the corpus sensor, the
schedules and `rag materialize`.

Key scheme: `<root name>/<path under the root>`, the root name being the registry's stable label
(`rag roots list`), so a key names its root however many roots are registered and keys do not
change when a root is added. `...` (Dagster's range delimiter), `|` (its multi-partition
delimiter) and `%` are percent-encoded so every key round-trips; root names never hold `/` or `%`.
Dagster keeps keys in insertion order, so a "range" is an insertion-order range."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote

from dagster import (AddDynamicPartitionsRequest, DagsterRun, DagsterRunStatus, DeleteDynamicPartitionsRequest,
                     DynamicPartitionsDefinition, RunsFilter)

from rag_lib.corpus_files import Digests, ReadLimits, empty_folder_warning, file_gone, path_refusal
from rag_lib.errors import RagError, ValidationError, first_of
from rag_lib.models import CorpusRoot, Skipped
from rag_lib.corpus_scan import FileTarget, walk_files
from rag_lib.ingest.state import STAGES
from rag_lib.search.notes import plural

if TYPE_CHECKING:
    from rag_lib.ingest.state import ReconcilePlan

CORPUS_FILES = "corpus_files"
corpus_files = DynamicPartitionsDefinition(name=CORPUS_FILES)

# What a sensor or schedule tick says when there is nothing to scan.
NO_ROOTS = ("no corpus roots registered: register one with `rag roots add PATH` (or `rag materialize PATH`, "
            "or pipeline.roots in rag.yaml)")

# Dagster's run tags for a partition range (what single-run backfills use).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
# Dagster's implicit asset job: the UI's "Materialize" and an asset backfill's runs. A prefix, as
# Dagster's own `is_implicit_asset_job_name` reads it (older releases numbered them `__ASSET_JOB_0`…).
ASSET_JOB = "__ASSET_JOB"
# Wanted files at most this many partitions apart share a run; farther apart, each group gets its
# own. A run's fixed cost (creating and starting it, its checks and the index step: 3 s and more,
# 10 s with a run worker that loads the model) is about that of ~128 current files inside a span
# (each is checked by every stage and gets its six materialization events, ~20 ms), so this keeps
# the cheaper side. Merging every group into one span instead (up to 2026-11-26: more than 4
# ranges became one) made 10 changes scattered over 10,000 files one run over 9,001 of them.
MERGE_GAP = 128


def encode_key(text: str) -> str:
    """Percent-encode `%`, `|` and runs of 3+ dots so the key is safe in ranges and round-trips."""
    text = text.replace("%", "%25").replace("|", "%7C")
    if "..." not in text:  # (most keys: the sensor keys every file every tick)
        return text
    return re.sub(r"\.{3,}", lambda m: "%2E" * len(m.group(0)), text)


def decode_key(key: str) -> str:
    return unquote(key)


class PartitionMap:
    """Maps partition keys to files and back for the registered roots (each with a unique name)."""

    def __init__(self, roots: list[CorpusRoot]):
        self.roots = roots
        self.by_name = {r.name: r for r in roots}
        self.refused: list[Skipped] = []  # files the last `files()` could not key (path_too_long)
        if "" in self.by_name or len(self.by_name) != len(roots):
            raise ValidationError("every corpus root needs a unique registered name (KnowledgeBase.roots())")

    def key(self, root: CorpusRoot, rel: str) -> str:
        return encode_key(f"{root.name}/{rel}")

    def root_of(self, key: str) -> CorpusRoot | None:
        """The registered root a key belongs to (None: no such root any more, or a foreign key)."""
        name, sep, _ = decode_key(key).partition("/")
        return self.by_name.get(name) if sep else None

    def target(self, key: str) -> FileTarget:
        name, _, rel = decode_key(key).partition("/")
        root = self.by_name.get(name)
        if root is None or not rel:
            raise ValidationError(f"partition '{key}' belongs to no registered corpus root "
                                  "(`rag roots list`; register one with `rag roots add`)")
        return FileTarget(root.collection, root.path, rel, key)

    def present_roots(self) -> list[CorpusRoot]:
        """Roots whose folder exists (a missing folder, e.g. an unmounted disk, is left alone)."""
        return [r for r in self.roots if r.path.is_dir()]

    def files(self) -> dict[str, os.stat_result]:
        """key → stat of every file under every present root, sorted by key. A file whose
        path is too long to be a key (`path_too_long`: PostgreSQL could not index it, and a failed
        partition write stops the sync of every root) is left out and kept in `self.refused`."""
        found: dict[str, os.stat_result] = {}
        self.refused = []
        for root in self.present_roots():
            for rel, st in walk_files(root.path).items():
                refusal = path_refusal(root.collection, rel)
                if refusal is not None:
                    self.refused.append(refusal)
                    continue
                found[self.key(root, rel)] = st
        return dict(sorted(found.items()))

    def digester(self, limits: ReadLimits) -> Callable[[str], str]:
        """key → the file's digest, read within `limits` and confined to its root (`corpus_files`),
        for one scan (`corpus_files.Digests`)."""
        digests = Digests(limits)

        def digest(key: str) -> str:
            target = self.target(key)
            return digests(target.path, target.root)
        return digest


def record_refused(kb, pmap: PartitionMap, log: logging.Logger | None = None) -> list[Skipped]:
    """Record the files the last `pmap.files()` could not key as skipped (`rag status` lists them),
    so a file that can never be a partition is reported, not silently ignored."""
    for skip in pmap.refused:
        (log or logging.getLogger(__name__)).info("skipped %s: %s (%s)", skip.path, skip.reason, skip.detail)
        kb.store.record_skip(skip)
    return pmap.refused


@dataclass
class PartitionSync:
    """What a sync decided: partitions to add, partitions to delete (files gone: rows already
    deleted; roots unregistered: rows kept), and the partition order after it."""

    add: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # files gone whose rows were deleted
    unrooted: list[str] = field(default_factory=list)  # partitions of roots no longer registered
    ordered: list[str] = field(default_factory=list)

    def requests(self) -> list:
        """The same decisions as a sensor's dynamic-partition requests."""
        out: list = []
        if self.add:
            out.append(AddDynamicPartitionsRequest(CORPUS_FILES, self.add))
        if self.delete:
            out.append(DeleteDynamicPartitionsRequest(CORPUS_FILES, self.delete))
        return out

    def apply(self, instance) -> None:
        """Write the decisions to the instance directly (schedules, `rag materialize`)."""
        if self.add:
            instance.add_dynamic_partitions(CORPUS_FILES, self.add)
        for key in self.delete:
            instance.delete_dynamic_partition(CORPUS_FILES, key)


def sync_partitions(existing: list[str], pmap: PartitionMap, on_disk: Iterable[str],
                    forget: Callable[[FileTarget], list[str]] | None, log: logging.Logger | None = None,
                    also_gone: Iterable[str] = (), holding: Callable[[CorpusRoot], int] | None = None) -> PartitionSync:
    """Decide the partition changes for the files now on disk. A file gone from a present root
    loses its rows (`forget`) BEFORE its partition is deleted; if deleting rows fails, the
    partition stays for the next sync. A partition whose root was unregistered is dropped with
    its rows kept. Nothing under a root whose folder is missing is touched, nor under one that
    lists no files at all while it holds documents (`holding(root)`: how many; None counts as
    some), with a warning: an unmounted disk leaves an empty folder. `forget` None: new
    files are added and nothing is removed (schedules: a schedule's "Test" in the UI evaluates it,
    and must change nothing; deletions are the corpus sensor's and `rag materialize`'s)."""
    log = log or logging.getLogger(__name__)
    on_disk = list(on_disk)
    disk, known = set(on_disk), set(existing)
    present = {r.name for r in pmap.present_roots()}
    listing = {k.partition("/")[0] for k in disk}  # roots that list a file (a root's name needs no encoding)
    emptied: dict[str, bool] = {}  # root name → it lists no files but holds documents: left alone
    sync = PartitionSync(add=[k for k in on_disk if k not in known])
    for key in (list(existing) + [k for k in also_gone if k not in known]) if forget is not None else []:
        if key in disk:
            continue
        root = pmap.root_of(key)
        if root is None:
            if key in known:
                sync.unrooted.append(key)
                sync.delete.append(key)
            continue
        if root.name not in present:
            continue
        if root.name not in listing:
            if root.name not in emptied:
                emptied[root.name] = _keeps_empty_root(root, holding, log)
            if emptied[root.name]:
                continue
        target = pmap.target(key)
        if not file_gone(target.path):  # listed as gone, but there: an unreadable folder, a link loop
            log.warning("%s is not listed under its root but its file is there (an unreadable folder or a link "
                        "loop?): its documents are kept; make it readable, or delete it", key)
            continue
        try:
            removed = forget(target)
            log.info("deleted %s: %d document(s) removed", key, len(removed))
        except RagError as exc:
            log.warning("could not delete rows of %s (partition kept, retried next sync): %s", key, exc)
            continue
        sync.removed.append(key)
        if key in known:
            sync.delete.append(key)
    dropped = set(sync.delete)
    sync.ordered = [k for k in existing if k not in dropped] + sync.add
    return sync


def _keeps_empty_root(root: CorpusRoot, holding: Callable[[CorpusRoot], int] | None, log: logging.Logger) -> bool:
    """Whether a root whose folder lists no files holds documents (then they are kept, with a
    warning naming the command that deletes them on purpose)."""
    documents = holding(root) if holding is not None else None
    if documents == 0:
        return False
    log.warning("corpus root %s: %s", root.name, empty_folder_warning(
        root.path, root.collection, documents) if documents is not None else
        f"{root.path} lists no files at all; its documents are kept (an unmounted disk?)")
    return True


def plan_ranges(wanted: list[str], ordered: list[str], parallel: int = 1) -> list[tuple[str, str]]:
    """Contiguous (start, end) ranges, in partition insertion order, covering `wanted`: one run
    each. Wanted files more than MERGE_GAP partitions apart go to separate ranges (the current
    files between them would cost more than another run); with `parallel` > 1, the wanted files
    are first split into `parallel` groups of near-equal size, one range (or more) each."""
    position = {k: i for i, k in enumerate(ordered)}
    idx = sorted({position[k] for k in wanted if k in position})
    if not idx:
        return []
    size = -(-len(idx) // max(parallel, 1))
    ranges: list[list[int]] = []
    for group in (idx[i:i + size] for i in range(0, len(idx), size)):
        ranges.append([group[0], group[0]])
        for i in group[1:]:
            if i - ranges[-1][1] - 1 <= MERGE_GAP:
                ranges[-1][1] = i
            else:
                ranges.append([i, i])
    return [(ordered[a], ordered[b]) for a, b in ranges]


def range_tags(start: str, end: str) -> dict[str, str]:
    return {RANGE_START_TAG: start, RANGE_END_TAG: end}


# A run in these states will still do its work (a canceling one will not).
IN_FLIGHT = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING,
             DagsterRunStatus.STARTED]


def run_partition_keys(tags: dict[str, str], ordered: list[str]) -> list[str]:
    """The partitions a run covers, from its tags (a range in `ordered`, or one partition); none
    for a run of no partition (e.g. `hnsw_index` alone) or a range whose ends are gone."""
    if RANGE_START_TAG in tags:
        position = {k: i for i, k in enumerate(ordered)}
        start, end = position.get(tags[RANGE_START_TAG]), position.get(tags.get(RANGE_END_TAG, ""))
        return ordered[start:end + 1] if start is not None and end is not None else []
    key = tags.get("dagster/partition")
    return [key] if key in ordered else []


def run_stages(run: DagsterRun, job_stages: Mapping[str, Collection[str]]) -> set[str]:
    """The per-file stages a run materializes: those of its asset selection (the UI's "Materialize",
    an asset backfill's runs), else its whole job's (`job_stages`; the implicit asset job has every asset)."""
    if run.asset_selection is not None:
        return {key.to_user_string() for key in run.asset_selection} & set(STAGES)
    if run.job_name.startswith(ASSET_JOB):
        return set(STAGES)
    return set(job_stages.get(run.job_name, ()))


def files_in_flight(instance, stages: Collection[str], ordered: list[str],
                    job_stages: Mapping[str, Collection[str]]) -> dict[str, DagsterRun]:
    """key → a queued or running run that materializes at least `stages` for that file (a run of a
    job that does, or one launched from the UI or by an asset backfill whose selection does): its
    work is under way, and another run for it would do it again beside that one. A run of fewer
    stages (the UI's "Materialize" on `vector_table` alone) does not hold its files."""
    busy: dict[str, DagsterRun] = {}
    for run in instance.get_runs(RunsFilter(statuses=IN_FLIGHT)):  # few: the queue and what runs
        if set(stages) <= run_stages(run, job_stages):
            for key in run_partition_keys(run.tags, ordered):
                busy.setdefault(key, run)
    return busy


def in_flight_text(waiting: dict[str, DagsterRun], limit: int = 3) -> str:
    """The runs files wait for, as the UI names them: id, job, status and what launched it."""
    runs = list({run.run_id: run for run in waiting.values()}.values())
    return first_of([f"{run.run_id} ({run.job_name}, {run.status.value.lower()}, {launched_by(run)})" for run in runs],
                    limit)


def waiting_text(waiting: dict[str, DagsterRun]) -> str:
    """`3 files needing a run are in runs already queued or in progress: <the runs>`."""
    return (f"{plural(len(waiting), 'file')} needing a run {'is' if len(waiting) == 1 else 'are'} in runs already "
            f"queued or in progress: {in_flight_text(waiting)}")


def launched_by(run: DagsterRun) -> str:
    """What launched a run: its rag/trigger tag (sensor, schedule, `rag materialize`), else a backfill or the UI."""
    if run.tags.get("rag/trigger"):
        return run.tags["rag/trigger"]
    return "backfill" if run.tags.get("dagster/backfill") else "launched from the UI"


def run_key(prefix: str, items: list[str]) -> str:
    return f"{prefix}-" + hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:16]


def plan_runs(instance, kb, targets: list[FileTarget]) -> tuple[ReconcilePlan, list[str]]:
    """The library's reconcile plan for `targets` (missing, failed or stale files), and the other
    files never materialized on this Dagster instance (a new one, a terminated run's: their
    partitions show Missing until a run confirms them)."""
    from dagster import AssetKey

    from rag_lib.ingest.state import plan_reconcile

    plan = plan_reconcile(kb.store, kb.settings, targets, kb.settings.pipeline_fingerprint())
    materialized = set(instance.get_materialized_partitions(AssetKey("vector_table"))) if targets else set()
    return plan, sorted({t.key for t in targets} - materialized - set(plan.keys))


def keys_needing_runs(instance, kb, targets: list[FileTarget]) -> list[str]:
    """The files a run would change (`plan_runs`: the plan's and the never materialized)."""
    if not targets:
        return []
    plan, unmaterialized = plan_runs(instance, kb, targets)
    return sorted(set(plan.keys) | set(unmaterialized))
