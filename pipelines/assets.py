"""The six assets. Five are partitioned per file and run many partitions in one run
(`BackfillPolicy.single_run()`); `hnsw_index` depends on every partition of `vector_table`.

Failure policy: a bad file is `skipped` (materialized, reason in metadata). An unexpected error in
one file is recorded (rag_failures, the stage row, partition metadata `status: failed`) and the
step goes on with the other files, so one file never stops a many-file run; later stages report
`upstream_failed` for it and the nightly reconcile re-requests it. A run over a single partition
raises instead, so that partition is marked failed in the UI."""


import hashlib
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from dagster import (
    AssetExecutionContext,
    BackfillPolicy,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)

from rag_lib.chunking import CHUNKER_VERSION
from rag_lib.config import get_settings
from rag_lib.errors import RagError
from rag_lib.stages import StageOutcome, token_histogram

from pipelines.partitions import corpus_files
from pipelines.resources import RagResource

# `backfill_policy` is marked beta; we rely on it deliberately (single-run backfills).
warnings.filterwarnings("ignore", message=r".*backfill_policy.*", category=Warning)

GROUP = "corpus"
_settings = get_settings()


def _digest(*parts: object) -> str:
    return hashlib.sha256("|".join(map(str, parts)).encode()).hexdigest()[:8]


def _sections_digest() -> str:
    path = Path(_settings.sections_file)
    return hashlib.sha256(path.read_bytes()).hexdigest()[:8] if path.is_file() else "none"


# code_version: a changed algorithm or setting marks the asset (and everything downstream) out of date.
CODE_VERSIONS = {
    "raw_documents": f"load-1-max{_settings.max_file_bytes}",
    "flattened_sections": f"flatten-1-sections-{_sections_digest()}",
    "chunks": f"chunker-{CHUNKER_VERSION}-{_digest(_settings.chunking.model_dump_json())}",
    "embeddings": f"{_settings.embedding.model}:{_settings.embedding.dimensions}:v{_settings.embedding.embed_version}",
    "vector_table": f"publish-1-{_settings.embedding.model}:{_settings.embedding.dimensions}",
    "hnsw_index": f"hnsw-m{_settings.search.hnsw_m}-efc{_settings.search.hnsw_ef_construction}",
}


def _partition_metadata(outcome: StageOutcome) -> dict[str, Any]:
    meta: dict[str, Any] = {"status": outcome.status}
    for name, value in outcome.metadata.items():
        if name == "token_counts":
            meta["chunk_size_histogram"] = MetadataValue.md(token_histogram(value))
        elif name == "preview":
            rows = ["| section | tokens | text |", "|---|---|---|"] + [
                f"| {r['section_path']} | {r['tokens']} | {r['text'].replace('|', '/').replace(chr(10), ' ')} |"
                for r in value]
            meta["preview"] = MetadataValue.md("\n".join(rows))
        elif value is None:
            continue
        else:
            meta[name] = value
    if outcome.error:
        meta["error"] = outcome.error
    return meta


def run_stage(context: AssetExecutionContext, rag: RagResource, stage: str, extra: dict[str, Any] | None = None) -> MaterializeResult:
    """Run one stage over the run's partitions, attach per-partition metadata, record failures."""
    runner = rag.runner()
    pmap = rag.partition_map()
    keys = list(context.partition_keys)
    targets, outcomes = [], []
    for key in keys:
        try:
            targets.append(pmap.target(key))
        except RagError as exc:
            outcomes.append(StageOutcome(key, "failed", error=str(exc)))
    if stage == "vector_table":
        runner.ensure_space()
    if stage == "embeddings":
        outcomes += runner.embeddings(targets)
    else:
        outcomes += [getattr(runner, stage)(t) for t in targets]
    for outcome in outcomes:
        context.add_asset_metadata(_partition_metadata(outcome), partition_key=outcome.key)
    return finish(context, rag, stage, outcomes, extra or {}, runner)


def finish(context, rag: RagResource, stage: str, outcomes: list[StageOutcome], extra: dict[str, Any], runner) -> MaterializeResult:
    statuses = Counter(o.status for o in outcomes)
    failed = [o for o in outcomes if o.status == "failed"]
    store = rag.kb().store
    for o in failed:
        store.record_failure(f"dagster:{stage}", o.error or "failed", run_id=context.run.run_id, partition=o.key)
    summary: dict[str, Any] = {f"run_{k}": v for k, v in statuses.items()}
    summary["run_partitions"] = len(outcomes)
    if stage == "embeddings":
        summary["run_cache_hits"] = runner.embed_totals.get("cache_hits", 0)
        summary["run_embedded"] = runner.embed_totals.get("embedded", 0)
        summary["model"] = rag.kb().settings.embedding.model
        summary["dimensions"] = rag.kb().settings.embedding.dimensions
    if stage == "chunks":
        counts = [c for o in outcomes for c in o.metadata.get("token_counts", [])]
        summary["run_chunks"] = len(counts)
        summary["run_tokens"] = sum(counts)
    if failed:
        summary["run_failed_partitions"] = MetadataValue.json([o.key for o in failed][:100])
        if len(outcomes) == 1:
            raise Failure(description=f"{stage} failed for {failed[0].key}: {failed[0].error}", metadata=summary)
        context.log.warning("%s: %d of %d files failed (recorded in rag_failures): %s", stage, len(failed),
                            len(outcomes), ", ".join(o.key for o in failed[:10]))
    return MaterializeResult(metadata={**summary, **extra})


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
    space = kb.provider.space
    built = kb.store.ensure_hnsw_index(space, kb.settings.embedding.dimensions)
    state = kb.store.hnsw_index_state(space)
    last = state["last_build"] or {}
    return MaterializeResult(metadata={
        "index": state["index"], "space": space, "created_now": built["created"], "valid": state["valid"],
        "size_bytes": state["size_bytes"], "rows_indexed": int(last.get("rows_indexed") or 0),
        "build_seconds": round(float(last.get("build_seconds") or 0.0), 3),
        "m": kb.settings.search.hnsw_m, "ef_construction": kb.settings.search.hnsw_ef_construction,
    })


ASSETS = [raw_documents, flattened_sections, chunks, embeddings, vector_table, hnsw_index]
