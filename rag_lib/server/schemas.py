"""Request and response models of the HTTP API. Requests forbid unknown fields, so filters are a
whitelist; lengths are bounded here (422) and the whole body by the size limit (413)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import typing
from typing import Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, create_model, model_validator

from rag_lib.config import ServerSettings
from rag_lib.errors import LONE_SURROGATE
from rag_lib.models import COLLECTION_PATTERN, SEARCH_HIT_DOCS, SEED_HIT_NAMES, FileOutcome, SearchHit, collection_problem
from rag_lib.search.classify import QueryPlan
from rag_lib.search.context import Citation as ContextCitation

# Hard ceilings of the schema; settings.server can only tighten them (checked in the routes).
MAX_QUERY = 4000
MAX_TEXT = 100_000
# Request fields settings.server bounds (checked in `service` for every route and tool taking them),
# with the JSON-schema keyword that publishes the bound: `bound_schema` makes the published schemas
# (OpenAPI, MCP tool inputs) show the setting in force, not the ceiling above it.
SETTING_BOUNDS: dict[str, tuple[str, str]] = {
    "query": ("maxLength", "max_query_chars"), "top_k": ("maximum", "max_top_k"),
    "token_budget": ("maximum", "max_token_budget"), "text": ("maxLength", "max_text_chars"),
}
MAX_NAME = 512
Name = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
Mode = Literal["semantic", "lexical", "hybrid"]

_STR = dict(min_length=1, max_length=200)
# a tag value given to `/rag/index` (`metadata`) and matched by `/rag/retrieve` (`filters`)
TagValue = typing.Annotated[str, Field(max_length=200)] | int | float | bool | None

# A collection is one folder under the upload directory: one path component from a small alphabet,
# so `ca` + `b/x.md` and `ca/b` + `x.md` (or `default/texts`) can never name the same file.
def check_collection(value: str) -> str:
    """A collection name as requests may give it (letters, digits, '.', '_', '-'; no '/')."""
    if "\x00" in value:  # the same code as a NUL anywhere else in a request
        raise ValueError("invalid_character: collection holds a NUL character; remove it")
    if problem := collection_problem(value):
        raise ValueError(problem)
    return value


CollectionName = typing.Annotated[str, Field(min_length=1, max_length=200, json_schema_extra={
    "pattern": COLLECTION_PATTERN}, description="Collection (default: settings.collection)."),
    AfterValidator(check_collection)]



def bound_schema(schema: dict[str, Any], server: ServerSettings) -> None:
    """Tighten, in place, the `SETTING_BOUNDS` fields of one request's JSON schema (a request body or
    a tool's input) to what `server` accepts: the setting or the schema's ceiling, the lower."""
    for name, (keyword, setting) in SETTING_BOUNDS.items():
        field = schema.get("properties", {}).get(name)
        if field is None:
            continue
        limit = getattr(server, setting)
        for part in [field, *field.get("anyOf", [])]:  # `int | None` puts the bound in a branch
            if part.get("type") == ("integer" if keyword == "maximum" else "string"):
                part[keyword] = min(part.get(keyword, limit), limit)


def bound_openapi(spec: dict[str, Any], server: ServerSettings) -> None:
    """`bound_schema` on every JSON request body of an OpenAPI document."""
    schemas = spec.get("components", {}).get("schemas", {})
    for operations in spec.get("paths", {}).values():
        for operation in operations.values():
            body = (operation.get("requestBody") or {}).get("content", {}).get("application/json", {})
            ref = body.get("schema", {}).get("$ref", "")
            if ref.startswith("#/components/schemas/"):
                bound_schema(schemas[ref.rsplit("/", 1)[1]], server)


def invalid_value(value: Any) -> str | None:
    """Where `value` (parsed JSON: strings, numbers, lists, dicts) holds what the store cannot keep: a
    lone UTF-16 surrogate (not encodable as UTF-8) or a NaN/Infinity (not JSON for PostgreSQL). None
    when clean. Iterative, so nesting depth costs nothing; dict keys are checked too."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            if LONE_SURROGATE.search(item):
                return f"{where or 'a text field'} holds a lone surrogate (an unpaired \\ud800-\\udfff escape); " \
                       "send valid UTF-8 text"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{where or 'a number'} is {item}; NaN and Infinity are not valid JSON numbers"
        elif isinstance(item, dict):
            for key, val in item.items():
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and LONE_SURROGATE.search(key):
                    return f"a key in {where or 'the body'} holds a lone surrogate; send valid UTF-8 text"
                stack.append((name, val))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{n}]", v) for n, v in enumerate(item))
    return None


