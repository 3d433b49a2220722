"""Data-quality checks over the pipeline's tables, as plain results (the orchestrator maps them to
its own check results): staged vectors, serving-table orphans and duplicates, chunk sizes (a
Great Expectations suite on the chunk frame), skipped inputs, and HNSW validity and recall."""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import multiprocessing
import multiprocessing.util
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_lib.corpus_files import file_gone
from rag_lib.errors import first_of
from rag_lib.config import Settings
from rag_lib.log import get_logger
from rag_lib.store import Store

log = get_logger(__name__)


@dataclass
class QualityResult:
    """Outcome of one check: `severity` says how much a failure matters (error | warn)."""

    passed: bool
    severity: str
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)  # numbers, short text, id lists
    markdown: dict[str, str] = field(default_factory=dict)  # tables/histograms for people


def token_histogram(counts: list[int], edges: tuple[int, ...] = (0, 16, 32, 64, 128, 192, 256, 512)) -> str:
    """A markdown table of chunk token counts per bucket."""
    rows = ["| tokens | chunks |", "|---|---|"]
    for lo, hi in zip(edges, edges[1:] + (None,)):
        n = sum(1 for c in counts if c >= lo and (hi is None or c < hi))
        rows.append(f"| {lo}–{hi - 1 if hi else '∞'} | {n} |")
    return "\n".join(rows)


CELL_CHARS = 240  # a warning names its field, the value and what it costs: about two lines of the UI


def _cell(value: Any) -> str:
    """One table cell: line breaks folded, cut at CELL_CHARS with an ellipsis, pipes escaped."""
    text = str(value).replace("\n", " ")
    text = text if len(text) <= CELL_CHARS else text[:CELL_CHARS - 1] + "…"
    return text.replace("|", "\\|")


