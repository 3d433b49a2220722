"""Schedules (cron strings from settings.pipeline.schedules). Plain @schedule functions returning
run requests: build_schedule_from_partitioned_job refuses dynamic partitions."""

from dagster import DefaultScheduleStatus, RunRequest, ScheduleEvaluationContext, SkipReason, schedule

from rag_lib.config import get_settings
from rag_lib.errors import RagError
from rag_lib.watch import FileTarget

from pipelines.jobs import MAINTENANCE_JOB, index_maintenance_job, ingest_job, reembed_job
from pipelines.partitions import CORPUS_FILES, plan_ranges, range_tags, run_key
from pipelines.resources import RagResource
from pipelines.stage_runner import plan_reconcile

CRONS = get_settings().pipeline.schedules


def sync_partitions(context: ScheduleEvaluationContext, rag: RagResource) -> tuple[list[FileTarget], list[str]]:
    """Rescan the roots: register files without a partition, forget files that are gone.
    Returns the files on disk and the partition order."""
    pmap = rag.partition_map()
    on_disk = [pmap.target(k) for k in pmap.walk()]
    keys = {t.key for t in on_disk}
    instance = context.instance
    existing = instance.get_dynamic_partitions(CORPUS_FILES)
    missing = [t.key for t in on_disk if t.key not in set(existing)]
    if missing:
        instance.add_dynamic_partitions(CORPUS_FILES, missing)
    runner = rag.runner()
    for key in [k for k in existing if k not in keys]:
        try:
            runner.forget(pmap.target(key))
        except RagError as exc:
            context.log.warning("could not delete rows of %s: %s", key, exc)
        instance.delete_dynamic_partition(CORPUS_FILES, key)
    return on_disk, instance.get_dynamic_partitions(CORPUS_FILES)


def reconcile_requests(context: ScheduleEvaluationContext, rag: RagResource, job_name: str, only_stale: bool,
                       trigger: str) -> list[RunRequest] | SkipReason:
    if not rag.partition_map().roots:
        return SkipReason("no corpus roots configured (pipeline.roots in rag.yaml)")
    on_disk, ordered = sync_partitions(context, rag)
    plan = plan_reconcile(rag.kb(), on_disk, rag.kb().engine.fingerprint)
    wanted = plan.stale if only_stale else plan.keys
    if not wanted:
        return SkipReason(f"all {len(on_disk)} files are current")
    tick = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else ""
    return [
        RunRequest(run_key=run_key(trigger, wanted + [tick, start, end]), job_name=job_name,
                   tags={**range_tags(start, end), "rag/trigger": trigger,
                         "rag/missing": str(len(plan.missing)), "rag/failed": str(len(plan.failed)),
                         "rag/stale": str(len(plan.stale))})
        for start, end in plan_ranges(wanted, ordered)
    ]


@schedule(cron_schedule=CRONS.reconcile, job=ingest_job, default_status=DefaultScheduleStatus.RUNNING,
          description="Nightly: rescan the roots and materialize missing, failed and stale files.")
def nightly_reconcile(context: ScheduleEvaluationContext, rag: RagResource):
    return reconcile_requests(context, rag, ingest_job.name, only_stale=False, trigger="nightly_reconcile")


@schedule(cron_schedule=CRONS.reembed, job=reembed_job, default_status=DefaultScheduleStatus.RUNNING,
          description="Re-embed files whose vectors were made with another model or embed_version.")
def reembed_schedule(context: ScheduleEvaluationContext, rag: RagResource):
    return reconcile_requests(context, rag, reembed_job.name, only_stale=True, trigger="reembed_schedule")


@schedule(cron_schedule=CRONS.index_maintenance, job=index_maintenance_job,
          default_status=DefaultScheduleStatus.RUNNING, description="Weekly REINDEX/ANALYZE.")
def index_maintenance_schedule(context: ScheduleEvaluationContext):
    return RunRequest(run_key=f"{MAINTENANCE_JOB}-{context.scheduled_execution_time}")
