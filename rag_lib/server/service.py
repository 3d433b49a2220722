"""What the HTTP routes and MCP tools do, over one `KnowledgeBase`: checks limits, confines paths,
and shapes library results into plain dicts. Synchronous: callers run it in a worker thread."""

from __future__ import annotations

import dataclasses
import inspect
import os
import tempfile
from pathlib import Path
from typing import Any

import importlib

from rag_lib.api import KnowledgeBase
from rag_lib.errors import RagError, ValidationError
from rag_lib.log import get_logger
from rag_lib.models import SearchFilters, SearchHit
from rag_lib.server import uploads
from rag_lib.server.security import confine, safe_relative

log = get_logger(__name__)

EXCERPT_CHARS = 300


class NotImplementedFeature(RagError):
    """The library does not offer this operation (yet)."""

    code = "not_implemented"


def default_mode() -> str:
    # the module, not the `rag_lib.search` function the package re-exports under the same name
    modes = importlib.import_module("rag_lib.search").MODES
    return "hybrid" if "hybrid" in modes else "semantic"


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


def _accepts(fn: Any, name: str) -> bool:
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def hit_dict(hit: SearchHit | dict[str, Any], rank: int) -> dict[str, Any]:
    data = hit.to_dict() if hasattr(hit, "to_dict") else dict(hit)
    text = data.get("text") or ""
    excerpt = data.get("excerpt") or (text[:EXCERPT_CHARS] + ("…" if len(text) > EXCERPT_CHARS else ""))
    return {
        "rank": rank, "score": round(float(data.get("score") or 0.0), 6), "chunk_id": data["chunk_id"],
        "unit_id": data["unit_id"], "doc_id": data["doc_id"], "path": data["path"], "section": data["section"],
        "section_path": data.get("section_path") or data["section"], "doc_type": data["doc_type"],
        "collection": data["collection"], "ticker": data.get("ticker"), "doc_date": data.get("doc_date"),
        "excerpt": excerpt, "text": text, "metadata": data.get("metadata") or {},
    }


def _run_search(kb: KnowledgeBase, query: str, mode: str, filters: dict[str, Any], top_k: int,
                min_similarity: float, collection: str | None):
    filters = {k: v for k, v in filters.items() if v not in (None, "", [])}
    unsupported = [name for name in filters if not _accepts(kb.search, name)]
    if not unsupported:
        return kb.search(query, mode=mode, collection=collection, top_k=top_k, min_similarity=min_similarity,
                         **filters)
    # A filter the facade does not expose yet (e.g. `path`) but the store does: go one level down.
    known = {f.name for f in dataclasses.fields(SearchFilters)}
    if any(name not in known for name in unsupported):
        raise ValidationError(f"filters {unsupported} are not supported by this knowledge base")
    search_mod = importlib.import_module("rag_lib.search")
    return search_mod.search(
        kb.store, kb.provider, query, mode=mode,
        filters=SearchFilters(collection=collection or kb.settings.collection, **filters),
        top_k=top_k, min_similarity=min_similarity,
    )


def search(kb: KnowledgeBase, query: str, *, mode: str | None = None, filters: dict[str, Any] | None = None,
           top_k: int = 10, min_similarity: float = 0.0, collection: str | None = None) -> dict[str, Any]:
    """Search and return `{query, mode, results, timings_ms}`."""
    check_query(kb, query)
    _limit(top_k, kb.settings.server.max_top_k, "top_k")
    result = _run_search(kb, query, mode or default_mode(), filters or {}, top_k, min_similarity, collection)
    return {
        "query": result.query, "mode": result.mode,
        "results": [hit_dict(h, n) for n, h in enumerate(result.hits, 1)],
        "timings_ms": result.timings_ms,
    }


def _as_dict(value: Any) -> dict[str, Any]:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, dict):
        return value
    raise TypeError(f"unexpected result type {type(value).__name__}")


def _call_optional(kb: KnowledgeBase, method: str, what: str, *args: Any, **kwargs: Any) -> Any:
    fn = getattr(kb, method, None)
    if fn is None:
        raise NotImplementedFeature(f"{what} is not available in this version of the library (KnowledgeBase.{method})")
    given = {k: v for k, v in kwargs.items() if v is not None}
    unsupported = sorted(k for k in given if not _accepts(fn, k))
    if unsupported:  # refuse rather than silently ignore a filter the caller relies on
        raise ValidationError(f"{what} does not support {', '.join(unsupported)} in this version of the library")
    return fn(*args, **given)


def context(kb: KnowledgeBase, query: str, *, token_budget: int = 2000, mode: str | None = None,
            filters: dict[str, Any] | None = None, collection: str | None = None) -> dict[str, Any]:
    """Assemble context for `query` within `token_budget`, with citations."""
    check_query(kb, query)
    _limit(token_budget, kb.settings.server.max_token_budget, "token_budget")
    extra = {k: v for k, v in (filters or {}).items() if v not in (None, "", [])}
    raw = _as_dict(_call_optional(kb, "build_context", "context assembly", query, token_budget=token_budget,
                                  mode=mode, collection=collection, **extra))
    return normalise_context(raw, query, token_budget)