def markdown_table(rows: list[dict[str, Any]], columns: list[str], limit: int = 50) -> str:
    """`rows` as a markdown table of `columns` (see `_cell`; at most `limit` rows): the one table
    builder behind check and asset metadata."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows[:limit]:
        lines.append("| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |")
    if len(rows) > limit:
        lines.append(f"| … {len(rows) - limit} more | " + " | " * (len(columns) - 1))
    return "\n".join(lines)


def check_embeddings(store: Store, settings: Settings) -> QualityResult:
    """Every staged vector has the configured model and dimension, is finite and non-zero."""
    cfg = settings.embedding
    found = store.bad_staged_vectors(cfg.key, cfg.dimensions)
    bad = found["bad"]
    by_problem = Counter(r["problem"] for r in bad)
    return QualityResult(
        passed=not bad,
        severity="error",
        description=(f"{found['checked']} staged vectors are {cfg.space}, finite and non-zero"
                     if not bad else f"{len(bad)} of {found['checked']} staged vectors are unusable"),
        metadata={"checked": found["checked"], "bad": len(bad), "model": cfg.key, "dimensions": cfg.dimensions,
                  **{f"bad_{k}": v for k, v in by_problem.items()},
                  "offending_ids": [f"{r['path']}:{r['chunk_id']} ({r['problem']})" for r in bad[:50]]},
        markdown={"offenders": markdown_table(bad, ["path", "chunk_id", "problem", "model", "actual_dims"])} if bad else {},
    )


def check_vector_table(store: Store, space: str) -> QualityResult:
    """No orphans (chunks without vector, vectors without chunk, stale document hashes, documents
    whose file is gone) and no duplicate chunks in the serving table."""
    found = store.serving_orphans(space)
    gone = [f"{d['collection']}:{d['path']}" for d in store.document_sources()
            if d["source_path"] and file_gone(d["source_path"])]
    found["documents_without_file"] = {"count": len(gone), "ids": gone[:50]}
    problems = {k: v for k, v in found.items() if isinstance(v, dict) and v["count"]}
    meta: dict[str, Any] = {"chunks": found["chunks"], "vectors": found["vectors"], "space": space}
    for name, value in found.items():
        if isinstance(value, dict):
            meta[name] = value["count"]
            if value["count"]:
                meta[f"{name}_ids"] = value["ids"]
                if value.get("documents"):
                    meta[f"{name}_documents"] = value["documents"]

    def said(name: str, value: dict[str, Any]) -> str:
        docs = value.get("documents") or []
        where = f" (in {', '.join(docs[:3])}{' and more' if len(docs) > 3 else ''})" if docs else ""
        return f"{value['count']} {name.replace('_', ' ')}{where}"

    damaged = any(value.get("documents") for value in problems.values())
    return QualityResult(
        passed=not problems,
        severity="error",
        description="no orphaned or duplicate rows" if not problems else
        "; ".join(said(k, v) for k, v in problems.items()) + (
            "; publish those documents again: `rag ingest PATH --force`, or materialize their partitions with the "
            "rag resource's `force: true` (an unchanged file is otherwise skipped)" if damaged else ""),
        metadata=meta,
    )


FRAME_COLUMNS = ["chunk_id", "token_count", "text_chars"]


# A process that imports Great Expectations (seconds of imports) beside the caller, so that the
# import runs on another core while the caller works; validations then run there. Importing it
# in a background thread instead races with the caller's own first imports (partially
# initialised modules), so it is a process.
_validator: ProcessPoolExecutor | None = None
_validator_used = False  # whether a frame was submitted to it (see `discard_unused_validator`)
_validator_idle = False  # whether it runs at idle priority (`preload_great_expectations(idle=True)`)


PARENT_CHECK_SECONDS = 1.0


def _exit_with_parent() -> None:
    """End this validation process once its caller is gone. A caller killed outright (SIGKILL, the
    OOM killer: a Dagster run worker stopped that way) runs no finaliser, and the pool's queue never
    reads end-of-file (each process holds both of its pipe's ends), so the worker slept on as an
    orphan holding ~270 MB."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_SECONDS)
        os._exit(0)

    threading.Thread(target=watch, name="rag-validator-parent", daemon=True).start()


def _import_great_expectations() -> None:
    from rag_lib.shutdown import skip_final_collections

    _exit_with_parent()
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations  # noqa: F401

    skip_final_collections()


def can_validate_at_idle_priority() -> bool:
    """Whether a validation process may import at idle priority (`SCHED_IDLE`, Linux) and be put
    back to normal priority when a frame is to be validated: leaving `SCHED_IDLE` needs
    CAP_SYS_NICE (root here) or a RLIMIT_NICE of 20 (nice 0 allowed)."""
    import resource

    if not hasattr(os, "SCHED_IDLE") or not hasattr(resource, "RLIMIT_NICE"):
        return False
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


def _spawn_reimports_safely() -> bool:
    """Whether a spawned child may re-import this process's `__main__`: yes for installed entry
    points (`rag`, `dagster`, `pytest`), interactive sessions and scripts that keep their work
    under `if __name__ == "__main__"`; no for a script whose top level does its work, which would
    run again in the child (spawn refuses that, and a broken validation process would fail the
    chunk check)."""
    main = sys.modules.get("__main__")
    origin = getattr(getattr(main, "__spec__", None), "origin", None) or getattr(main, "__file__", None)
    if origin is None:
        return True
    path = Path(origin).resolve()
    return path.is_relative_to(Path(sys.prefix).resolve()) or _guards_its_work(path)


def _guards_its_work(script: Path) -> bool:
    """Whether a script's top level has an `if __name__ == "__main__":` block."""
    try:
        tree = ast.parse(script.read_text())
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return False
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in tree.body)


def preload_great_expectations(idle: bool = False) -> None:
    """Start the validation process (importing Great Expectations) now, when a spawned process may
    re-import the caller's main module (`_spawn_reimports_safely`); later chunk-frame validations in
    this process run there. Otherwise validations run in this process. Idempotent.

    `idle` (when `can_validate_at_idle_priority`): the process imports at idle priority, on CPU
    that nothing else wants, and is put back to normal priority when a frame is to be validated:
    a Dagster run starts it with its encoding (both cores busy, a few percent idle between
    mini-batches: about the import's seconds over a cold run of the shared corpus) instead of
    after it, where the chunk_sizes check waited for the import (docs/scale.md, issue 32 item 2)."""
    global _validator, _validator_idle
    if _validator is None and _spawn_reimports_safely():
        idle = idle and can_validate_at_idle_priority()
        _validator = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                         initializer=_import_great_expectations)
        _validator.submit(int)  # start the worker now, not on first use
        _validator_idle = idle
        if idle:  # its whole start (Python, then the import) only on CPU nothing else wants
            for process in _workers(_validator):
                os.sched_setscheduler(process.pid, os.SCHED_IDLE, os.sched_param(0))
        # A spawned process (a Dagster run worker) joins its children before interpreter exit:
        # stop the worker first, or the caller never exits.
        multiprocessing.util.Finalize(None, _stop_validator, exitpriority=100)


