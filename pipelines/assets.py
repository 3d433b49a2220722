"""The six stage assets (the seventh, `knowledge_graph`, is in graph_assets.py). Five are partitioned per file and run many partitions in one run
(`BackfillPolicy.single_run()`); `hnsw_index` depends on every partition of `vector_table`.

Failure policy: a bad file is `skipped` (materialized, reason in metadata). An unexpected error in
one file is recorded (rag_failures, the stage row, partition metadata `status: failed`) and the
step goes on with the other files, so one file never stops a many-file run; later stages report
`upstream_failed` for it and the nightly reconcile re-requests it. A run over a single partition
raises instead, so that partition is marked failed in the UI."""


import warnings
from collections import Counter
from typing import Any

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from rag_lib.config import get_settings
from rag_lib.corpus_scan import FileTarget
from rag_lib.errors import RagError
from rag_lib.quality import markdown_table, token_histogram
from rag_lib.versions import stage_versions

from pipelines.event_log import partition_keys_read_once
from pipelines.partitions import corpus_files
from pipelines.resources import RagResource
from rag_lib.ingest.state import StageOutcome, StageRunner

# `backfill_policy` is marked beta; we rely on it deliberately (single-run backfills).
warnings.filterwarnings("ignore", message=r".*backfill_policy.*", category=Warning)

GROUP = "corpus"


def code_versions() -> dict[str, str]:
    """The assets' code versions: the library's per-stage versions (the same function its
    fingerprint comes from), plus the HNSW build parameters. A change marks the asset and
    everything downstream out of date in the UI."""
    settings = get_settings()
    return {**stage_versions(settings),
            "hnsw_index": f"hnsw-m{settings.search.hnsw_m}-efc{settings.search.hnsw_ef_construction}"}


# Decorators need the versions when the code location loads (its settings are the process's settings).
CODE_VERSIONS = code_versions()


def _partition_metadata(outcome: StageOutcome) -> dict[str, Any]:
    meta: dict[str, Any] = {"status": outcome.status}
    for name, value in outcome.metadata.items():
        if name == "token_counts":
            meta["chunk_size_histogram"] = MetadataValue.md(token_histogram(value))
        elif name == "preview":
            rows = [{"section": r["section_path"], "tokens": r["tokens"], "text": r["text"]} for r in value]
            meta["preview"] = MetadataValue.md(markdown_table(rows, ["section", "tokens", "text"]))
        elif value is None:
            continue
        else:
            meta[name] = value
    if outcome.error:
        meta["error"] = outcome.error
    return meta


def partition_targets(rag: RagResource, keys: list[str]) -> tuple[list[FileTarget], list[StageOutcome]]:
    """The files behind the run's partition keys, and a `failed` outcome for each key that names
    no file any more (its root was removed, or the key is malformed)."""
    pmap = rag.partition_map()
    targets, failed = [], []
    for key in keys:
        try:
            targets.append(pmap.target(key))
        except RagError as exc:
            failed.append(StageOutcome(key, "failed", error=str(exc)))
    return targets, failed


def run_stage(context: AssetExecutionContext, rag: RagResource, stage: str) -> MaterializeResult:
    """Run one stage over the run's partitions, attach per-partition metadata, record failures."""
    runner = rag.runner()
    targets, outcomes = partition_targets(rag, list(context.partition_keys))
    outcomes += getattr(runner, stage)(targets)
    if stage == "raw_documents":
        rag.prepare_after_raw_documents(context.run, new_content=any(o.status == "ok" for o in outcomes))
    with partition_keys_read_once(context.instance):
        for outcome in outcomes:
            context.add_asset_metadata(_partition_metadata(outcome), partition_key=outcome.key)
    return finish(context, rag, stage, outcomes, _run_totals(rag, stage, outcomes, runner))


def _run_totals(rag: RagResource, stage: str, outcomes: list[StageOutcome], runner: StageRunner) -> dict[str, Any]:
    if stage == "embeddings":
        settings = rag.kb().settings
        return {"run_cache_hits": runner.embed_totals.get("cache_hits", 0),
                "run_embedded": runner.embed_totals.get("embedded", 0),
                "model": settings.embedding.model, "dimensions": settings.embedding.dimensions}
    if stage == "chunks":
        counts = [c for o in outcomes for c in o.metadata.get("token_counts", [])]
        return {"run_chunks": len(counts), "run_tokens": sum(counts)}
    return {}


