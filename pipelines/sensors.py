"""Sensors: the corpus watcher (new / changed / deleted files) and the run-failure recorder."""

from collections.abc import Collection

from dagster import (
    AssetCheckKey,
    AssetKey,
    DagsterRun,
    DefaultSensorStatus,
    RunFailureSensorContext,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    run_failure_sensor,
    sensor,
)

from rag_lib.config import get_settings
from rag_lib.corpus_files import ReadLimits
from rag_lib.corpus_scan import FileState, decode_state, encode_state, scan
from rag_lib.errors import RagError
from rag_lib.search.notes import plural

from pipelines.checks import CHECKS
from pipelines.graph_checks import GRAPH_CHECKS
from pipelines.jobs import INGEST_JOB, ingest_job, runs_covering
from pipelines.partitions import (
    CORPUS_FILES,
    NO_ROOTS,
    PartitionSync,
    in_flight_text,
    keys_needing_runs,
    plan_ranges,
    range_tags,
    record_refused,
    run_key,
    sync_partitions,
    waiting_text,
)
from pipelines.resources import RagResource


@sensor(job=ingest_job, minimum_interval_seconds=get_settings().pipeline.sensor_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description="Scans the registered corpus roots (`rag roots list`; size, mtime, hash): new files add "
                    "partitions and runs, changed files request runs, deleted files lose their rows (their "
                    "collection's ticker profiles are rebuilt) and then their partition.")
def corpus_sensor(context: SensorEvaluationContext, rag: RagResource):
    pmap = rag.partition_map()
    existing = context.instance.get_dynamic_partitions(CORPUS_FILES)
    if not pmap.roots and not existing:
        return SkipReason(NO_ROOTS)
    previous, tick = decode_state(context.cursor)
    # An unmounted disk or a moved folder: its documents stay, and the operator is told every tick
    present = pmap.present_roots()
    missing = [r for r in pmap.roots if r not in present]
    for root in missing:
        context.log.warning("corpus root %s (%s, collection %s) is missing or not a folder: its files are not "
                            "scanned and its documents are kept; mount or restore it, or `rag roots remove %s`",
                            root.path, root.name, root.collection, root.path)
    gone_note = f"; missing root(s): {', '.join(str(r.path) for r in missing)}" if missing else ""
    files = pmap.files()
    record_refused(rag.kb(), pmap, context.log)
    limits = ReadLimits.of(rag.kb().settings)
    result = scan(files, previous, pmap.digester(limits))
    shrunk: set[str] = set()  # collections that lost documents: their ticker profiles are rebuilt

    def forget(target):
        removed = rag.runner().forget(target)
        if removed:
            shrunk.add(target.collection)
        return removed

    sync = sync_partitions(existing, pmap, files, forget, context.log, also_gone=result.deleted,
                           holding=rag.kb().store.documents_under)
    for collection in sorted(shrunk):
        # Entity linking would otherwise keep linking questions to a deleted file's ticker until the
        # next knowledge_graph run. The rows are gone already, and the next tick would not find this
        # file again: a failure is logged (the next knowledge_graph run repairs it), not raised.
        try:
            rag.kb().rebuild_profiles(collection)
        except RagError as exc:
            context.log.warning("ticker profiles of %s not rebuilt after a deletion (the next knowledge_graph "
                                "run rebuilds them): %s", collection, exc, exc_info=exc)
    # A file new or changed to the cursor may be current already (a first tick after `rag materialize`,
    # a root materialized between ticks, a file ingested while the sensor was off): only the ones a run
    # would change get one.
    seen = [k for k in result.new + result.changed if k in result.state]
    wanted = keys_needing_runs(context.instance, rag.kb(), [pmap.target(k) for k in seen])
    # A file changed again while a run over it is queued or in progress (or a first tick while `rag
    # materialize` runs) is left to that run: a second one beside it would do its work twice. That is
    # a run of every per-file stage, as ingest_files (an operator's "Materialize" of them all in the UI,
    # an asset backfill's run; a re-embed re-chunks what it has). The file stays unseen in the cursor:
    # the run may have read it before this change, so a tick after it ends looks again.
    waiting = runs_covering(context.instance, wanted, sync.ordered, INGEST_JOB, context.log.warning)
    wanted = [k for k in wanted if k not in waiting]
    state = unseen(result.state, previous, waiting)
    # The tick is in the run key: Dagster never launches a run key twice, and a file deleted and put
    # back, or reverted to an earlier version, has a path and hash some earlier run had. A retried
    # evaluation of the same tick makes the same keys (the cursor moves only when it succeeds).
    tick += 1
    runs = [
        RunRequest(
            run_key=run_key("corpus", [f"{k}@{result.hashes.get(k, '')}" for k in wanted] + [start, end, f"tick {tick}"]),
            tags={**range_tags(start, end), "rag/trigger": "corpus_sensor"},
        )
        for start, end in plan_ranges(wanted, sync.ordered, rag.kb().settings.pipeline.parallel_runs)
    ]
    if sync.removed and not runs:
        # Deleting rows launches no run, so every check would keep describing the corpus before the
        # deletion until some unrelated file's run: the index and all the checks run now.
        runs.append(RunRequest(run_key=run_key("corpus-removed", sync.removed + [f"tick {tick}"]),
                               asset_selection=[AssetKey("hnsw_index")], asset_check_keys=checks_after_deletion(),
                               tags={"rag/trigger": "corpus_sensor", "rag/reason": "files deleted"}))
    requests = sync.requests()
    if not runs:
        # Every tick that launches nothing says what it found and why (Dagster's own text for a
        # result without a reason is "Sensor function returned an empty result").
        why = skip_text(context.cursor is None, len(result.state), len(result.new), len(result.changed), sync,
                        bool(pmap.roots), waiting) + gone_note
        return SensorResult(skip_reason=SkipReason(why), dynamic_partitions_requests=requests,
                            cursor=encode_state(state, tick - 1))  # the tick counts ticks that launch
    cursor = encode_state(state, tick)
    if waiting:
        context.log.info("%s left to runs in flight: %s", plural(len(waiting), "file"), in_flight_text(waiting))
    context.log.info("new %d, changed %d (%d current already, %d in runs in flight), deleted %d, unregistered %d "
                     "→ %d run(s)", len(result.new), len(result.changed), len(seen) - len(wanted) - len(waiting),
                     len(waiting), len(sync.removed), len(sync.unrooted), len(runs))
    return SensorResult(run_requests=runs, dynamic_partitions_requests=requests, cursor=cursor)


