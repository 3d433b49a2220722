"""The six stage assets (the seventh, `knowledge_graph`, is in graph_assets.py). Five are partitioned per file and run many partitions in one run
(`BackfillPolicy.single_run()`); `hnsw_index` depends on every partition of `vector_table`.
In a run that materializes several of the per-file stages, the first one's step runs them all
with the library's overlapped ingest engine (`pipelined_stages`) and each later step reports what
was done for its asset: a run goes at the library's pace, not at the sum of its stages.

Failure policy: a bad file is `skipped` (materialized, reason in metadata). An unexpected error in
one file is recorded (rag_failures, the stage row, partition metadata `status: failed`) and the
step goes on with the other files, so one file never stops a many-file run; later stages report
`upstream_failed` for it and the nightly reconcile re-requests it. A run over a single partition
raises instead, so that partition is marked failed in the UI."""


import warnings
from collections import Counter
from collections.abc import Callable
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
from rag_lib.errors import ConfigError, RagError
from rag_lib.log import get_logger
from rag_lib import quality
from rag_lib.quality import markdown_table, token_histogram
from rag_lib.versions import stage_versions

from pipelines.event_log import partition_keys_read_once
from pipelines.partitions import corpus_files
from pipelines.resources import (RagResource, StagesAhead, StagesStopped, _selects, _selects_check,
                                 steps_share_process)
from rag_lib.ingest import run as ingest_run
from rag_lib.ingest.overlap import overlapped
from rag_lib.ingest.state import CHUNKS, EMBEDDINGS, RAW, STAGES, VECTORS, StageOutcome, StageRunner

# `backfill_policy` is marked beta; we rely on it deliberately (single-run backfills).
warnings.filterwarnings("ignore", message=r".*backfill_policy.*", category=Warning)

GROUP = "corpus"
UNKNOWN_VERSION = "unknown"  # what a version the embedding settings cannot give reads (`code_versions`)
log = get_logger(__name__)


def code_versions() -> dict[str, str]:
    """The assets' code versions: the library's per-stage versions (the same function its
    fingerprint comes from), plus the HNSW build parameters. A change marks the asset and
    everything downstream out of date in the UI. Embedding settings that name an unreadable file
    (embedding.tokenizer_path, embedding.model_path) make the chunks' and vectors' versions
    UNKNOWN_VERSION: the location still loads, and the error is said where it stops something (a
    run's step, a sensor or schedule tick, a `rag` command), where it used to fail to load and
    take the whole UI with it."""
    settings = get_settings()
    try:
        versions = stage_versions(settings)
    except ConfigError as exc:  # logged at INFO: each use says it (`rag materialize` would say it twice)
        log.info("%s; the chunks' and vectors' code versions are unknown until it is fixed, and runs "
                    "that chunk or embed fail with this error", exc)
        versions = stage_versions(settings, chunker=UNKNOWN_VERSION, model=UNKNOWN_VERSION)
    return {**versions, "hnsw_index": f"hnsw-m{settings.search.hnsw_m}-efc{settings.search.hnsw_ef_construction}"}


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