class Request(BaseModel):
    """Every request body: unknown fields refused, and (for every string and JSON field, nested ones
    too) lone surrogates and NaN/Infinity refused with a 422 before any route runs: PostgreSQL cannot
    store them, and finding out there would be a 500, possibly after an ingest committed."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problem = invalid_value(data)
        if problem:
            raise ValueError(problem)
        return data


class SearchFiltersIn(Request):
    """Metadata filters (ANDed); lists mean 'any of'. Values are bound as SQL parameters."""

    doc_type: str | list[str] | None = Field(None, examples=[["stock-analysis", "earnings-analysis"]])
    ticker: str | list[str] | None = Field(None, examples=["NVDA"])
    section: str | None = Field(None, max_length=200, examples=["risk"], description="Sections whose path "
                                "contains this, in any case (seed 000's ILIKE '%risk%', as `rag search --section`).")
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


FILTER_FIELDS = ("doc_type", "ticker", "section", "path", "date_from", "date_to")


def _lift_filters(data: Any) -> Any:
    """Seed 000 sends filters at the top level (`{"query", "ticker", "doc_type"}`): move them into
    `filters`; the same filter given both ways is refused rather than guessed."""
    if not isinstance(data, dict):
        return data
    top = {k: data[k] for k in FILTER_FIELDS if k in data}
    if not top:
        return data
    nested = data.get("filters") or {}
    if not isinstance(nested, dict):
        return data
    both = sorted(set(top) & set(nested))
    if both:
        raise ValueError(f"{', '.join(both)} given both at the top level and in 'filters'; give it once")
    rest = {k: v for k, v in data.items() if k not in top}
    return {**rest, "filters": {**nested, **top}}


class SearchRequest(Request):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY, description="What to look for, in words.")
    mode: Mode | None = Field(None, description="semantic | lexical | hybrid (default: hybrid when available).")
    filters: SearchFiltersIn = Field(default_factory=SearchFiltersIn,
                                     description="Metadata filters; seed-style top-level `ticker`, `doc_type`, "
                                     "`section`, `path`, `date_from`, `date_to` are accepted too.")
    top_k: int | None = Field(None, ge=1, le=1000, description="How many results (default: settings.search.top_k, "
                              "10; capped by settings.server.max_top_k).")
    min_similarity: float = Field(0.0, ge=0.0, le=1.0, description="Drop results whose cosine similarity to the "
                                  "query (`similarity`) is below this, whichever retriever found them.")
    collection: CollectionName | None = None
    rerank: bool | None = Field(None, description="Rerank with the configured second stage (default: settings).")

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [
            {"query": "NVDA data center revenue growth catalysts", "mode": "hybrid", "top_k": 5,
             "filters": {"ticker": "NVDA", "doc_type": ["stock-analysis"], "date_from": "2025-01-01"}},
            {"query": "AI capex thesis", "ticker": "NVDA", "doc_type": "earnings-analysis", "top_k": 5,
             "min_similarity": 0.4},
        ]},
    )

    @model_validator(mode="before")
    @classmethod
    def _top_level_filters(cls, data: Any) -> Any:
        return _lift_filters(data)


def _dataclass_field(annotation: Any, field: dataclasses.Field, description: str | None) -> tuple[Any, Any]:
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        default = field.default_factory()  # type: ignore[misc]
    else:
        default = ...
    return annotation, Field(default, description=description)


def model_of(record: type, name: str, doc: str, docs: dict[str, str] | None = None,
             extra: dict[str, tuple[Any, Any]] | None = None) -> type[BaseModel]:
    """The response model of a `rag_lib.models` dataclass: its fields, types and defaults (one
    definition of the record), with `docs` as field descriptions and `extra` fields placed first."""
    hints = typing.get_type_hints(record)
    fields: dict[str, Any] = dict(extra or {})
    for f in dataclasses.fields(record):
        fields[f.name] = _dataclass_field(hints[f.name], f, (docs or {}).get(f.name))
    return create_model(name, __doc__=doc, **fields)


def _search_hit_model() -> type[BaseModel]:
    """`SearchHitOut` is `rag_lib.models.SearchHit` plus its rank and the seeds' names: one definition of a hit."""
    hints = typing.get_type_hints(SearchHit)
    by_name = {f.name: f for f in dataclasses.fields(SearchHit)}
    extra: dict[str, tuple[Any, Any]] = {"rank": (int, Field(..., description="1-based position in the results."))}
    model = model_of(SearchHit, "SearchHitOut", "One search result (a chunk of a document unit).",
                     SEARCH_HIT_DOCS, extra)
    seeds: dict[str, Any] = {}
    for seed_name, ours in SEED_HIT_NAMES.items():  # the seeds' names, typed as the fields they repeat
        annotation, _ = _dataclass_field(hints[ours], by_name[ours], None)
        seeds[seed_name] = (annotation, Field(..., description=f"Same as `{ours}` (the seeds' name)."))
    return create_model("SearchHitOut", __base__=model, __doc__=model.__doc__, **seeds)


