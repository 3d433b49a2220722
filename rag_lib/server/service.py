"""What the HTTP routes and MCP tools do, over one `KnowledgeBase` facade: checks limits, confines
paths, and shapes library results into plain dicts. Synchronous: callers run it in a worker thread.
The seeds' shapes (000 HTTP API, 001 MCP tools, 003 `/rag/*`, 004 classifier/rerank/metrics) are
thin mappings over the same functions."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import re
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
import yaml
from anyio import CapacityLimiter

from rag_lib.api import KnowledgeBase
from rag_lib.errors import DocumentConflictError, NotFoundError, ValidationError
from rag_lib.log import get_logger
from rag_lib.models import SearchHit
from rag_lib.server import uploads
from rag_lib.server.errors import scrub_paths
from rag_lib.server.security import safe_relative

log = get_logger(__name__)

DEFAULT_MODE = "hybrid"
# What a client that asked for reranking is told when no reranker is configured.
RERANK_NOTE = ("no reranker is configured, so the results keep the hybrid order; set search.rerank_model_path "
               "(a local CrossEncoder folder, $RAG_SEARCH__RERANK_MODEL_PATH) or search.rerank_base_url "
               "(a /rerank server, $RAG_SEARCH__RERANK_BASE_URL) to turn reranking on")
FORMATS = {"markdown": (".md", ".markdown"), "yaml": (".yaml", ".yml"), "jsonl": (".jsonl",)}


# One ingest executor per event loop (a server has one; tests start several): see `run_ingest`.
_ingest_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CapacityLimiter] = weakref.WeakKeyDictionary()


async def run_ingest(workers: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run an ingest call (upload, by-path embed, stored text) on the ingest executor: worker threads
    of their own, at most `workers` (settings.server.ingest_workers) at once, the rest waiting in the
    event loop. Searches run on the request thread pool, so they never queue behind an ingest (an
    upload of 2,000 chunks takes a minute of encoding), and many uploads cannot take that pool."""
    loop = asyncio.get_running_loop()
    limiter = _ingest_limiters.get(loop)
    if limiter is None:
        limiter = _ingest_limiters[loop] = CapacityLimiter(workers)
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=limiter)


# One search limiter per event loop, as for ingests: see `run_search`.
_search_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, CapacityLimiter]] = \
    weakref.WeakKeyDictionary()


