"""Sensors: the corpus watcher (new / changed / deleted files) and the run-failure recorder."""

from dagster import (
    AddDynamicPartitionsRequest,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    RunFailureSensorContext,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    run_failure_sensor,
    sensor,
)

from rag_lib.config import get_settings
from rag_lib.errors import RagError
from rag_lib.watch import decode_state, encode_state, scan

from pipelines.jobs import ingest_job
from pipelines.partitions import CORPUS_FILES, plan_ranges, range_tags, run_key
from pipelines.resources import RagResource


@sensor(job=ingest_job, minimum_interval_seconds=get_settings().pipeline.sensor_interval_seconds,
        default_status=DefaultSensorStatus.RUNNING,
        description="Scans pipeline.roots (size, mtime, hash): new files add partitions and runs, changed "
                    "files request runs, deleted files lose their rows and their partition.")
def corpus_sensor(context: SensorEvaluationContext, rag: RagResource):
    pmap = rag.partition_map()
    if not pmap.roots:
        return SkipReason("no corpus roots configured (pipeline.roots in rag.yaml)")
    previous = decode_state(context.cursor)
    result = scan(pmap, previous)
    existing = context.instance.get_dynamic_partitions(CORPUS_FILES)
    known = set(existing)
    gone = list(result.deleted)
    if not previous:  # first tick: partitions registered earlier whose files are gone
        gone += [k for k in existing if k not in result.state and k not in gone]
    if gone:
        runner = rag.runner()
        for key in gone:
            try:
                removed = runner.forget(pmap.target(key))
                context.log.info("deleted %s: %d document(s) removed", key, len(removed))
            except RagError as exc:
                context.log.warning("could not delete rows of %s: %s", key, exc)
    to_add = [k for k in result.new if k not in known]
    requests = []
    if to_add:
        requests.append(AddDynamicPartitionsRequest(CORPUS_FILES, to_add))
    to_delete = [k for k in gone if k in known]
    if to_delete:
        requests.append(DeleteDynamicPartitionsRequest(CORPUS_FILES, to_delete))
    dropped = set(to_delete)
    ordered = [k for k in existing if k not in dropped] + to_add
    wanted = result.new + result.changed
    runs = [
        RunRequest(
            run_key=run_key("corpus", [f"{k}@{result.hashes.get(k, '')}" for k in wanted] + [start, end]),
            tags={**range_tags(start, end), "rag/trigger": "corpus_sensor"},
        )
        for start, end in plan_ranges(wanted, ordered)
    ]
    cursor = encode_state(result.state)
    if not (runs or requests):
        return SensorResult(skip_reason=SkipReason(f"no changes in {len(result.state)} files"), cursor=cursor)
    context.log.info("new %d, changed %d, deleted %d → %d run(s)", len(result.new), len(result.changed),
                     len(gone), len(runs))
    return SensorResult(run_requests=runs, dynamic_partitions_requests=requests, cursor=cursor)


@run_failure_sensor(name="record_run_failures", default_status=DefaultSensorStatus.RUNNING,
                    description="Records failed runs in rag_failures (shown by `rag status`).")
def record_run_failures(context: RunFailureSensorContext, rag: RagResource):
    run = context.dagster_run
    tags = run.tags
    partition = tags.get("dagster/partition") or (
        f"{tags['dagster/asset_partition_range_start']}...{tags['dagster/asset_partition_range_end']}"
        if "dagster/asset_partition_range_start" in tags else None)
    message = context.failure_event.message or "run failed"
    rag.kb().record_failure(f"dagster:{run.job_name}", message, run_id=run.run_id, partition=partition)