SearchHitOut = _search_hit_model()

# The library's QueryPlan as clients see it: one definition, so a field the library adds shows up here too.
SearchPlan = model_of(QueryPlan, "SearchPlan", "How the query was read: its kind and the tickers and document "
                      "types it names (they boost matching hits; a comparison also searches each ticker).", {
                          "query": "The query as classified.",
                          "kind": "retrieval | comparison | relationship | trend | global",
                          "tickers": "Tickers the query names, or that entity linking found (see `linked`).",
                          "doc_types": "Document types the query names.",
                          "linked": "Tickers entity linking added, with their similarity to the query.",
                          "type_lists": "Hybrid: document types the query selects by name (\"a trade journal\", "
                                        "\"the stock analyses\") whose documents were also searched alone "
                                        "(`search.type_list_weight`).",
                          "lexical_closeness": "Hybrid: full text's first chunks' mean cosine with the query over "
                                               "the semantic list's first chunks'; below `search.lexical_far_ratio` "
                                               "full text weighs less."})


class SearchResponse(BaseModel):
    query: str
    mode: str
    results: list[SearchHitOut]  # type: ignore[valid-type]
    count: int = Field(description="Number of results.")
    timings_ms: dict[str, float] = Field(description="Embedding, database and total time in ms.")
    reranked: bool = Field(False, description="Whether a second-stage reranker reordered the results.")
    rerank_note: str | None = Field(None, description="When reranking was asked for but is not configured: "
                                    "which setting turns it on.")
    note: str | None = Field(None, description="When nothing was found, why: the collection holds no documents "
                             "(and which do), a filter matches none of its documents (with its types, close "
                             "tickers, dated range or paths), the filters match only apart, or min_similarity.")
    plan: SearchPlan | None = Field(None, description="How the query was classified and routed "  # type: ignore[valid-type]
                                    "(null when the library made no plan).")
    request_id: str | None = None