def wait_for_validator() -> None:
    """Wait until the validation process has imported Great Expectations (none started: return)."""
    if _validator is not None:
        _validator.submit(int).result()  # queued behind its initializer, the import


def _stop_validator() -> None:
    global _validator, _validator_used, _validator_idle
    if _validator is not None:
        if _validator_idle and not _validator_used:  # its import at idle priority may never end on a busy machine
            _kill_workers(_validator)
        _validator.shutdown(wait=True, cancel_futures=True)
        _validator, _validator_used, _validator_idle = None, False, False


def _workers(pool: ProcessPoolExecutor) -> list[multiprocessing.Process]:
    # ProcessPoolExecutor has no public way to reach a worker that is still in its initializer
    # (Python 3.14 adds terminate_workers): its private process table, empty when it has none.
    return list((getattr(pool, "_processes", None) or {}).values())


def _kill_workers(pool: ProcessPoolExecutor) -> None:
    # A shutdown alone waits for the import to finish. Killed, not terminated: under pytest-xdist a
    # terminated worker sometimes exited 0 after its import (its SIGTERM ignored, probably a
    # parent's SIG_IGN, which children inherit), so the shutdown waited for the import; SIGKILL
    # cannot be ignored.
    for process in _workers(pool):
        process.kill()


def _to_normal_priority() -> None:
    """Put an idle-priority validation process back to normal priority (a frame is to be
    validated now: the run waits for it)."""
    global _validator_idle
    if _validator is None or not _validator_idle:
        return
    for process in _workers(_validator):
        try:
            os.sched_setscheduler(process.pid, os.SCHED_OTHER, os.sched_param(0))
        except ProcessLookupError:  # gone: the submit below raises BrokenProcessPool, as before
            pass
    _validator_idle = False


def discard_unused_validator() -> None:
    """Stop the validation process if no frame was validated in it: `rag materialize` starts it
    before it knows whether a run here will validate a new frame (its import then overlaps
    Dagster's). Killed, not shut down: a shutdown waits for the import to finish (seconds),
    and the process exits right after."""
    global _validator, _validator_idle
    if _validator is None or _validator_used:
        return
    pool, _validator, _validator_idle = _validator, None, False
    _kill_workers(pool)
    pool.shutdown(wait=True, cancel_futures=True)


VALIDATED = "chunk_frame_validated.json"  # under `cache`: the last frame validated and its results


def _frame_digest(rows: list[dict[str, Any]], min_tokens: int, max_tokens: int) -> str:
    """The frame's rows, the limits and the suite's code: what the validation's results depend on."""
    digest = hashlib.sha256(json.dumps([[r[c] for c in FRAME_COLUMNS] for r in rows], separators=(",", ":")).encode())
    digest.update(f"{len(rows)}:{min_tokens}:{max_tokens}:".encode())
    digest.update(inspect.getsource(_validate_chunk_frame).encode())
    return digest.hexdigest()