def search_slots(settings) -> int:
    """Searches one server process runs at once: a hybrid search holds two pooled connections at a
    time (its full-text query runs on a second one) and the metrics writer one, so the pool's
    `pool_max_size` connections serve (pool_max_size - 1) // 2 searches without any waiting for one."""
    return max(1, (settings.pool_max_size - 1) // 2)


async def run_search(slots: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a search call on a worker thread, at most `slots` at once; the rest wait in the event loop
    holding neither a thread nor a connection. Unbounded (the thread pool's 40), 8 concurrent hybrid
    searches in one process asked for 17 connections of a pool of 8: 413 of 530 connection requests
    waited, each holding its thread, while the connections' holders waited for the GIL."""
    limiters = _search_limiters.setdefault(asyncio.get_running_loop(), {})
    limiter = limiters.get(slots) or limiters.setdefault(slots, CapacityLimiter(slots))
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs), limiter=limiter)


def _limit(value: int, ceiling: int, name: str) -> int:
    if value > ceiling:
        raise ValidationError(f"{name} must be at most {ceiling}, got {value}")
    return value


def check_query(kb: KnowledgeBase, query: str) -> str:
    limit = kb.settings.server.max_query_chars
    if len(query) > limit:
        raise ValidationError(f"query is {len(query)} characters; the limit is {limit}")
    if not query.strip():
        raise ValidationError("query is empty; pass some words to search for")
    return query


def hit_dict(hit: SearchHit, rank: int) -> dict[str, Any]:
    """A `SearchHit` as the API shows it (`SearchHitOut`): its fields plus its rank."""
    return {"rank": rank, **hit.to_dict(), "score": round(float(hit.score), 6)}


def _clean(filters: dict[str, Any] | None) -> dict[str, Any]:
    """Request filters as `KnowledgeBase.search` arguments. A request's `section` matches any section
    path containing it, in any case (seed 000's `ILIKE '%risk%'`, as `rag search --section`)."""
    out = {k: v for k, v in (filters or {}).items() if v not in (None, "", [])}
    if "section" in out:
        out["section_contains"] = out.pop("section")
    return out


def search(kb: KnowledgeBase, query: str, *, mode: str | None = None, filters: dict[str, Any] | None = None,
           top_k: int | None = None, min_similarity: float = 0.0, collection: str | None = None,
           rerank: bool | None = None) -> dict[str, Any]:
    """Search and return `{query, mode, results, count, timings_ms}` (`top_k` None: settings.search.top_k)."""
    check_query(kb, query)
    top_k = top_k or kb.settings.search.top_k
    _limit(top_k, kb.settings.server.max_top_k, "top_k")
    options = {} if rerank is None else {"rerank": rerank}  # None: the library's configured default
    result = kb.search(query, mode=mode or DEFAULT_MODE, collection=collection, top_k=top_k,
                       min_similarity=min_similarity, **_clean(filters), **options)
    results = [hit_dict(h, n) for n, h in enumerate(result.hits, 1)]
    out = {"query": result.query, "mode": result.mode, "results": results, "count": len(results),
           "timings_ms": result.timings_ms, "reranked": result.reranked}
    if rerank and not result.reranked:
        out["rerank_note"] = RERANK_NOTE
    if result.note:
        out["note"] = result.note
    if result.plan is not None:
        out["plan"] = result.plan
    return out


def search_expanded(kb: KnowledgeBase, query: str, *, n_expansions: int = 3, top_k: int = 5,
                    filters: dict[str, Any] | None = None, mode: str | None = None,
                    collection: str | None = None) -> dict[str, Any]:
    """Search the query and its expansions; merge by chunk (best score kept), best first."""
    expansion = expand_query(kb, query, n=n_expansions)
    best: dict[str, dict[str, Any]] = {}
    for q in expansion["all_queries"]:
        for hit in search(kb, q, mode=mode, filters=filters, top_k=top_k, collection=collection)["results"]:
            if hit["chunk_id"] not in best or hit["score"] > best[hit["chunk_id"]]["score"]:
                best[hit["chunk_id"]] = {**hit, "matched_query": q}
    ranked = sorted(best.values(), key=lambda h: h["score"], reverse=True)[:top_k]
    results = [{**h, "rank": n} for n, h in enumerate(ranked, 1)]
    return {"query": query, "queries": expansion["all_queries"], "results": results, "count": len(results)}


def classify_query(kb: KnowledgeBase, query: str, collection: str | None = None) -> dict[str, Any]:
    """Seed 004's classification: query_type, tickers, suggested_strategy (+ the doc types named)."""
    check_query(kb, query)
    return kb.query_analysis(query, collection).to_dict()


def expand_query(kb: KnowledgeBase, query: str, n: int = 3) -> dict[str, Any]:
    """Seed 004's ExpandedQuery: original, variations, all_queries (original first)."""
    check_query(kb, query)
    variations = kb.expand_query(query, n)
    return {"original": query, "variations": variations, "all_queries": [query, *variations],
            "expander": "configured" if kb.expander is not None else "none"}


def context(kb: KnowledgeBase, query: str, *, token_budget: int = 2000, mode: str | None = None,
            filters: dict[str, Any] | None = None, collection: str | None = None) -> dict[str, Any]:
    """Assemble context for `query` within `token_budget`, with citations."""
    check_query(kb, query)
    _limit(token_budget, kb.settings.server.max_token_budget, "token_budget")
    result = kb.build_context(query, token_budget=token_budget, mode=mode, collection=collection, **_clean(filters))
    return result.to_dict()


def hybrid_context(kb: KnowledgeBase, query: str, *, token_budget: int = 4000, **kwargs: Any) -> Any:
    """`KnowledgeBase.hybrid_context` within the server's query and token-budget limits."""
    check_query(kb, query)
    _limit(token_budget, kb.settings.server.max_token_budget, "token_budget")
    return kb.hybrid_context(query, token_budget=token_budget, **kwargs)


def similar(kb: KnowledgeBase, ref: str, *, top_k: int = 10, collection: str | None = None) -> dict[str, Any]:
    """Documents most similar to a stored unit / chunk / document."""
    _limit(top_k, kb.settings.server.max_top_k, "top_k")
    result = kb.get_similar(ref, top_k=top_k, collection=collection)
    return {"ref": ref, "results": [hit_dict(h, n) for n, h in enumerate(result.hits, 1)],
            "timings_ms": result.timings_ms}


def similar_for_ticker(kb: KnowledgeBase, ticker: str, *, analysis_type: str | None = None, top_k: int = 5,
                       collection: str | None = None) -> dict[str, Any]:
    """Seed 000's `get_similar_analyses`: the analyses of a ticker closest to its thesis, catalysts and
    risks, one per document."""
    _limit(top_k, kb.settings.server.max_top_k, "top_k")
    ticker = ticker.strip().upper()
    query = f"{ticker} {analysis_type or 'analysis'} thesis catalysts risks"
    result = kb.search(query, mode="semantic", collection=collection, ticker=ticker, doc_type=analysis_type,
                       top_k=max(top_k * 4, 20))
    seen: set[str] = set()
    hits = []
    for hit in result.hits:
        if hit.path not in seen:
            seen.add(hit.path)
            hits.append(hit)
    hits = hits[:top_k]
    out = {"ticker": ticker, "analysis_type": analysis_type,
           "results": [hit_dict(h, n) for n, h in enumerate(hits, 1)], "count": len(hits)}
    if not hits and result.note:  # a mistyped ticker or type, or an empty collection: say which
        out["note"] = result.note
    return out


def _published(kb: KnowledgeBase, report: dict[str, Any], collection: str | None) -> dict[str, Any]:
    """Seed fields of a one-file ingest: doc_id, status, content_hash, tokens_processed, and seed 001's
    EmbedResult names chunk_count, embed_model and error_message (None, "unchanged", or why not)."""
    files = report["files"]
    if len(files) != 1:
        return {"tokens_processed": 0}
    outcome = files[0]
    status = {"new": "embedded", "changed": "embedded"}.get(outcome["status"], outcome["status"])
    if outcome["status"] not in ("new", "changed", "unchanged"):
        why = ": ".join(x for x in (outcome.get("reason"), outcome.get("detail")) if x) or outcome["status"]
        return {"status": status, "tokens_processed": 0, "chunk_count": 0, "error_message": why}
    doc = kb.show(outcome["path"], collection)
    published = outcome["status"] in ("new", "changed")
    return {"doc_id": doc["doc_id"], "status": status, "content_hash": doc.get("content_hash"),
            "tokens_processed": int(doc.get("token_count") or 0) if published else 0,
            "chunk_count": int(doc.get("chunk_count") or 0), "embed_model": kb.embedding_info()["model"],
            "error_message": None if published else "unchanged"}


def embed_path(kb: KnowledgeBase, path: str, *, collection: str | None = None, force: bool = False) -> dict[str, Any]:
    """Ingest one file that lies inside a configured corpus root (unit ids relative to that root)."""
    report = uploads.ingest_path(kb, path, collection, force)  # sandboxed parse, confined identities
    return {**report, **_published(kb, report, report["collection"])}


def upload_dir(kb: KnowledgeBase, collection: str) -> Path:
    base = kb.settings.server.upload_dir or (Path(kb.settings.home) / "uploads")
    return (Path(base) / safe_relative(collection)).resolve()


def embed_content(kb: KnowledgeBase, name: str, content: str, *, collection: str | None = None,
                  force: bool = False) -> dict[str, Any]:
    """Keep uploaded text under the upload folder as `name` and ingest it (its path is `name`)."""
    report = uploads.ingest_upload(kb, name, content, collection, force)  # sandboxed, no takeover, cleaned up
    return {**report, **_published(kb, report, report["collection"])}


def embed_text(kb: KnowledgeBase, text: str) -> dict[str, Any]:
    """The vector of a text in the active space (nothing stored)."""
    limit = kb.settings.server.max_text_chars
    if len(text) > limit:
        raise ValidationError(f"text is {len(text)} characters; the limit is {limit}")
    return {**kb.embedding_info(), "vector": [float(x) for x in kb.embed_text(text)]}


_PLAIN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_TEXT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")


def _text_name(doc_id: str) -> str:
    """Where a stored text is kept: one file per id, and no two ids share it. Ids of letters, digits,
    '.', '_', '-' keep the name used so far (`ext_001` → `texts/ext_001.yaml`); an id with ':' is
    escaped (`_` → `__`, `:` → `_c`) behind a leading `_`, which no id starts with (`ext:001` →
    `texts/_ext_c001.yaml`)."""
    if not _TEXT_ID.fullmatch(doc_id):
        raise ValidationError(f"doc_id '{doc_id[:100]}' may only use letters, digits, '.', '_', ':' and '-', "
                              "starting with a letter or digit")
    if _PLAIN_ID.fullmatch(doc_id):
        return f"texts/{doc_id}.yaml"
    return "texts/_" + doc_id.replace("_", "__").replace(":", "_c") + ".yaml"


def _legacy_text_name(doc_id: str) -> str:
    """The name stored texts had before `_text_name` became one-to-one (`:` and `_` both became `_`)."""
    return "texts/" + re.sub(r"[^A-Za-z0-9._-]", "_", doc_id) + ".yaml"


def _text_path(kb: KnowledgeBase, doc_id: str, collection: str) -> str:
    """The stored text's document path: a text stored under the old naming stays where it is (so it is
    replaced, not duplicated); a path holding another id's text is a collision, refused."""
    name = _text_name(doc_id)
    legacy = _legacy_text_name(doc_id)
    holders = kb.documents_with_id(doc_id, collection)
    if legacy != name and legacy in holders:
        name = legacy
    try:
        existing = kb.show(name, collection)
    except NotFoundError:
        return name
    if existing.get("path") == name and existing.get("doc_id") != doc_id:
        raise DocumentConflictError(
            f"'{name}' in collection '{collection}' holds the text of id '{existing.get('doc_id')}', stored "
            f"before ids got distinct file names; delete that document first to store '{doc_id}'")
    return name


def store_text(kb: KnowledgeBase, text: str, *, doc_id: str, doc_type: str | None = None,
               ticker: str | None = None, title: str | None = None, doc_date: dt.date | None = None,
               collection: str | None = None, force: bool = False) -> dict[str, Any]:
    """Seed 000's `embed_text(text, doc_id, doc_type, ticker)`: keep the text as a YAML document
    (`texts/<doc_id>.yaml` in the upload folder; its `_meta` carries the id, type and ticker) and ingest it."""
    limit = kb.settings.server.max_text_chars
    if len(text) > limit:
        raise ValidationError(f"text is {len(text)} characters; the limit is {limit}")
    if not text.strip():
        raise ValidationError("text is empty")
    meta = {k: v for k, v in {"id": doc_id, "doc_type": doc_type or "note", "ticker": ticker.upper() if ticker else None,
                              "title": title, "date": doc_date.isoformat() if doc_date else None}.items() if v}
    # no descriptor sections: a short text stays the one chunk seed 000 counts
    body = yaml.safe_dump({"_meta": meta, "text": text, "_indexing": {"descriptors": False}}, sort_keys=False,
                          allow_unicode=True)
    name = _text_path(kb, doc_id, collection or kb.settings.collection)
    report = embed_content(kb, name, body, collection=collection, force=force)
    outcome = report["files"][0]
    if outcome["status"] not in ("new", "changed", "unchanged"):
        raise ValidationError(f"text '{doc_id}' was {outcome['status']}: {outcome.get('reason') or ''} "
                              f"{outcome.get('detail') or ''}".strip())
    return {"doc_id": report["doc_id"], "path": name, "collection": report["collection"], "chunks": outcome["chunks"],
            "tokens_processed": report["tokens_processed"], "content_hash": report["content_hash"],
            "status": report["status"]}


def delete_document(kb: KnowledgeBase, ref: str, collection: str | None = None) -> dict[str, Any]:
    """Delete a document (path or id) with its chunks; `chunks_deleted` as seed 000 reports it."""
    coll = collection or kb.settings.collection
    try:
        doc = kb.show(ref, coll)
    except NotFoundError:  # a skipped file has no document row; delete_document reports what is missing
        doc = {}
    sources = kb.document_sources(ref, coll)
    deleted = kb.delete_document(ref, coll)
    # after the commit: the rows are gone whatever happens to the files; a file that cannot be
    # removed is logged and reported, and the next delete or upload of that name sees it again
    removed, errors = uploads.remove_uploaded_files(kb, coll, list(sources.values()))
    log.info("deleted", extra={"documents": len(deleted), "files_removed": len(removed), "file_errors": len(errors)})
    return {"deleted": deleted, "collection": coll, "doc_id": doc.get("doc_id") or ref,
            "chunks_deleted": int(doc.get("chunk_count") or 0), "status": "deleted",
            "files_removed": removed, "file_errors": errors}


def list_sources(kb: KnowledgeBase, *, collection: str | None = None, limit: int = 100, offset: int = 0) -> dict[str, Any]:
    if not 1 <= limit <= 1000 or offset < 0:
        raise ValidationError("limit must be 1-1000 and offset >= 0")
    rows = kb.list_documents(collection, limit, offset)
    return {"items": rows, "limit": limit, "offset": offset, "next_offset": offset + limit if len(rows) == limit else None}


def client_roots(kb: KnowledgeBase) -> list[Path]:
    """Folders whose absolute paths clients never see: corpus roots (configured and registered), the
    upload folder, the home folder; each as spelled and resolved."""
    cfg = kb.settings.server
    roots = [*cfg.corpus_roots, *(r.path for r in kb.registered_roots()), kb.upload_folder(), kb.settings.home]
    return [p for r in roots for p in {Path(r), Path(r).resolve()} if p.is_absolute()]


def status(kb: KnowledgeBase, collection: str | None = None) -> dict[str, Any]:
    """Counts, active space, index size (`index_size_mb`), skipped inputs, files served from an
    older version (`held`) and recent failures. The failure messages and skip details name files
    relative to their root (any other absolute path
    becomes `<path>`): read-only clients learn nothing of the server's filesystem; `rag status` on
    the server shows them whole."""
    raw = kb.status(collection)
    roots = client_roots(kb)
    for row in [*(raw.get("failures") or []), *(raw.get("skipped") or []), *(raw.get("held") or [])]:
        for key in ("message", "detail", "path", "partition", "action"):
            if isinstance(row.get(key), str):
                row[key] = scrub_paths(row[key], roots)
    return raw


def metrics_summary(kb: KnowledgeBase, *, days: float | None = 7, since: dt.datetime | None = None) -> dict[str, Any]:
    """Search and embedding metrics since `since` (default: the last `days` days)."""
    if since is None and days is not None:
        if not 0 < days <= 3650:
            raise ValidationError(f"days must be between 0 and 3650, got {days}")
        since = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    return kb.metrics_summary(since=since)


def evaluate(kb: KnowledgeBase, query: str, contexts: list[str], answer: str,
             ground_truth: str | None = None) -> dict[str, Any]:
    """Seed 004's `rag_evaluate`: RAGAS context precision / recall and faithfulness of an answer,
    judged by the configured chat model."""
    check_query(kb, query)
    return kb.evaluate_answer(query, contexts, answer, ground_truth)


# ---- seed 003's `/rag/*` shapes over the same functions --------------------------------------

def _format_of(path: str) -> str:
    suffix = Path(path).suffix.lower()
    return next((name for name, suffixes in FORMATS.items() if suffix in suffixes), suffix.lstrip(".") or "unknown")


def index_source(kb: KnowledgeBase, source_path: str, *, metadata: dict[str, Any] | None = None,
                 collection: str | None = None, force: bool = False) -> dict[str, Any]:
    started = time.perf_counter()
    out = embed_path(kb, source_path, collection=collection, force=force)
    status = {"embedded": "indexed"}.get(out.get("status") or "", out.get("status") or "failed")
    if metadata and status in ("indexed", "unchanged") and out["files"]:
        kb.set_tags(out["files"][0]["path"], metadata, out["collection"])
    return {"source_id": out.get("doc_id"), "source_path": out["files"][0]["path"] if out["files"] else source_path,
            "chunks_created": out["chunks"] if status == "indexed" else 0,
            "tokens_processed": out["tokens_processed"], "duration_ms": round((time.perf_counter() - started) * 1000, 2),
            "status": status, "content_hash": out.get("content_hash"), "metadata": metadata or {}}


def _date_range(span: dict[str, Any]) -> tuple[dt.date | None, dt.date | None]:
    """Seed 003's `date_range` as (date_from, date_to); a reversed one is refused under the name the
    client used (the search would name date_from/date_to, which it never sent)."""
    start, end = span.get("from") or span.get("from_"), span.get("to")
    if start and end and start > end:
        raise ValidationError(f"date_range: from {start} is after to {end}, so no document can match; "
                              "swap them or drop one")
    return start, end


def retrieve(kb: KnowledgeBase, query: str, *, top_k: int = 5, similarity_threshold: float = 0.0,
             filters: dict[str, Any] | None = None, mode: str | None = None,
             collection: str | None = None) -> dict[str, Any]:
    filters = dict(filters or {})
    if "source_type" in filters:
        filters["formats"] = filters.pop("source_type")
    if span := filters.pop("date_range", None):
        filters["date_from"], filters["date_to"] = _date_range(span)
    category = filters.pop("category", None)
    tags = {**(filters.pop("tags", None) or {}), **({"category": category} if category is not None else {})}
    if tags:
        filters["tags"] = tags
    found = search(kb, query, mode=mode or "semantic", filters=filters, top_k=top_k,
                   min_similarity=similarity_threshold, collection=collection)
    hits = found["results"]
    timings = found["timings_ms"]
    embed_ms = float(timings.get("embed", 0.0))
    total = kb.chunk_total(collection)  # one count, not the whole status report (eight queries)
    tagged = kb.tags_of([h["path"] for h in hits], collection) if hits else {}
    return {
        "results": [{"chunk_id": h["chunk_id"], "source_id": h["doc_id"], "source_path": h["path"],
                     "content": h["text"], "relevance_score": h["score"],
                     "metadata": {**h["metadata"], **tagged.get(h["path"], {}), "heading": h["section"], "section_path": h["section_path"].split(" > "),
                                  "unit_id": h["unit_id"], "doc_type": h["doc_type"], "ticker": h["ticker"]}}
                    for h in hits],
        "query_embedding_time_ms": round(embed_ms, 2),
        "search_time_ms": round(float(timings.get("search", 0.0)), 2),
        "total_chunks_searched": int(total),
    }


def list_source_summaries(kb: KnowledgeBase, *, collection: str | None = None, limit: int = 1000,
                          offset: int = 0) -> dict[str, Any]:
    page = list_sources(kb, collection=collection, limit=limit, offset=offset)
    counts = status(kb, collection)
    return {
        "sources": [{"source_id": r["doc_id"], "source_type": _format_of(r["path"]), "source_path": r["path"],
                     "chunk_count": r["chunk_count"], "indexed_at": r.get("ingested_at"),
                     "content_hash": r.get("content_hash")} for r in page["items"]],
        "total_sources": int(counts["documents"]), "total_chunks": int(counts["chunks"]),
    }


def health(kb: KnowledgeBase) -> dict[str, Any]:
    """Database reachable (a round trip) and model loaded (without loading it)."""
    try:
        database = kb.ping()
    except Exception:  # noqa: BLE001 - any failure means unhealthy; the reason goes to the log
        log.warning("health check: database unreachable", exc_info=True)
        database = False
    model = kb.model_loaded()
    return {"status": "ok" if database and model else "degraded", "database": database, "model": model}


def warm_up(kb: KnowledgeBase) -> None:
    """Open the pool's connections and load the model now, so the first requests pay nothing."""
    kb.warm_up(fill_pool=True)
    from rag_lib.server.isolation import warm_up as start_parse_workers

    start_parse_workers()  # the sandbox for uploaded content (see isolation.py)
    if note := kb.empty_collection_note():
        # the seeds' clients name no collection: every request of theirs would find nothing
        log.warning("requests that name no collection use '%s' (settings.collection, $RAG_COLLECTION): %s",
                    kb.settings.collection, note)


def page_status(raw: dict[str, Any], limit: int = 100, offset: int = 0) -> dict[str, Any]:
    """`status` with its skipped rows paged: `skipped` holds one page, `skipped_total` counts them all."""
    if not 1 <= limit <= 1000 or not 0 <= offset <= 10_000_000:
        raise ValidationError("limit must be 1-1000 and offset 0-10000000")
    skipped = list(raw.get("skipped") or [])
    page = skipped[offset:offset + limit]
    more = offset + limit < len(skipped)
    return {**raw, "skipped": page, "skipped_total": len(skipped), "skipped_limit": limit, "skipped_offset": offset,
            "skipped_next_offset": offset + limit if more else None}