class ContextRequest(Request):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY)
    token_budget: int = Field(2000, ge=50, le=100_000, description="Upper bound on context tokens.")
    mode: Mode | None = None
    filters: SearchFiltersIn = Field(default_factory=SearchFiltersIn)
    collection: CollectionName | None = None

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"query": "What are the risks to the AMD thesis?", "token_budget": 1500}]},
    )

    @model_validator(mode="before")
    @classmethod
    def _top_level_filters(cls, data: Any) -> Any:
        return _lift_filters(data)


Citation = model_of(ContextCitation, "Citation", "A passage of the context: its marker, unit and source.",
                    {"ref": "The marker used in the context text, e.g. [1]."})


class ContextResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    query: str
    context: str = Field(description="Assembled text, each passage marked with its citation.")
    citations: list[Citation]  # type: ignore[valid-type]
    tokens: int | None = Field(None, description="Tokens used by the context.")
    token_budget: int
    request_id: str | None = None


class EmbedRequest(Request):
    """Either `path` (a file inside a configured corpus root) or `name` + `content`."""

    path: str | None = Field(None, validation_alias=AliasChoices("path", "file_path"), max_length=4096,
                             description="Absolute, or relative to a corpus root (seed 000: `file_path`).",
                             examples=["stocks/NVDA_20250120T0900.yaml"])
    name: str | None = Field(None, max_length=MAX_NAME, description="Relative name for uploaded content; "
                             "becomes the document path (unit ids start with it).", examples=["notes/fed-minutes.md"])
    content: str | None = Field(None, description="UTF-8 text of a YAML or markdown document.")
    collection: CollectionName | None = None
    force: bool = Field(False, description="Re-chunk and re-publish even if unchanged.")

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [
            {"path": "stocks/NVDA_20250120T0900.yaml"},
            {"file_path": "stocks/NVDA_20250120T0900.yaml", "force": False},
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


FileOutcomeOut = model_of(FileOutcome, "FileOutcomeOut", "What an ingest did to one file.",
                          {"status": "new | changed | unchanged | skipped | failed"})


class EmbedResponse(BaseModel):
    collection: str
    new: int
    changed: int
    unchanged: int
    skipped: int
    failed: int
    chunks: int = Field(description="Chunks published (each given a vector).")
    chunks_from_cache: int = Field(description="Of those chunks, the ones whose text's vector was in the embedding cache.")
    texts_embedded: int = Field(description="Distinct chunk texts the model embedded for the other chunks (chunks "
                                "with the same text share one).")
    seconds: float
    files: list[FileOutcomeOut]  # type: ignore[valid-type]
    doc_id: str | None = Field(None, description="Id of the document (one-file requests).")
    status: str | None = Field(None, description="embedded | unchanged | skipped | failed (one-file requests).")
    content_hash: str | None = Field(None, description="sha256 of the file (one-file requests).")
    tokens_processed: int = Field(0, description="Model tokens of the documents published by this request.")
    chunk_count: int | None = Field(None, description="Chunks of the document (one-file requests; seed 001).")
    embed_model: str | None = Field(None, description="Embedding model of the document (one-file requests).")
    error_message: str | None = Field(None, description="Null when embedded, 'unchanged', or why the file was "
                                      "skipped or failed (one-file requests; seed 001).")
    request_id: str | None = None


# One spelling of a stored text's id and ticker for HTTP and MCP (what the loader would accept in a file).
DOC_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:\-]*$"
TICKER_PATTERN = r"^[A-Za-z][A-Za-z0-9.\-]*$"