def checks_after_deletion() -> list[AssetCheckKey]:
    """Every corpus check: a deletion changes what each one reads (documents, chunks, staged vectors,
    skips, failures, the graph's nodes and links, the index). The partitioned assets' checks look at
    the whole asset, so they run in a run that materializes no partition."""
    return [key for check in CHECKS + GRAPH_CHECKS for key in check.check_keys]


def unseen(state: dict[str, FileState], previous: dict[str, FileState], keys: Collection[str]) -> dict[str, FileState]:
    """The cursor's `state` with `keys` still to be looked at: a changed file keeps its previous size
    and mtime with no hash (the next tick hashes it and finds it changed, even back to its previous
    bytes), a new one is left out (new again next tick)."""
    kept = {k: v for k, v in state.items() if k not in keys}
    kept.update({k: (*previous[k][:2], "") for k in keys if k in previous})
    return kept


def skip_text(first: bool, files: int, new: int, changed: int, sync: PartitionSync, roots: bool,
              waiting: dict[str, DagsterRun] | None = None) -> str:
    """What a tick that launches no run did, and why nothing was launched."""
    if not roots:
        text = NO_ROOTS
    elif waiting:  # the others among the new and changed files are current already
        many, one_run = len(waiting) > 1, len({run.run_id for run in waiting.values()}) == 1
        text = (f"{waiting_text(waiting)}; nothing launched, {'they are' if many else 'it is'} looked at "
                f"again once {'that run ends' if one_run else 'those runs end'}")
        if new + changed > len(waiting):
            text += f"; {new + changed - len(waiting)} other new or changed current already"
        text = ("first tick: " if first else "") + text + f"; {plural(files, 'file')}"
    elif first:  # no cursor: every file is new to the sensor, and each is current already
        text = f"first tick: {plural(files, 'file')} current, nothing to run"
    elif new or changed:
        what = " and ".join(f"{n} {kind}" for n, kind in ((new, "new"), (changed, "changed")) if n)
        text = (f"{what} {'file' if new + changed == 1 else 'files'} current already (ingested by `rag ingest` or "
                f"another run), nothing to run; {plural(files, 'file')}")
    else:
        text = f"no changes in {plural(files, 'file')}"
    if sync.add:
        text += f"; {plural(len(sync.add), 'partition')} added"
    if sync.unrooted:
        text += f"; {plural(len(sync.unrooted), 'partition')} of unregistered roots removed (their documents are kept)"
    return text


@run_failure_sensor(name="record_run_failures", default_status=DefaultSensorStatus.RUNNING,
                    description="Records failed runs in rag_failures (shown by `rag status`).")
def record_run_failures(context: RunFailureSensorContext, rag: RagResource):
    run = context.dagster_run
    tags = run.tags
    partition = tags.get("dagster/partition") or (
        f"{tags['dagster/asset_partition_range_start']}...{tags['dagster/asset_partition_range_end']}"
        if "dagster/asset_partition_range_start" in tags else None)
    message = context.failure_event.message or "run failed"
    rag.kb().store.record_failure(f"dagster:{run.job_name}", message, run_id=run.run_id, partition=partition)
