"""Schedules (cron strings from settings.pipeline.schedules). Plain @schedule functions returning
run requests: build_schedule_from_partitioned_job refuses dynamic partitions."""

from dagster import DefaultScheduleStatus, RunRequest, ScheduleEvaluationContext, SkipReason, schedule

from rag_lib.config import get_settings
from rag_lib.errors import first_of

from pipelines.jobs import MAINTENANCE_JOB, index_maintenance_job, ingest_job, reembed_job, runs_covering
from pipelines.partitions import (CORPUS_FILES, NO_ROOTS, in_flight_text, plan_ranges, plan_runs,
                                  range_tags, record_refused, run_key, sync_partitions)
from pipelines.resources import RagResource
from rag_lib.ingest.state import plan_reconcile

CRONS = get_settings().pipeline.schedules


def reconcile_requests(context: ScheduleEvaluationContext, rag: RagResource, job_name: str, only_stale: bool,
                       trigger: str) -> list[RunRequest] | SkipReason:
    """Sync the partitions with the registered roots, then request runs (one per range) for the
    files the library's reconcile plan names (missing/failed/stale, or only stale) that no run
    queued or in progress covers already."""
    pmap = rag.partition_map()
    existing = context.instance.get_dynamic_partitions(CORPUS_FILES)
    if not pmap.roots:
        return SkipReason(NO_ROOTS + (f"; {len(existing)} partitions of roots no longer registered keep their "
                                      "documents" if existing else ""))
    if mismatch := rag.kb().space_mismatch():  # every run would be refused (a `rag reembed` switched spaces)
        return SkipReason(f"{mismatch}; nothing launched")
    files = pmap.files()
    record_refused(rag.kb(), pmap, context.log)
    # new files become partitions (a run needs them); nothing is removed here (sync_partitions)
    sync = sync_partitions(existing, pmap, files, None, context.log)
    sync.apply(context.instance)
    on_disk = [pmap.target(k) for k in files]
    if only_stale:
        plan = plan_reconcile(rag.kb().store, rag.kb().settings, on_disk, rag.kb().settings.pipeline_fingerprint())
        unmaterialized: list[str] = []
    else:  # also files never materialized on this instance, as `rag materialize` runs them
        plan, unmaterialized = plan_runs(context.instance, rag.kb(), on_disk)
    wanted = plan.stale if only_stale else sorted(set(plan.keys) | set(unmaterialized))
    if plan.held:  # a run would skip them again: said on every tick, not left to look current
        context.log.warning("%s", held_text(plan.held))
    if not wanted:
        current = f"all {len(on_disk)} files are current" if not plan.held else \
            f"{len(on_disk) - len(plan.held)} of {len(on_disk)} files are current"
        return SkipReason(current + (
            f" (embedded with {rag.kb().settings.embedding.model}, embed_version "
            f"{rag.kb().settings.embedding.embed_version})" if only_stale else "")
            + (f"; {held_text(plan.held)}" if plan.held else ""))
    # A run still queued or running for some of these files (an earlier tick's, the sensor's, a
    # backfill's, an operator's "Materialize" in the UI) does their work when it materializes the
    # job's per-file stages: a second one beside it would do it twice. ingest_files materializes
    # every corpus asset, so it covers a re-embed's work too.
    waiting = runs_covering(context.instance, wanted, sync.ordered, job_name, context.log.warning)
    if waiting:
        wanted = [k for k in wanted if k not in waiting]
        if not wanted:
            return SkipReason(f"all {len(waiting)} files needing a run are in runs already queued or in progress: "
                              f"{in_flight_text(waiting)}; nothing launched")
        context.log.info("%d files needing a run are left to runs in flight: %s", len(waiting), in_flight_text(waiting))
    tick = context.scheduled_execution_time.isoformat() if context.scheduled_execution_time else ""
    return [
        RunRequest(run_key=run_key(trigger, wanted + [tick, start, end]), job_name=job_name,
                   tags={**range_tags(start, end), "rag/trigger": trigger,
                         "rag/missing": str(len(plan.missing)), "rag/failed": str(len(plan.failed)),
                         "rag/stale": str(len(plan.stale)), "rag/unmaterialized": str(len(unmaterialized)),
                         "rag/held": str(len(plan.held))})
        for start, end in plan_ranges(wanted, sync.ordered, rag.kb().settings.pipeline.parallel_runs)
    ]


def held_text(held: list[str], limit: int = 3) -> str:
    """The files a run cannot bring up to date (`ReconcilePlan.held`) and what to do about them."""
    named = first_of(held, limit)
    return (f"{len(held)} served from an older version, as their newest edit is skipped (a run skips it again, "
            f"so what they serve keeps the settings and vectors it was published with): {named}; fix them and run again, or rag delete them "
            "(rag status names what each serves)")


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