class EmbedTextRequest(Request):
    text: str = Field(..., min_length=1, max_length=MAX_TEXT)
    doc_id: str | None = Field(None, min_length=1, max_length=200, pattern=DOC_ID_PATTERN,
                               description="Store the text as a document with this id (seed 000). Without it, "
                               "the text's vector is returned and nothing is stored.")
    doc_type: str | None = Field(None, **_STR, description="Document type of the stored text, e.g. article.")
    ticker: str | None = Field(None, min_length=1, max_length=10, pattern=TICKER_PATTERN)
    title: str | None = Field(None, max_length=500)
    doc_date: dt.date | None = Field(None, description="Date of the stored text (YYYY-MM-DD).")
    collection: CollectionName | None = None
    force: bool = Field(False, description="Re-process even if unchanged.")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"text": "semiconductor export rules"},
        {"text": "NVIDIA reported strong Q4...", "doc_id": "external-001", "doc_type": "article", "ticker": "NVDA"},
    ]})

    @model_validator(mode="after")
    def _stored_needs_id(self) -> EmbedTextRequest:
        if self.doc_id is None and any(v is not None for v in (self.doc_type, self.ticker, self.title, self.doc_date)):
            raise ValueError("doc_type, ticker, title and doc_date describe a stored text: give doc_id too")
        return self


class EmbedTextResponse(BaseModel):
    """The vector of a text (nothing stored)."""

    model: str
    dimensions: int
    space: str
    vector: list[float]


class StoredTextResponse(BaseModel):
    """A text stored as a document (seed 000's `embed-text`)."""

    doc_id: str
    path: str = Field(description="Where the text is kept, relative to the upload folder of the collection.")
    collection: str
    chunks: int
    tokens_processed: int
    content_hash: str | None = None
    status: str = Field(description="embedded | unchanged")
    request_id: str | None = None


class SimilarRequest(Request):
    ref: str = Field(..., min_length=1, max_length=MAX_NAME,
                     description="A unit id (path#section), chunk id, document path or document id.")
    top_k: int = Field(10, ge=1, le=1000)
    collection: CollectionName | None = None


class StatusResponse(BaseModel):
    model_config = ConfigDict(extra="allow")
    documents: int
    chunks: int
    tokens: int
    last_ingest: str | None = None
    by_type: dict[str, int] = Field(default_factory=dict)
    active_space: dict[str, Any] | None = None
    configured_space: str | None = None
    index_size_mb: float | None = Field(None, description="Size of the chunk, vector and index tables in MB.")


class SourceOut(BaseModel):
    """A document as clients see it; other columns (absolute source paths, fingerprints) are dropped
    when a response is validated against this model."""

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
    content_hash: str | None = Field(None, description="sha256 of the source file.")


class SourcesPage(BaseModel):
    items: list[SourceOut]
    limit: int
    offset: int
    next_offset: int | None = Field(None, description="Pass as `offset` for the next page; null at the end.")


class SourceDetail(SourceOut):
    tags: dict[str, Any] = Field(default_factory=dict, description="Tags given at `/rag/index` (`metadata`).")
    sections: list[dict[str, Any]] = Field(default_factory=list)
    chunks: list[dict[str, Any]] = Field(default_factory=list)


class DeleteResponse(BaseModel):
    deleted: list[str]
    collection: str
    doc_id: str | None = None
    chunks_deleted: int = 0
    status: Literal["deleted"] = "deleted"
    files_removed: list[str] = Field(default_factory=list, description="Uploaded files removed from the upload "
                                     "folder (relative to it); corpus files are never touched.")
    file_errors: list[str] = Field(default_factory=list, description="Uploaded files that could not be removed "
                                   "(the documents are deleted; the server log has the detail).")


# ---- seed 003's service API (`/rag/*`): the same operations under the seed's names ----------

class IndexRequest(Request):
    source_type: str | None = Field(None, max_length=50, description="markdown | yaml | jsonl (informational; "
                                    "the format comes from the file).")
    source_path: str = Field(..., min_length=1, max_length=4096, description="A file inside a corpus root.")
    metadata: dict[str, TagValue] = Field(
        default_factory=dict, max_length=50,
        description="Tags kept with the document (e.g. `{\"category\": \"documentation\"}`): they survive "
        "re-ingests and `/rag/retrieve` filters on them. The document's own metadata comes from the file "
        "(YAML `_meta` / markdown front matter).")
    collection: CollectionName | None = None
    force: bool = False

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"source_type": "markdown", "source_path": "docs/ARCHITECTURE.md",
         "metadata": {"category": "documentation", "version": "1.0.0"}},
    ]})


