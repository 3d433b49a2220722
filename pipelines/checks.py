"""Asset checks: thin glue from rag_lib.quality results to AssetCheckResult. Each check looks at
the whole asset in Postgres (all partitions), once per run."""

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, MetadataValue, asset_check

from rag_lib.quality import QualityResult

from pipelines.assets import chunks, embeddings, hnsw_index, raw_documents, vector_table
from pipelines.resources import RagResource


def to_check_result(result: QualityResult) -> AssetCheckResult:
    metadata = {"summary": result.description, **result.metadata}
    metadata.update({name: MetadataValue.md(text) for name, text in result.markdown.items()})
    metadata = {k: (MetadataValue.json(v) if isinstance(v, list) else v) for k, v in metadata.items()}
    severity = AssetCheckSeverity.ERROR if result.severity == "error" else AssetCheckSeverity.WARN
    return AssetCheckResult(passed=result.passed, severity=severity, metadata=metadata, description=result.description)


def quality_check(rag: RagResource, name: str) -> AssetCheckResult:
    """The library's check `name`, or its result computed ahead in this run once the stages were
    done (pipelines.assets.after_stages)."""
    return to_check_result(rag.after(f"check:{name}", lambda: rag.kb().quality_check(name)))


@asset_check(asset=embeddings, blocking=True,
             description="Every staged vector has the configured model and dimension, is finite and non-zero. "
                         "Blocking: a bad vector never reaches vector_table.")
def embeddings_valid(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return quality_check(rag, "embeddings")


@asset_check(asset=vector_table,
             description="No orphans (chunks without vector, vectors without chunk, stale document hash, "
                         "documents whose file is gone) and no duplicate chunks.")
def vector_table_orphans(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return quality_check(rag, "vector_table")


# Lowest priority: it runs after the stages, by when the resource's background import of Great
# Expectations (seconds) is done.
@asset_check(asset=chunks, op_tags={"dagster/priority": "-1"},
             description="Great Expectations suite on the chunk frame: token_count in [1, model limit], "
                         "text present, unique ids; warns on too many tiny chunks.")
def chunk_sizes(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return quality_check(rag, "chunks")


# Lowest priority: it looks at the run's final skips (the chunks stage records some), so it waits for
# the stages' end; run before the chunks and embeddings steps, it would hold back their events.
@asset_check(asset=raw_documents, op_tags={"dagster/priority": "-1"},
             description="Skipped inputs, counted and listed by reason (warning).")
def skipped_inputs(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return quality_check(rag, "skipped")


# Lowest priority: it looks at every stage's final outcome in this run.
@asset_check(asset=vector_table, op_tags={"dagster/priority": "-1"},
             description="Files whose latest run failed in some stage (error): they serve their previous version "
                         "or nothing. A many-file run succeeds when some of its files fail (Dagster cannot mark "
                         "one partition of it failed); this check lists them, with the error and what to do.")
def failed_files(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return quality_check(rag, "failed")


@asset_check(asset=raw_documents, op_tags={"dagster/priority": "-1"},
             description="Documents ingested without some of their metadata (a date that is not one, a ticker "
                         "that is not a symbol), listed with the field and why (warning).")
def metadata_warnings(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return quality_check(rag, "metadata")


@asset_check(asset=hnsw_index, description="The HNSW index exists, is valid, and recall@10 vs exact search ≥ minimum.")
def hnsw_recall(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return quality_check(rag, "hnsw")


@asset_check(asset=hnsw_index, blocking=True,
             description="Retrieval quality on the configured eval set (eval.queries / eval.qrels): nDCG@10, "
                         "recall@10 and MRR@10 per query type. Warns when nDCG@10 drops more than eval.max_drop "
                         "below the last accepted run; blocking error below eval.ndcg_floor. Passes unmeasured "
                         "when no set is configured.")
def retrieval_quality(context: AssetCheckExecutionContext, rag: RagResource) -> AssetCheckResult:
    return quality_check(rag, "retrieval")


CHECKS = [embeddings_valid, vector_table_orphans, failed_files, chunk_sizes, skipped_inputs, metadata_warnings,
          hnsw_recall, retrieval_quality]
