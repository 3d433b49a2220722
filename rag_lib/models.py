"""Records that cross module lines: documents, sections, chunks, search hits, reports."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


# One rule for collection names everywhere (library, CLI, HTTP, MCP): a name is a folder of uploads
# and a partition-key prefix, so no '/', '..' or spaces.
COLLECTION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
# The type a document gets when it declares none, by format: markdown without `type:` in its front
# matter, YAML without `_meta.type` (nor a folder or shape that tells), a JSONL record without "type".
# A question naming one ("a note", "an unknown risk", "a record quarter") picks no kind of document.
UNDECLARED_TYPES = {"markdown": "note", "yaml": "unknown", "jsonl": "record"}


def is_text_or_texts(value: Any) -> bool:
    """A string, or a list (tuple) of strings: what a type or ticker filter takes."""
    return isinstance(value, str) or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))


def is_number(value: Any) -> bool:
    """An int or a float, not a bool (which Python counts as an int): what a numeric argument takes."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def collection_problem(name: str) -> str | None:
    """Why `name` cannot be a collection's name, or None."""
    if not isinstance(name, str) or not re.fullmatch(COLLECTION_PATTERN, name) or len(name) > 200:
        return (f"collection '{str(name)[:80]}' must be 1-200 letters, digits, '.', '_' or '-', starting with a "
                "letter or digit (no '/' or spaces)")
    return None


@dataclass(frozen=True)
class CorpusRoot:
    """A folder whose files are ingested into `collection` (paths in it are the documents' paths)."""

    path: Path
    collection: str
    name: str = ""  # the registry's stable label (partition keys start with it); "" before registration


@dataclass(frozen=True)
class SourceFile:
    """One file to process: `rel` (POSIX, relative to `root`) is its document path."""

    collection: str
    root: Path
    rel: str

    @property
    def path(self) -> Path:
        return self.root / self.rel


@dataclass
class Document:
    """A parsed input file (or JSONL record) ready to be flattened."""

    collection: str
    path: str  # relative to the corpus root; the unit-id prefix
    doc_id: str
    doc_type: str
    format: str  # yaml | markdown | jsonl
    content_hash: str
    body: Any  # dict for YAML, str for markdown/JSONL text
    title: str | None = None
    ticker: str | None = None
    doc_date: dt.date | None = None
    version: str | None = None
    source_path: str | None = None
    size_bytes: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    # YAML: the 1-based line of each top-level key, noted while the text is at hand (load), so
    # flattening gives source positions without reading the file again
    key_lines: dict[str, int] = field(default_factory=dict)
    # metadata the document gives but that cannot be used (a date that is not one, a ticker that is
    # not a symbol): the document is ingested without it, and the ingest report says so
    warnings: list[str] = field(default_factory=list)


@dataclass
class Skipped:
    """An input that was not ingested, and why (`reason` is a stable key, `detail` human text).
    `limit`: the setting it is over (`limits.max_depth`, `max_file_bytes`), when a larger value
    would accept it: an ingest under another value reads it again."""

    collection: str
    path: str
    reason: str
    detail: str
    content_hash: str | None = None
    limit: str | None = None


@dataclass
class Section:
    """One top-level YAML key or markdown H2, flattened to readable text."""

    name: str  # the key / H2 text / `_intro`: the unit's suffix
    title: str  # display name from the section mapping
    ordinal: int
    text: str
    char_start: int = 0  # markdown: offset of the section in the file
    line: int = 0  # 1-based line of the key / heading in the source file (0: unknown)
    token_count: int = 0  # model tokens of `text`, set by the chunker

    @property
    def is_empty(self) -> bool:
        return not self.text.strip()


@dataclass
class ParsedFile:
    """One file already loaded and flattened (by the server's parse sandbox), so that ingest does not
    parse it a second time: its hash, documents, skip records and each document's sections."""

    file_hash: str
    documents: list[Document]
    skips: list[Skipped]
    sections: dict[str, list[Section]]  # by document path