class IndexResponse(BaseModel):
    source_id: str | None
    source_path: str
    chunks_created: int
    tokens_processed: int
    duration_ms: float
    status: str = Field(description="indexed | unchanged | skipped | failed")
    content_hash: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class DateRange(Request):
    """Seed 003's `date_range`: documents dated within it (either end may be left out)."""

    from_: dt.date | None = Field(None, alias="from", examples=["2025-01-01"])
    to: dt.date | None = Field(None, examples=["2025-12-31"])

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, populate_by_name=True)


class RetrieveFilters(Request):
    """Seed 003's filters: `source_type` is the file format (markdown, yaml, jsonl); `category` and
    `tags` match the tags given to `/rag/index` as `metadata`; `date_range` the document's date;
    `doc_type`, `ticker` and `section` as in `/api/rag/search`. Other keys are refused (422) with
    the way to match them as tags, not ignored."""

    source_type: str | list[str] | None = Field(None, max_length=50, description="markdown | yaml | jsonl "
                                                "(seed 003's openapi and run_report match nothing).")
    date_range: DateRange | None = Field(None, description="`{\"from\": date, \"to\": date}`: documents dated within.")
    section: str | None = Field(None, max_length=200, description="Sections whose path contains this, any case.")
    category: str | list[str] | None = Field(None, max_length=50, description="Tag `category` set at "
                                             "`/rag/index` (a list: any of them).")
    tags: dict[str, TagValue | list[TagValue]] | None = Field(
        None, max_length=20, description="Tags set at `/rag/index`; every key must match (a list: any of its values).")
    doc_type: str | list[str] | None = Field(None, max_length=50)
    ticker: str | list[str] | None = Field(None, max_length=50)

    @model_validator(mode="before")
    @classmethod
    def _unknown_keys(cls, data: Any) -> Any:
        """A key that is no filter is refused naming the way to match the metadata given to `/rag/index`."""
        if isinstance(data, dict):
            extra = sorted(k for k in data if k not in cls.model_fields)
            if extra:
                example = ", ".join(f'"{k}": ...' for k in extra)
                raise ValueError(f"{', '.join(extra)}: not a filter; metadata given to /rag/index is matched "
                                 f"through 'tags' ({{\"tags\": {{{example}}}}}); the filters are "
                                 f"{', '.join(cls.model_fields)}")
        return data


class RetrieveRequest(Request):
    query: str = Field(..., min_length=1, max_length=MAX_QUERY)
    top_k: int = Field(5, ge=1, le=1000)
    similarity_threshold: float = Field(0.0, ge=0.0, le=1.0, description="Same as `min_similarity` (seed 003's "
                                        "default 0.7 is not ours: see README, Retrieval).")
    filters: RetrieveFilters = Field(default_factory=RetrieveFilters)
    mode: Mode | None = None
    collection: CollectionName | None = None

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"query": "How do I configure backtesting splits?", "top_k": 5, "similarity_threshold": 0.7},
    ]})


class RetrieveHit(BaseModel):
    chunk_id: str
    source_id: str
    source_path: str
    content: str
    relevance_score: float
    metadata: dict[str, Any]


class RetrieveResponse(BaseModel):
    results: list[RetrieveHit]
    query_embedding_time_ms: float
    search_time_ms: float
    total_chunks_searched: int = Field(description="Chunks in the collection searched.")


class SourceSummary(BaseModel):
    source_id: str
    source_type: str
    source_path: str
    chunk_count: int
    indexed_at: dt.datetime | None = None
    content_hash: str | None = None


class SourcesListing(BaseModel):
    sources: list[SourceSummary]
    total_sources: int
    total_chunks: int


class SourceDeleted(BaseModel):
    source_id: str
    chunks_deleted: int
    status: Literal["deleted"] = "deleted"


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
