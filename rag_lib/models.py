"""Records that cross module lines: documents, sections, chunks, search hits, reports."""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


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


@dataclass
class Skipped:
    """An input that was not ingested, and why (`reason` is a stable key, `detail` human text)."""

    collection: str
    path: str
    reason: str
    detail: str
    content_hash: str | None = None


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

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["doc_date"] = self.doc_date.isoformat() if self.doc_date else None
        return out


@dataclass
class SearchResult:
    query: str
    mode: str
    hits: list[SearchHit]
    timings_ms: dict[str, float]
    plan: dict[str, Any] | None = None  # query classification: kind, tickers, doc_types

    def to_dict(self) -> dict[str, Any]:
        out = {
            "query": self.query,
            "mode": self.mode,
            "results": [h.to_dict() for h in self.hits],
            "timings_ms": self.timings_ms,
        }
        if self.plan is not None:
            out["plan"] = self.plan
        return out


@dataclass
class FileOutcome:
    path: str
    status: str  # new | changed | unchanged | skipped | failed
    chunks: int = 0
    reason: str | None = None
    detail: str | None = None


@dataclass
class IngestReport:
    collection: str
    outcomes: list[FileOutcome] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    embedded: int = 0  # chunks sent to the provider
    cache_hits: int = 0
    seconds: float = 0.0

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
            "chunks": self.chunks,
            "embedded": self.embedded,
            "cache_hits": self.cache_hits,
            "seconds": round(self.seconds, 3),
            "files": [asdict(o) for o in self.outcomes],
        }