@dataclass
class Chunk:
    chunk_id: str
    collection: str
    path: str
    doc_id: str
    doc_type: str
    section: str
    section_path: str
    ordinal: int
    text: str
    embed_text: str
    token_count: int  # tokens of embed_text, as the model counts them
    content_hash: str
    char_start: int
    char_end: int
    ticker: str | None = None
    doc_date: dt.date | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def unit_id(self) -> str:
        return f"{self.path}#{self.section}"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["doc_date"] = self.doc_date.isoformat() if self.doc_date else None
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Chunk:
        data = dict(data)
        if data.get("doc_date"):
            data["doc_date"] = dt.date.fromisoformat(data["doc_date"])
        return cls(**data)


@dataclass
class SearchFilters:
    """Filters shared by every search mode; every value is bound as a query parameter."""

    collection: str | None = None
    doc_type: str | list[str] | None = None
    ticker: str | list[str] | None = None
    section: str | None = None
    path: str | None = None
    date_from: dt.date | None = None
    date_to: dt.date | None = None
    tags: dict[str, str | list[str]] | None = None  # client tags set at indexing (`/rag/index` metadata)
    section_contains: str | None = None  # section path contains this, any case (seed 000's ILIKE '%risk%')
    formats: list[str] | None = None  # the documents' file formats: yaml, markdown, jsonl (seed 003's source_type)


@dataclass
class SearchHit:
    chunk_id: str
    score: float
    text: str
    doc_id: str
    path: str
    section: str
    section_path: str
    unit_id: str
    doc_type: str
    collection: str
    ticker: str | None = None
    doc_date: dt.date | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    excerpt: str | None = None
    rerank_score: float | None = None  # second-stage score when reranked (`score` stays the fused one)
    # cosine similarity of the chunk to the query, whatever list found it (`score` is mode-specific:
    # the fused rank in hybrid mode); `min_similarity` applies to this
    similarity: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["doc_date"] = self.doc_date.isoformat() if self.doc_date else None
        for seed_name, ours in SEED_HIT_NAMES.items():
            out[seed_name] = out[ours]
        return out


# The seeds' names of hit fields (000's search function and Python API, §4.1/§5.5; 001 SearchResult; 004
# models.py) and the field each one repeats: every hit carries both, as attributes (`hit.content`) and
# in `to_dict()`, and the HTTP and MCP schemas are generated from this mapping (`SearchHitOut` in
# `rag_lib.server.schemas`).
SEED_HIT_NAMES: dict[str, str] = {"content": "text", "file_path": "path", "section_label": "section"}

for _seed_name, _ours in SEED_HIT_NAMES.items():
    setattr(SearchHit, _seed_name, property(lambda self, _f=_ours: getattr(self, _f),
                                            doc=f"Seed name of `{_ours}`."))


# What each `SearchHit` field means: the HTTP and MCP schemas are derived from the dataclass with these.
SEARCH_HIT_DOCS: dict[str, str] = {
    "chunk_id": "Id of the matching chunk.",
    "score": "Relevance in [0, 1] (mode-specific scale: cosine in semantic mode, the fused rank in hybrid "
             "mode; the fused score when reranked). See `similarity` for the cosine.",
    "text": "The chunk text.",
    "doc_id": "Id of the document the chunk belongs to.",
    "path": "Document path relative to its corpus root.",
    "section": "Top-level section (YAML key / H2) the chunk belongs to.",
    "section_path": "Full section path of the chunk.",
    "unit_id": "<path relative to corpus root>#<section>",
    "doc_type": "Document type, e.g. stock-analysis.",
    "collection": "Collection holding the document.",
    "ticker": "Ticker of the document, if any.",
    "doc_date": "Date of the document, if any.",
    "metadata": "Chunk metadata.",
    "excerpt": "A short part of the chunk text (best sentences for the query).",
    "rerank_score": "Second-stage (cross-encoder) score, when the results were reranked.",
    "similarity": "Cosine similarity of the chunk to the query (whichever retriever found it); "
                  "`min_similarity` applies to it. Null for lexical-mode hits when no threshold is given.",
}


@dataclass
class SearchResult:
    query: str
    mode: str
    hits: list[SearchHit]
    timings_ms: dict[str, float]
    plan: dict[str, Any] | None = None  # query classification: kind, tickers, doc_types
    reranked: bool = False  # whether a real second stage reordered the head
    expanded: list[str] = field(default_factory=list)  # the expansions searched besides the query
    note: str | None = None  # without hits: why (an empty collection, a filter matching no document…)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "query": self.query,
            "mode": self.mode,
            "results": [h.to_dict() for h in self.hits],
            "timings_ms": self.timings_ms,
            "reranked": self.reranked,
        }
        if self.plan is not None:
            out["plan"] = self.plan
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass
class FileOutcome:
    path: str
    status: str  # new | changed | unchanged | skipped | failed
    chunks: int = 0
    reason: str | None = None
    detail: str | None = None
    warnings: list[str] = field(default_factory=list)  # the document's metadata warnings (`Document.warnings`)