def _validated(cache: Path, digest: str) -> list[dict[str, Any]] | None:
    try:
        saved = json.loads((cache / VALIDATED).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # unreadable: validate again (and overwrite it)
        log.warning("ignoring %s: %s", cache / VALIDATED, exc)
        return None
    return saved.get("results") if saved.get("digest") == digest else None


def validates_beside() -> bool:
    """Whether a validation would run in the validation process (started, or startable: see
    `preload_great_expectations`), so never imports Great Expectations in this process."""
    return _validator is not None or _spawn_reimports_safely()


def validate_chunk_frame(rows: list[dict[str, Any]], min_tokens: int, max_tokens: int, cache: Path | None = None,
                         preload: bool = False) -> list[dict[str, Any]]:
    """Run the Great Expectations suite on the frame of `rows` (in the preloaded validation process
    if one was started; with `preload`, starting it when the frame must be validated); one dict per
    expectation (type, success, counts, samples). With `cache` (a folder), the results of the same
    frame validated last time are returned without Great Expectations: a forced re-run of an
    unchanged corpus (its chunks the same) paid seconds of CPU importing it again."""
    global _validator_used
    digest = _frame_digest(rows, min_tokens, max_tokens) if cache is not None else ""
    if cache is not None and (results := _validated(cache, digest)) is not None:
        return results
    if preload:
        preload_great_expectations()
    if _validator is not None:
        _validator_used = True
        _to_normal_priority()
        results = _validator.submit(_validate_chunk_frame, rows, min_tokens, max_tokens).result()
    else:
        results = _validate_chunk_frame(rows, min_tokens, max_tokens)
    if cache is not None:
        try:
            cache.mkdir(parents=True, exist_ok=True)
            partial = cache / f"{VALIDATED}.{os.getpid()}"
            partial.write_text(json.dumps({"digest": digest, "results": results}))
            partial.replace(cache / VALIDATED)  # whole or not at all, for a concurrent run's check
        except OSError as exc:  # the check's result stands; the next run validates again
            log.warning("could not keep the chunk frame's validation in %s: %s", cache, exc)
    return results


def _validate_chunk_frame(rows: list[dict[str, Any]], min_tokens: int, max_tokens: int) -> list[dict[str, Any]]:
    _import_great_expectations()
    import great_expectations as gx  # slow import (seconds): only when the check runs, or preloaded
    import pandas as pd

    frame = pd.DataFrame(rows, columns=FRAME_COLUMNS)

    context = gx.get_context(mode="ephemeral")
    try:
        context.variables.progress_bars = {"globally": False}
    except Exception:  # noqa: BLE001  (cosmetic; older/newer config shapes differ)
        pass
    batch = (context.data_sources.add_pandas("rag").add_dataframe_asset("chunks")
             .add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": frame}))
    suite = gx.ExpectationSuite(name="chunk_sizes")
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeBetween(
        column="token_count", min_value=min_tokens, max_value=max_tokens))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToNotBeNull(column="text_chars"))  # text present
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeBetween(column="text_chars", min_value=1))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeUnique(column="chunk_id"))
    result = batch.validate(suite)
    return [{
        "expectation": r.expectation_config.type,
        "column": r.expectation_config.kwargs.get("column"),
        "success": bool(r.success),
        "unexpected": int(r.result.get("unexpected_count") or 0),
        "sample": [str(v) for v in (r.result.get("partial_unexpected_list") or [])[:5]],
    } for r in result.results]


def validation_cache(settings: Settings) -> Path:
    """Where `check_chunks` keeps the last validated chunk frame's results."""
    return settings.home / "quality"


def check_chunks(store: Store, settings: Settings, model_limit: int, preload: bool = False) -> QualityResult:
    """Chunk sizes within [1, model limit], text present, ids unique (GX); warn on many tiny chunks.
    `preload`: a frame not validated before is validated in the validation process, started now
    if it is not running (`validate_chunk_frame`)."""
    # plain rows (`FRAME_COLUMNS`): the DataFrame Great Expectations validates is built where it
    # validates (pandas' import, ~0.5-0.8 s, is not paid here when the frame was validated before)
    rows = store.chunk_frame_rows()
    counts = [int(r["token_count"]) for r in rows]
    results = validate_chunk_frame(rows, 1, model_limit, validation_cache(settings), preload) if rows else []
    failed = [r for r in results if not r["success"]]
    p = settings.pipeline
    tiny = sum(1 for c in counts if c < p.tiny_chunk_tokens)
    tiny_fraction = tiny / len(counts) if counts else 0.0
    too_tiny = tiny_fraction > p.max_tiny_fraction
    pct = {f"p{q}": float(np.percentile(counts, q)) if counts else 0.0 for q in (5, 50, 95)}
    if failed:
        description = "; ".join(f"{r['expectation']}({r['column']}): {r['unexpected']} unexpected" for r in failed)
    elif too_tiny:
        description = f"{tiny_fraction:.0%} of chunks are under {p.tiny_chunk_tokens} tokens (limit {p.max_tiny_fraction:.0%})"
    else:
        description = f"{len(counts)} chunks within [1, {model_limit}] tokens"
    oversize = [r["chunk_id"] for r in rows if r["token_count"] > model_limit]
    return QualityResult(
        passed=not failed and not too_tiny,
        severity="error" if failed else "warn",
        description=description,
        metadata={"chunks": len(counts), **pct, "max": max(counts, default=0), "model_limit": model_limit,
                  "tiny_chunks": tiny, "tiny_fraction": round(tiny_fraction, 4),
                  "expectations_failed": len(failed), "expectations": len(results),
                  "oversize_ids": oversize[:50]},
        markdown={"histogram": token_histogram(counts),
                  "expectations": markdown_table(results, ["expectation", "column", "success", "unexpected", "sample"])},
    )