def pipelined_stages(context: AssetExecutionContext, rag: RagResource, first: str, targets: list[FileTarget]) -> None:
    """Start the per-file stages this run selects from `first` on, as the library's ingest runs
    them (`rag_lib.ingest.run`: rounds of files, reading-to-chunking, encoding and publishing each
    on a thread of its own, overlapping), on a thread of the run (`RagResource.run_stages_ahead`);
    the outcomes go to `rag.ahead`, and each stage's own step reports them as its materializations
    as soon as its stage is done for every file (`StagesAhead.wait_for`): the steps of the stages
    before embedding write their files' events while the encoder works, not after it. Run one
    stage per step, a Dagster run was the sum of its steps (cold: +10 s over the library,
    docs/scale.md).

    `vector_table` is published ahead only when no staged vector fails the blocking
    `embeddings_valid` check's rules (`store.bad_staged_vectors`) before the run starts: the vectors
    this run stages pass them already (the embedder refuses unusable ones, and that file fails), so
    the check can only fail on rows staged before, and then `vector_table` waits for it in its own
    step, as without running ahead."""
    stages = _chain(context.run, first)
    if len(stages) < 2 or not targets:
        return
    runner = rag.runner()
    kb = rag.kb()
    cfg = kb.settings.embedding
    if VECTORS in stages and kb.store.bad_staged_vectors(cfg.key, cfg.dimensions)["bad"]:
        stages.remove(VECTORS)
    found = {stage: rag.ahead.setdefault(stage, {}) for stage in stages}
    out: dict[str, dict[str, StageOutcome]] = {t.key: {} for t in targets}
    run, keys = context.run, list(context.partition_keys)
    later = after_stages(run, rag, stages, keys)
    ahead = StagesAhead(stages, [t.key for t in targets], found)

    def step(names: tuple[str, ...]):
        def work(files: list[FileTarget]) -> None:
            if ahead.stop.is_set():
                raise StagesStopped("the run ended before its stages")
            for stage in names:
                runner.run_all(files, (stage,), out)
                found[stage].update((t.key, out[t.key][stage]) for t in files)
                ahead.progressed()
                if stage == RAW:  # files with new content: the model loads on a thread meanwhile
                    rag.prepare_after_raw_documents(run, any(out[t.key][RAW].status == "ok" for t in files))
        return work

    steps = [step(names) for names in (tuple(s for s in group if s in stages) for group in ingest_run.STEPS) if names]
    if CHUNKS in stages and EMBEDDINGS in stages:  # a round chunked is queued for the encoder at once, as in rag ingest
        steps.insert(1, runner.encode_ahead)
    rounds = ingest_run.in_rounds(targets)  # the library's rounds: small first and last

    def work() -> None:
        try:
            for done in overlapped(rounds, steps, ingest_run.ROUNDS_IN_FLIGHT):
                runner.release(done)  # as `rag ingest`: the run holds only the files in flight
        finally:
            runner.abandon_started()
        if len(targets) > 1 or not any(o.status == "failed" for o in out[targets[0].key].values()):
            # (a one-file run that failed stops at its step: `finish`)
            for name, later_work, lane in later:
                rag.start_after(name, later_work, lane=lane)

    rag.run_stages_ahead(ahead, work)


def after_stages(run, rag: RagResource, stages: list[str], keys: list[str]) -> list[tuple[str, Callable[[], Any], str]]:
    """What the run's later steps would do after the stages, as (name, work, lane): started on
    threads of the run once the stages are done (`RagResource.start_after`), while the main thread
    writes the stage steps' per-file events (seconds of Python): the HNSW index build and the ticker
    profiles' rebuild (as `rag ingest` ends) with `knowledge_graph`'s per-file graph reports, the
    recall and orphan checks and `knowledge_graph`'s five checks (queries in Postgres), and the
    chunk_sizes check, whose frame, when not validated before, is validated in the validation
    process (importing Great Expectations, seconds of CPU: started at idle priority with the run
    when it encodes new chunks, `RagResource.setup_for_execution`, else by `rag materialize`
    before importing Dagster, else then, not beside the encoding, which uses both cores). The
    steps take the results (`RagResource.after`) in their turn; what they look at is final once the
    stages are done (the graph reports and profiles are read by none of these checks;
    `retrieval_quality`, which searches with the profiles, runs in its own step)."""
    kb = rag.kb()
    later: list[tuple[str, Callable[[], Any], str]] = []
    if CHUNKS in stages and _selects_check(run, CHUNKS, "chunk_sizes") and quality.validates_beside():
        later.append(("check:chunks", lambda: quality.check_chunks(kb.store, kb.settings, kb.provider.max_tokens,
                                                                   preload=True), "chunks"))
    if VECTORS not in stages:
        return later
    # Two lanes side by side: the index build runs in PostgreSQL (about one core) while the graph
    # lane's per-file reports and the profiles' encoding take the other; one after the other they
    # were the run's longest chain after the stages (docs/scale.md, issue 32 item 2).
    if _selects(run, "hnsw_index"):
        later.append(("hnsw_index", kb.engine.publisher.ensure_index, "index"))
        if _selects_check(run, "hnsw_index", "hnsw_recall"):  # needs the index
            later.append(("check:hnsw", lambda: kb.quality_check("hnsw"), "index"))
    if _selects(run, "knowledge_graph"):
        from pipelines.graph_assets import GRAPH, graph_work  # it imports this module

        later.append((GRAPH, lambda: graph_work(rag, keys), "graph"))
    if _selects_check(run, VECTORS, "vector_table_orphans"):
        later.append(("check:vector_table", lambda: kb.quality_check("vector_table"), "graph"))
    from rag_lib.graph.checks import GRAPH_CHECKS

    for name in GRAPH_CHECKS:  # queries over the graph, which vector_table wrote with the chunks
        if _selects_check(run, "knowledge_graph", f"graph_{name}"):
            later.append((f"graph_check:{name}", lambda name=name: kb.graph_check(name), "graph"))
    return later


