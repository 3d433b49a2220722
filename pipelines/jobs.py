"""Jobs. Each runs in one process per run (the code location's default executor, set once in
pipelines/definitions.py): the stages share the loaded model and one connection pool, and a
many-file run stays one process, not one per file."""

from collections.abc import Callable

from dagster import AssetSelection, DagsterRun, OpExecutionContext, define_asset_job, job, op

from rag_lib.ingest.state import CHUNKS, EMBEDDINGS, STAGES, VECTORS
from rag_lib.log import get_logger

from pipelines.assets import hnsw_index
from pipelines.partitions import files_in_flight
from pipelines.resources import RagResource
from pipelines.workers import fail_if_gone

INGEST_JOB = "ingest_files"
REEMBED_JOB = "reembed"
MAINTENANCE_JOB = "index_maintenance"

log = get_logger(__name__)

ingest_job = define_asset_job(
    INGEST_JOB,
    selection=AssetSelection.groups("corpus"),
    description="Every corpus asset (raw_documents → … → vector_table, hnsw_index, knowledge_graph) for a set "
                "of files (a partition range), checks included.",
)

# Token-aware chunks depend on the model's tokenizer, so a re-embed re-chunks too (cheap, no model calls).
REEMBED_STAGES = (CHUNKS, EMBEDDINGS, VECTORS)
reembed_job = define_asset_job(
    REEMBED_JOB,
    selection=AssetSelection.assets(*REEMBED_STAGES, hnsw_index),
    description="Re-chunk, re-embed and re-publish files whose embedding settings changed, then the index.",
)

# The per-file stages a run of each job materializes (without an asset selection of its own).
JOB_STAGES = {INGEST_JOB: STAGES, REEMBED_JOB: REEMBED_STAGES}


def runs_covering(instance, keys: list[str], ordered: list[str], job_name: str,
                  say: Callable[[str], None] | None = None) -> dict[str, DagsterRun]:
    """key → the run already queued or in progress that does `job_name`'s per-file work for it
    (`files_in_flight`: the sensor's, a schedule's, a `rag materialize`'s, one from the UI), for the
    keys among `keys` that have one: the sensor, the schedules and `rag materialize` leave those to it.
    A STARTED run whose process is gone would never end: it is marked failed (said through `say`) and
    its files are not left to it."""
    if not keys:
        return {}
    busy = files_in_flight(instance, JOB_STAGES[job_name], ordered, JOB_STAGES)
    covering = {k: busy[k] for k in keys if k in busy}
    runs = {run.run_id: run for run in covering.values()}.values()
    gone = {run.run_id for run in runs if fail_if_gone(instance, run, say or log.warning, "its files get a run now")}
    return {k: run for k, run in covering.items() if run.run_id not in gone}


@op(description="REINDEX the active space's HNSW index concurrently and ANALYZE the serving tables.")
def maintain_indexes(context: OpExecutionContext, rag: RagResource) -> dict:
    store = rag.kb().store
    space = store.active_space()
    done = store.maintain_indexes(space["space"] if space else None)
    context.log.info("index maintenance: %s", done)
    return done


@job(name=MAINTENANCE_JOB, description="Weekly index maintenance.")
def index_maintenance_job():
    maintain_indexes()