def check_failed(store: Store) -> QualityResult:
    """Files whose latest run failed in some stage (an error, not a bad file: those are skipped): an
    error, as each one serves its previous version or nothing. Dagster cannot mark one partition of a
    many-file run failed (dagster-io/dagster#17836), so this check is where such a run says so."""
    rows = store.failed_outputs()
    files = sorted({(r["collection"], r["path"]) for r in rows})
    named = first_of([path for _, path in files], 5)
    # `rag materialize` takes the folder a file is under (a registered root) and retries only what needs it
    roots = sorted({str(r.path) for r in store.list_roots() if r.collection in {c for c, _ in files}})
    retry = f"`rag materialize {' '.join(roots)}`" if roots else "`rag ingest` of their folder"
    return QualityResult(
        passed=not rows,
        severity="error",
        description="no file failed in its latest run" if not rows else
        f"{len(files)} file{'s' if len(files) != 1 else ''} failed in {'their' if len(files) != 1 else 'its'} latest "
        f"run and serve{'s' if len(files) == 1 else ''} the previous version or nothing: {named}; fix the cause, "
        f"then {retry} (it retries only what needs it) or let nightly_reconcile retry them",
        metadata={"failed_files": len(files), "paths": [p for _, p in files[:100]]},
        markdown={"failures": markdown_table(rows, ["collection", "path", "stage", "error", "updated_at"])}
        if rows else {},
    )


def check_skipped(store: Store) -> QualityResult:
    """Skipped inputs, counted and listed by reason (a warning: bad files never stop the rest)."""
    rows = store.list_skipped()
    by_reason = Counter(r["reason"] for r in rows)
    return QualityResult(
        passed=not rows,
        severity="warn",
        description="no skipped inputs" if not rows else
        f"{len(rows)} skipped inputs: " + ", ".join(f"{k} {v}" for k, v in by_reason.most_common()),
        metadata={"skipped": len(rows), **{f"reason_{k}": v for k, v in by_reason.items()}},
        markdown={"by_reason": markdown_table([{"reason": k, "files": v} for k, v in by_reason.most_common()],
                                         ["reason", "files"]),
                  "skipped_inputs": markdown_table(rows, ["collection", "path", "reason", "detail"])} if rows else {},
    )


def check_metadata(store: Store) -> QualityResult:
    """Documents ingested without some of their metadata (a date that is not one, a ticker that is not
    a symbol): a warning, as filters and boosts skip what they lack."""
    rows = store.metadata_warnings()
    documents = len({(r["collection"], r["path"]) for r in rows})
    return QualityResult(
        passed=not rows,
        severity="warn",
        description="every document's metadata was usable" if not rows else
        f"{documents} documents ingested without some of their metadata ({len(rows)} fields)",
        metadata={"documents": documents, "warnings": len(rows)},
        markdown={"metadata_warnings": markdown_table(rows[:200], ["collection", "path", "warning"])} if rows else {},
    )


def check_hnsw(store: Store, settings: Settings, space: str, dimensions: int, k: int = 10) -> QualityResult:
    """The space's HNSW index exists and is valid, and recall@k against exact search is high enough."""
    state = store.hnsw_index_state(space)
    p = settings.pipeline
    meta: dict[str, Any] = {"index": state["index"], "exists": state["exists"], "valid": state["valid"],
                            "size_bytes": state["size_bytes"], "min_recall": p.min_recall}
    if not (state["exists"] and state["valid"]):
        return QualityResult(False, "error", f"HNSW index {state['index']} is missing or invalid", meta)
    ef = max(store.ef_search(space), k)  # what searches use (search.ef_search 0: scaled with the index)
    measured = store.measure_recall(space, dimensions, p.recall_sample, k, ef)
    store.record_recall(space, measured["recall"], ef)
    meta.update({f"recall_at_{k}": round(measured["recall"], 4), "ef_search": ef, "sample_size": measured["sample"]})
    ok = measured["recall"] >= p.min_recall
    return QualityResult(ok, "error", f"recall@{k} = {measured['recall']:.3f} on {measured['sample']} queries"
                         f" (ef_search {ef}, minimum {p.min_recall})", meta)



