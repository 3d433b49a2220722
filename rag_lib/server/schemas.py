"""Request and response models of the HTTP API. Requests forbid unknown fields, so filters are a
whitelist; lengths are bounded here (422) and the whole body by the size limit (413)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Hard ceilings of the schema; settings.server can only tighten them (checked in the routes).
MAX_QUERY = 4000
MAX_TEXT = 100_000
MAX_NAME = 512
Name = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
Mode = Literal["semantic", "lexical", "hybrid"]

_STR = dict(min_length=1, max_length=200)


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchFiltersIn(Request):
    """Metadata filters (ANDed); lists mean 'any of'. Values are bound as SQL parameters."""

    doc_type: str | list[str] | None = Field(None, examples=[["stock-analysis", "earnings-analysis"]])
    ticker: str | list[str] | None = Field(None, examples=["NVDA"])
    section: str | None = Field(None, max_length=200, examples=["phase1_catalyst"])
    path: str | None = Field(None, max_length=MAX_NAME, description="Path prefix (relative to the corpus root).",
                             examples=["stocks/"])
    date_from: dt.date | None = Field(None, description="Documents dated on or after.", examples=["2025-01-01"])
    date_to: dt.date | None = Field(None, description="Documents dated on or before.", examples=["2025-12-31"])

    @model_validator(mode="after")
    def _bounded_lists(self) -> SearchFiltersIn:
        for name in ("doc_type", "ticker"):
            value = getattr(self, name)
            values = [value] if isinstance(value, str) else (value or [])
            if len(values) > 50 or any(not v or len(v) > 200 for v in values):
                raise ValueError(f"{name}: at most 50 values of 1-200 characters")
        return self


class SearchRequest(Request):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY, description="What to look for, in words.")
    mode: Mode | None = Field(None, description="semantic | lexical | hybrid (default: hybrid when available).")
    filters: SearchFiltersIn = Field(default_factory=SearchFiltersIn)
    top_k: int = Field(10, ge=1, le=1000, description="How many results (capped by settings.server.max_top_k).")
    min_similarity: float = Field(0.0, ge=0.0, le=1.0, description="Drop results scoring below this.")
    collection: str | None = Field(None, **_STR, description="Collection (default: settings.collection).")

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{
            "query": "NVDA data center revenue growth catalysts", "mode": "hybrid", "top_k": 5,
            "filters": {"ticker": "NVDA", "doc_type": ["stock-analysis"], "date_from": "2025-01-01"},
        }]},
    )


class SearchHitOut(BaseModel):
    rank: int
    score: float = Field(description="Relevance in [0, 1] (mode-specific scale).")
    chunk_id: str
    unit_id: str = Field(description="<path relative to corpus root>#<section>")
    doc_id: str
    path: str
    section: str
    section_path: str
    doc_type: str
    collection: str
    ticker: str | None = None
    doc_date: dt.date | None = None
    excerpt: str = Field(description="A short part of the chunk text (query terms highlighted when lexical).")
    text: str = Field(description="The chunk text.")
    metadata: dict[str, Any] = Field(default_factory=dict)


class SearchResponse(BaseModel):
    query: str
    mode: str
    results: list[SearchHitOut]
    timings_ms: dict[str, float] = Field(description="Embedding, database and total time in ms.")
    request_id: str | None = None


class ContextRequest(Request):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY)
    token_budget: int = Field(2000, ge=50, le=100_000, description="Upper bound on context tokens.")
    mode: Mode | None = None
    filters: SearchFiltersIn = Field(default_factory=SearchFiltersIn)
    collection: str | None = Field(None, **_STR)

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"query": "What are the risks to the AMD thesis?", "token_budget": 1500}]},
    )


class Citation(BaseModel):
    model_config = ConfigDict(extra="allow")
    ref: str | None = Field(None, description="The marker used in the context text, e.g. [1].")
    unit_id: str | None = None
    path: str | None = None
    section: str | None = None
    score: float | None = None


class ContextResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    query: str
    context: str = Field(description="Assembled text, each passage marked with its citation.")
    citations: list[Citation]
    tokens: int | None = Field(None, description="Tokens used by the context.")
    token_budget: int
    request_id: str | None = None


class EmbedRequest(Request):
    """Either `path` (a file inside a configured corpus root) or `name` + `content`."""

    path: str | None = Field(None, max_length=4096, description="Absolute, or relative to a corpus root.",
                             examples=["stocks/NVDA_20250120T0900.yaml"])
    name: str | None = Field(None, max_length=MAX_NAME, description="Relative name for uploaded content; "
                             "becomes the document path (unit ids start with it).", examples=["notes/fed-minutes.md"])
    content: str | None = Field(None, description="UTF-8 text of a YAML or markdown document.")
    collection: str | None = Field(None, **_STR)
    force: bool = Field(False, description="Re-chunk and re-publish even if unchanged.")

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [
            {"path": "stocks/NVDA_20250120T0900.yaml"},
            {"name": "notes/fed-minutes.md", "content": "# Fed minutes\n\n## Rates\n\nHeld at 4.5%.\n"},
        ]},
    )

    @model_validator(mode="after")
    def _one_source(self) -> EmbedRequest:
        if (self.path is None) == (self.content is None):
            raise ValueError("give either 'path' or 'content' (with 'name'), not both or neither")
        if self.content is not None and not self.name:
            raise ValueError("uploaded 'content' needs a 'name' such as 'notes/today.md'")
        return self


class FileOutcomeOut(BaseModel):
    path: str
    status: str = Field(description="new | changed | unchanged | skipped | failed")
    chunks: int = 0
    reason: str | None = None
    detail: str | None = None


class EmbedResponse(BaseModel):
    collection: str
    new: int
    changed: int
    unchanged: int
    skipped: int
    failed: int
    chunks: int
    embedded: int = Field(description="Chunks sent to the model (the rest came from the cache).")
    cache_hits: int
    seconds: float
    files: list[FileOutcomeOut]
    request_id: str | None = None


class EmbedTextRequest(Request):
    text: str = Field(..., min_length=1, max_length=MAX_TEXT)

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"text": "semiconductor export rules"}]})


class EmbedTextResponse(BaseModel):
    model: str
    dimensions: int
    space: str
    vector: list[float]


class SimilarRequest(Request):
    ref: str = Field(..., min_length=1, max_length=MAX_NAME,
                     description="A unit id (path#section), chunk id, document path or document id.")
    top_k: int = Field(10, ge=1, le=1000)
    collection: str | None = Field(None, **_STR)


class StatusResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    documents: int
    chunks: int
    tokens: int
    last_ingest: str | None = None
    by_type: dict[str, int] = Field(default_factory=dict)
    active_space: dict[str, Any] | None = None
    configured_space: str | None = None


class SourceOut(BaseModel):
    model_config = ConfigDict(extra="allow")
    collection: str
    path: str
    doc_id: str
    doc_type: str
    ticker: str | None = None
    doc_date: dt.date | None = None
    title: str | None = None
    section_count: int = 0
    chunk_count: int = 0
    token_count: int = 0
    ingested_at: dt.datetime | None = None


class SourcesPage(BaseModel):
    items: list[SourceOut]
    limit: int
    offset: int
    next_offset: int | None = Field(None, description="Pass as `offset` for the next page; null at the end.")


class SourceDetail(SourceOut):
    sections: list[dict[str, Any]] = Field(default_factory=list)
    chunks: list[dict[str, Any]] = Field(default_factory=list)


class DeleteResponse(BaseModel):
    deleted: list[str]
    collection: str


class HealthResponse(BaseModel):
    status: Literal["ok", "degraded"]
    database: bool
    model: bool


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. not_found, unauthorized, invalid_input.")
    message: str
    request_id: str | None = None
    details: list[dict[str, Any]] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"error": {"code": "unauthorized", "message": "missing or invalid API key", "request_id": "3f2a..."}},
    ]})