def finish(context: AssetExecutionContext, rag: RagResource, stage: str, outcomes: list[StageOutcome],
           totals: dict[str, Any]) -> MaterializeResult:
    """A step's own metadata: counts per status and the stage's run `totals`. Failed files are
    recorded (rag_failures, for `rag status`); a run of one partition that failed raises, so the UI
    marks that partition failed, while a many-file run goes on and warns."""
    statuses = Counter(o.status for o in outcomes)
    failed = [o for o in outcomes if o.status == "failed"]
    store = rag.kb().store
    for o in failed:
        store.record_failure(f"dagster:{stage}", o.error or "failed", run_id=context.run.run_id, partition=o.key)
    summary: dict[str, Any] = {f"run_{k}": v for k, v in statuses.items()}
    summary["run_partitions"] = len(outcomes)
    summary.update(totals)
    if failed:
        summary["run_failed_partitions"] = MetadataValue.json([o.key for o in failed][:100])
        if len(outcomes) == 1:
            raise Failure(description=f"{stage} failed for {failed[0].key}: {failed[0].error}", metadata=summary)
        context.log.warning("%s: %d of %d files failed (recorded in rag_failures): %s", stage, len(failed),
                            len(outcomes), ", ".join(o.key for o in failed[:10]))
    return MaterializeResult(metadata=summary)


_partitioned = dict(partitions_def=corpus_files, backfill_policy=BackfillPolicy.single_run(), group_name=GROUP)


@asset(**_partitioned, code_version=CODE_VERSIONS["raw_documents"],
       description="The file read and recognised: format, type, metadata, content hash; bad input skipped with a reason.")
def raw_documents(context: AssetExecutionContext, rag: RagResource) -> MaterializeResult:
    return run_stage(context, rag, "raw_documents")


@asset(**_partitioned, deps=[raw_documents], code_version=CODE_VERSIONS["flattened_sections"],
       description="One text per top-level YAML section / markdown H2 (empty sections kept and marked).")
def flattened_sections(context: AssetExecutionContext, rag: RagResource) -> MaterializeResult:
    return run_stage(context, rag, "flattened_sections")


@asset(**_partitioned, deps=[flattened_sections], code_version=CODE_VERSIONS["chunks"],
       description="Token-aware chunks with context prefix, section path and source position.")
def chunks(context: AssetExecutionContext, rag: RagResource) -> MaterializeResult:
    return run_stage(context, rag, "chunks")


@asset(**_partitioned, deps=[chunks], code_version=CODE_VERSIONS["embeddings"],
       description="Vectors for the chunks (through the embedding cache), staged in rag_stage_vectors.")
def embeddings(context: AssetExecutionContext, rag: RagResource) -> MaterializeResult:
    return run_stage(context, rag, "embeddings")


@asset(**_partitioned, deps=[embeddings], code_version=CODE_VERSIONS["vector_table"],
       description="The document published into the serving tables in one transaction per document.")
def vector_table(context: AssetExecutionContext, rag: RagResource) -> MaterializeResult:
    return run_stage(context, rag, "vector_table")


@asset(deps=[vector_table], group_name=GROUP, code_version=CODE_VERSIONS["hnsw_index"],
       description="The active space's HNSW index (built after bulk loads; recall measured by its check).")
def hnsw_index(context: AssetExecutionContext, rag: RagResource) -> MaterializeResult:
    kb = rag.kb()
    built = kb.engine.publisher.ensure_index()
    space = kb.engine.provider.space
    state = kb.store.hnsw_index_state(space)
    last = state["last_build"] or {}
    return MaterializeResult(metadata={
        "index": state["index"], "space": space, "created_now": built["created"], "valid": state["valid"],
        "tables_analyzed": ", ".join(built["analyzed"]) or "none (few changes)",
        "size_bytes": state["size_bytes"], "rows_indexed": int(last.get("rows_indexed") or 0),
        "build_seconds": round(float(last.get("build_seconds") or 0.0), 3),
        "m": kb.settings.search.hnsw_m, "ef_construction": kb.settings.search.hnsw_ef_construction,
    })


ASSETS = [raw_documents, flattened_sections, chunks, embeddings, vector_table, hnsw_index]