@dataclass
class IngestReport:
    collection: str
    outcomes: list[FileOutcome] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    # documents within the ingested paths whose files are gone, still served: a run without prune
    stale: list[str] = field(default_factory=list)
    # files skipped by this run whose last good version's documents are still served
    held: list[str] = field(default_factory=list)
    # Chunks and texts are counted apart, as `rag reembed` counts them (`ReembedReport`): chunks with
    # the same text (a copied file, a repeated disclaimer) share one vector, embedded once.
    chunks_from_cache: int = 0  # of the chunks published, the ones whose text's vector was in the embedding cache
    texts_embedded: int = 0  # distinct chunk texts the provider embedded for the others (what it bills)
    seconds: float = 0.0
    profiles: dict[str, Any] = field(default_factory=dict)  # the ticker-profile rebuild, when one ran

    def count(self, status: str) -> int:
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def chunks(self) -> int:
        return sum(o.chunks for o in self.outcomes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "collection": self.collection,
            "new": self.count("new"),
            "changed": self.count("changed"),
            "unchanged": self.count("unchanged"),
            "skipped": self.count("skipped"),
            "failed": self.count("failed"),
            "pruned": self.pruned,
            "stale": self.stale,
            "held": self.held,
            "chunks": self.chunks,
            "chunks_from_cache": self.chunks_from_cache,
            "texts_embedded": self.texts_embedded,
            "seconds": round(self.seconds, 3),
            "profiles": self.profiles,
            "files": [asdict(o) for o in self.outcomes],
        }


@dataclass(frozen=True)
class GraphNode:
    """A knowledge-graph node: `key` is unique per collection (`doc:<path>`, `ticker:NVDA`, an entity name)."""

    key: str
    kind: str  # doc | ticker | doc_type | date | an entity type from `_graph` (bias, strategy, ...) | entity
    label: str


@dataclass(frozen=True)
class GraphEdge:
    """A fact `src --predicate--> dst` found in document `path`, section `section` (its provenance)."""

    src: str
    predicate: str
    dst: str
    section: str
    role: str | None = None  # the `_links` key (analysis, strategy, ...) for links_to edges


@dataclass(frozen=True)
class GraphAlias:
    """A name the document gives node `key`: `alias` is the normalised spelling resolution looks up,
    `spelling` the name as written (`loss_aversion`, `NVIDIA Corporation`, `TRD-2025-001`)."""

    alias: str
    key: str
    spelling: str


@dataclass
class DocumentGraph:
    """The nodes and edges one document contributes; `dangling` lists `_links` not found in the corpus."""

    collection: str
    path: str
    nodes: list[GraphNode] = field(default_factory=list)
    edges: list[GraphEdge] = field(default_factory=list)
    dangling: list[str] = field(default_factory=list)
    aliases: list[GraphAlias] = field(default_factory=list)

    def triples(self) -> set[tuple[str, str, str]]:
        return {(e.src, e.predicate, e.dst) for e in self.edges}


@dataclass
class SearchMetric:
    """What one search did and cost (a row of `rag_search_metrics`, a line of the JSONL log)."""

    query: str
    mode: str
    strategy: str
    results: int
    latency_ms: float
    query_class: str | None = None
    top_score: float | None = None  # the highest hit `score` (mode-specific: the fused score in hybrid mode)
    reranked: bool = False
    collection: str | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)
    at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
    # the first hit's cosine with the query (`SearchHit.similarity`; None when no retriever gave one,
    # e.g. a lexical search): seed 004's `top_similarity`. In the JSONL log, not the table.
    top_similarity: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["at"] = self.at.isoformat()
        return out


@dataclass
class EmbedMetric:
    """One embedding call: who answered, how long it took, retries, and whether a fallback served it."""

    provider: str
    model: str | None
    inputs: int
    latency_ms: float
    retries: int = 0
    fallback: bool = False
    ok: bool = True
    error: str | None = None
    at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))