def normalise_context(raw: dict[str, Any], query: str, token_budget: int) -> dict[str, Any]:
    """Map the library's context record onto the API shape (text + citations + token count)."""
    text = raw.get("context") or raw.get("text") or ""
    citations = []
    for n, c in enumerate(raw.get("citations") or raw.get("sources") or [], 1):
        c = _as_dict(c) if not isinstance(c, str) else {"unit_id": c}
        citations.append({"ref": c.get("ref") or c.get("marker") or f"[{n}]", **c})
    tokens = raw.get("tokens", raw.get("token_count", raw.get("tokens_used")))
    out = {k: v for k, v in raw.items() if k not in ("context", "text", "citations", "sources")}
    out.update(query=query, context=text, citations=citations, tokens=tokens, token_budget=token_budget)
    return out


def similar(kb: KnowledgeBase, ref: str, *, top_k: int = 10, collection: str | None = None) -> dict[str, Any]:
    """Chunks most similar to a stored unit / chunk / document."""
    _limit(top_k, kb.settings.server.max_top_k, "top_k")
    result = _call_optional(kb, "get_similar", "similar-document search", ref, top_k=top_k, collection=collection)
    hits = result.hits if hasattr(result, "hits") else result
    out = {"ref": ref, "results": [hit_dict(h, n) for n, h in enumerate(hits, 1)]}
    if hasattr(result, "timings_ms"):
        out["timings_ms"] = result.timings_ms
    return out


def embed_path(kb: KnowledgeBase, path: str, *, collection: str | None = None, force: bool = False) -> dict[str, Any]:
    """Ingest one file that lies inside a configured corpus root (unit ids relative to that root)."""
    return uploads.ingest_path(kb, path, collection, force)  # sandboxed parse, confined identities


def upload_dir(kb: KnowledgeBase, collection: str) -> Path:
    base = kb.settings.server.upload_dir or (Path(kb.settings.home) / "uploads")
    return (Path(base) / safe_relative(collection)).resolve()


def embed_content(kb: KnowledgeBase, name: str, content: str, *, collection: str | None = None,
                  force: bool = False) -> dict[str, Any]:
    """Keep uploaded text under the upload folder as `name` and ingest it (its path is `name`)."""
    return uploads.ingest_upload(kb, name, content, collection, force)  # sandboxed, no takeover, cleaned up


def embed_text(kb: KnowledgeBase, text: str) -> dict[str, Any]:
    limit = kb.settings.server.max_text_chars
    if len(text) > limit:
        raise ValidationError(f"text is {len(text)} characters; the limit is {limit}")
    vector = kb.embed_text(text)
    p = kb.provider
    return {"model": p.model, "dimensions": int(p.dimensions), "space": p.space, "vector": [float(x) for x in vector]}


def list_sources(kb: KnowledgeBase, *, collection: str | None = None, limit: int = 100, offset: int = 0) -> dict[str, Any]:
    if not 1 <= limit <= 1000 or offset < 0:
        raise ValidationError("limit must be 1-1000 and offset >= 0")
    rows = kb.list_documents(collection, limit, offset)
    return {"items": rows, "limit": limit, "offset": offset, "next_offset": offset + limit if len(rows) == limit else None}


def health(kb: KnowledgeBase) -> dict[str, Any]:
    """Database reachable (a round trip) and model loaded (without loading it)."""
    database = False
    try:
        database = kb.store.ping()
    except Exception:  # noqa: BLE001 - any failure means unhealthy; the reason goes to the log
        log.warning("health check: database unreachable", exc_info=True)
        database = False
    provider = kb.__dict__.get("provider")
    model = provider is not None and ("_model" in getattr(provider, "__dict__", {}) or not hasattr(provider, "load"))
    return {"status": "ok" if database and model else "degraded", "database": database, "model": model}


def warm_up(kb: KnowledgeBase) -> None:
    """Open the pool and load the model now, so the first request pays nothing."""
    _ = kb.store
    provider = kb.provider
    if hasattr(provider, "load"):
        provider.load()
    provider.embed(["warm-up"])
    from rag_lib.server.isolation import warm_up as start_parse_workers

    start_parse_workers()  # the sandbox for uploaded content (see isolation.py)


def page_status(raw: dict[str, Any], limit: int = 100, offset: int = 0) -> dict[str, Any]:
    """`status` with its skipped rows paged: `skipped` holds one page, `skipped_total` counts them all."""
    if not 1 <= limit <= 1000 or not 0 <= offset <= 10_000_000:
        raise ValidationError("limit must be 1-1000 and offset 0-10000000")
    skipped = list(raw.get("skipped") or [])
    page = skipped[offset:offset + limit]
    more = offset + limit < len(skipped)
    return {**raw, "skipped": page, "skipped_total": len(skipped), "skipped_limit": limit, "skipped_offset": offset,
            "skipped_next_offset": offset + limit if more else None}