def eval_set_key(settings: Settings) -> str:
    """Identifies the configured eval set's baseline: the files' content, mode, unit and collection
    (an edited set, or the same set searched another way, starts its own history)."""
    import hashlib

    cfg = settings.eval
    digest = hashlib.sha256(Path(cfg.queries).read_bytes() + b"\0" + Path(cfg.qrels).read_bytes()).hexdigest()[:16]
    return f"{cfg.mode}:{cfg.unit}:{cfg.collection or '*'}:{digest}"


def check_retrieval(store: Store, settings: Settings, search: Callable[[str], Any]) -> QualityResult:
    """Run the configured eval set (`eval.queries`, `eval.qrels`) through `search` and compare its
    nDCG@10 with the last accepted run: more than `eval.max_drop` lower warns, below `eval.ndcg_floor`
    errors. Passing runs are recorded as accepted (the next baseline); failing ones only as history."""
    from rag_lib.errors import ValidationError
    from rag_lib.eval import score_eval_set

    cfg = settings.eval
    if not (cfg.queries and cfg.qrels):
        return QualityResult(True, "warn", "no eval set configured (eval.queries and eval.qrels): not measured",
                             {"configured": False})
    for name, path in (("eval.queries", cfg.queries), ("eval.qrels", cfg.qrels)):
        if not Path(path).is_file():
            raise ValidationError(f"{name} is {path}, which is not a file; point it at the BEIR set's file")
    key = eval_set_key(settings)
    baseline = store.last_accepted_eval(key)
    scores = score_eval_set(search, cfg.queries, cfg.qrels, unit=cfg.unit, mode=cfg.mode)
    ndcg = scores.get("all", {}).get("ndcg@10", 0.0)
    problems: list[str] = []
    severity, outcome = "warn", "passed"
    if baseline is not None and ndcg < baseline["ndcg"] - cfg.max_drop:
        outcome = "warn"
        problems.append(f"{baseline['ndcg'] - ndcg:.4f} below the last accepted run ({baseline['ndcg']:.4f}, "
                        f"{baseline['at']:%Y-%m-%d %H:%M} UTC; allowed drop {cfg.max_drop})")
    if cfg.ndcg_floor is not None and ndcg < cfg.ndcg_floor:
        severity, outcome = "error", "error"
        problems.append(f"below the floor eval.ndcg_floor = {cfg.ndcg_floor}")
    store.record_eval_run(key, ndcg, scores, outcome, accepted=not problems)
    history = store.eval_history(key, 10)
    meta: dict[str, Any] = {
        "ndcg@10": ndcg, "recall@10": scores.get("all", {}).get("recall@10", 0.0),
        "mrr@10": scores.get("all", {}).get("mrr@10", 0.0), "queries": scores.get("all", {}).get("queries", 0),
        "baseline_ndcg@10": baseline["ndcg"] if baseline else None, "eval_set": str(cfg.queries),
        "mode": cfg.mode, "unit": cfg.unit, "ndcg_floor": cfg.ndcg_floor, "max_drop": cfg.max_drop,
    }
    meta = {k: v for k, v in meta.items() if v is not None}
    for qtype, m in scores.items():
        if qtype != "all":
            meta[f"ndcg@10 {qtype}"] = m["ndcg@10"]
    per_type = markdown_table([{"type": t, **m} for t, m in scores.items()],
                         ["type", "queries", "ndcg@10", "recall@10", "mrr@10"])
    runs = markdown_table([{"at": f"{r['at']:%Y-%m-%d %H:%M:%S}", "ndcg@10": round(r["ndcg"], 4), "outcome": r["outcome"],
                       "accepted": "yes" if r["accepted"] else "no"} for r in history],
                     ["at", "ndcg@10", "outcome", "accepted"])
    summary = f"nDCG@10 {ndcg:.4f} on {meta['queries']} queries ({cfg.mode}, {cfg.unit} units)"
    summary += "; " + "; ".join(problems) if problems else (
        f"; baseline {baseline['ndcg']:.4f}" if baseline else "; first run: now the baseline")
    return QualityResult(not problems, severity, summary, meta, {"per_type": per_type, "history": runs})