def _chain(run, first: str) -> list[str]:
    """`first` and the per-file stages right after it that the run materializes too (one process)."""
    if not steps_share_process(run):
        return [first]
    chain = [first]
    for stage in STAGES[STAGES.index(first) + 1:]:
        if not _selects(run, stage):
            break
        chain.append(stage)
    return chain


def run_stage(context: AssetExecutionContext, rag: RagResource, stage: str) -> MaterializeResult:
    """Run one stage over the run's partitions (or report what the run's first stage step did for
    it ahead, `pipelined_stages`), attach per-partition metadata, record failures."""
    runner = rag.runner()
    targets, outcomes = partition_targets(rag, list(context.partition_keys))
    ahead = rag.ahead.setdefault(stage, {})
    if rag.stages_ahead is None and not ahead:
        pipelined_stages(context, rag, stage, targets)
    if rag.stages_ahead is not None:  # this stage's outcomes, or the stages' end (a stage not run ahead)
        rag.stages_ahead.wait_for(stage)
    todo = [t for t in targets if t.key not in ahead]
    if todo:  # the stage was not run ahead (e.g. vector_table behind a failing check)
        ahead.update((o.key, o) for o in getattr(runner, stage)(todo))
    outcomes += [ahead[t.key] for t in targets]
    if stage == "raw_documents" and todo:
        rag.prepare_after_raw_documents(context.run, new_content=any(o.status == "ok" for o in outcomes))
    with partition_keys_read_once(context.instance):
        for outcome in outcomes:
            context.add_asset_metadata(_partition_metadata(outcome), partition_key=outcome.key)
    return finish(context, rag, stage, outcomes, _run_totals(rag, stage, outcomes, runner))


def _run_totals(rag: RagResource, stage: str, outcomes: list[StageOutcome], runner: StageRunner) -> dict[str, Any]:
    if stage == "embeddings":
        settings = rag.kb().settings
        # counted as `rag ingest` and `rag reembed` count them: chunks and the distinct texts embedded apart
        return {**{f"run_{name}": count for name, count in runner.embed_totals.items()},
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
    collections = {t.key: t.collection for t in partition_targets(rag, [o.key for o in failed])[0]} if failed else {}
    for o in failed:
        store.record_failure(f"dagster:{stage}", o.error or "failed", run_id=context.run.run_id, partition=o.key,
                             collection=collections.get(o.key))
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
    built = rag.after("hnsw_index", kb.engine.publisher.ensure_index)  # built ahead: after_stages
    space = kb.engine.provider.space
    state = kb.store.hnsw_index_state(space)
    last = state["last_build"] or {}
    return MaterializeResult(metadata={
        "index": state["index"], "space": space, "created_now": built["created"], "valid": state["valid"],
        "tables_analyzed": ", ".join(built["analyzed"]) or "none (few changes)",
        "size_bytes": state["size_bytes"], "rows": state["rows"],
        # the last build's own figures: rows added later went in one by one
        "rows_at_last_build": int(last.get("rows_indexed") or 0),
        "built_at": str(last.get("built_at") or ""), "build_seconds": round(float(last.get("build_seconds") or 0.0), 3),
        "m": kb.settings.search.hnsw_m, "ef_construction": kb.settings.search.hnsw_ef_construction,
    })


ASSETS = [raw_documents, flattened_sections, chunks, embeddings, vector_table, hnsw_index]
