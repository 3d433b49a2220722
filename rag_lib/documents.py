"""Turn files into `Document`s or `Skipped` records: detect format and type, extract metadata,
hash content, and recognise bad input (malformed, template, empty, binary, oversize, unknown)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rag_lib.models import Document, Skipped

YAML_SUFFIXES = {".yaml", ".yml"}
MARKDOWN_SUFFIXES = {".md", ".markdown"}
JSONL_SUFFIXES = {".jsonl"}
SUPPORTED_SUFFIXES = YAML_SUFFIXES | MARKDOWN_SUFFIXES | JSONL_SUFFIXES
IGNORED_DIRS = {".git", "__pycache__", ".rag", "node_modules", ".venv"}

PLACEHOLDER = re.compile(r"\{[A-Z][A-Z0-9_\-]*\}")
TICKER = re.compile(r"^[A-Z][A-Z0-9.\-]{0,9}$")
FILE_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T\d{4}")

# Real spellings seen in the corpus, normalised to one canonical name per type.
TYPE_ALIASES = {
    "stock-analysis": "stock-analysis",
    "earnings-analysis": "earnings-analysis",
    "research": "research-analysis",  # the seeds' name for the type (issue 17)
    "research-analysis": "research-analysis",
    "ticker": "ticker-profile",
    "ticker-profile": "ticker-profile",
    "trade-journal": "trade-journal",
    "trade": "trade-journal",
    "strategy": "strategy",
    "learning": "learning",
    "scanner-config": "scanner-config",
    "scanner": "scanner-config",
    "scanner-run": "scanner-run",
    "market-scanning": "scanner-run",
    "watchlist": "watchlist",
    "post-trade-review": "post-trade-review",
    "reference": "reference",
}

# Folder names that imply a type when `_meta.type` is missing.
PATH_HINTS = [
    ("earnings", "earnings-analysis"),
    ("ticker-profiles", "ticker-profile"),
    ("stock", "stock-analysis"),
    ("research", "research-analysis"),
    ("trades", "trade-journal"),
    ("strategies", "strategy"),
    ("learnings", "learning"),
    ("scanners", "scanner-config"),
    ("watchlist", "watchlist"),
    ("reviews", "post-trade-review"),
    ("reference", "reference"),
]

# Top-level keys that imply a type when neither `_meta` nor the path says.
SHAPE_HINTS = [
    ({"execution", "thesis"}, "trade-journal"),
    ({"phase1_catalyst"}, "stock-analysis"),
    ({"scanner_config"}, "scanner-config"),
    ({"key_finding"}, "research-analysis"),
]

IDENTITY_FIELDS = ("id", "created", "ticker", "date", "analysis_date", "symbol")

# libyaml's loader is several times faster than the pure-Python one and accepts the same YAML.
YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_yaml(text: str):
    """`yaml.safe_load` through libyaml when available."""
    return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a safe loader)


def normalise_type(raw: str | None) -> str | None:
    """Canonical document type for a `_meta.type` spelling (e.g. `stock_analysis`)."""
    if not raw or not isinstance(raw, str):
        return None
    key = raw.strip().lower().replace("_", "-").replace(" ", "-")
    return TYPE_ALIASES.get(key, key)


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def iter_corpus_files(root: Path) -> Iterator[Path]:
    """Every file under `root` (sorted, ignoring VCS/cache folders), or `root` itself if a file."""
    if root.is_file():
        yield root
        return
    for path in sorted(root.rglob("*")):
        if path.is_file() and not any(part in IGNORED_DIRS for part in path.relative_to(root).parts):
            yield path


def _type_from_path(rel_path: str) -> str | None:
    parts = [p.lower() for p in Path(rel_path).parts[:-1]]
    for hint, doc_type in PATH_HINTS:
        if hint in parts:
            return doc_type
    return None


def _type_from_shape(body: dict[str, Any]) -> str | None:
    keys = set(body)
    for needed, doc_type in SHAPE_HINTS:
        if needed <= keys:
            return doc_type
    return None


def _as_date(value: Any) -> dt.date | None:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip()[:10])
        except ValueError:
            return None
    return None


def _scalars(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        for value in obj.values():
            yield from _scalars(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _scalars(value)
    else:
        yield obj


def is_template(body: dict[str, Any]) -> bool:
    """A template has `{PLACEHOLDER}` values in identity fields (real docs only have them in paths)."""
    meta = body.get("_meta") if isinstance(body.get("_meta"), dict) else {}
    for source in (meta, body):
        for name in IDENTITY_FIELDS:
            value = source.get(name)
            if isinstance(value, str) and PLACEHOLDER.search(value):
                return True
    strings = [v for v in _scalars(body) if isinstance(v, str)]
    placeholders = sum(1 for v in strings if PLACEHOLDER.fullmatch(v.strip()))
    return len(strings) >= 10 and placeholders / len(strings) >= 0.25


def _yaml_error_detail(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return f"malformed YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return f"malformed YAML: {problem}"


def _yaml_metadata(body: dict[str, Any], rel_path: str) -> dict[str, Any]:
    meta = body.get("_meta") if isinstance(body.get("_meta"), dict) else {}
    doc_type = (
        normalise_type(meta.get("type") or meta.get("doc_type"))
        or _type_from_path(rel_path)
        or _type_from_shape(body)
        or "unknown"
    )
    ticker = body.get("ticker") or meta.get("ticker") or body.get("symbol")
    if not isinstance(ticker, str) or not TICKER.match(ticker.strip().upper()):
        ticker = None
        match = re.match(r"^([A-Z]{1,5})_\d{8}T\d{4}", Path(rel_path).name)
        if match and doc_type not in ("research-analysis", "unknown"):
            ticker = match.group(1)
    date = None
    for value in (
        body.get("analysis_date"),
        body.get("date"),
        body.get("trade_date"),
        meta.get("date"),
        meta.get("created"),
    ):
        date = _as_date(value)
        if date:
            break
    if date is None and (m := FILE_DATE.search(Path(rel_path).name)):
        date = _as_date(f"{m.group(1)}-{m.group(2)}-{m.group(3)}")
    title = body.get("title") or meta.get("title")
    extra = {k: str(v) for k, v in meta.items() if k in ("status", "created", "updated", "skill_version")}
    return {
        "doc_id": str(meta.get("id") or body.get("id") or Path(rel_path).stem),
        "doc_type": doc_type,
        "ticker": ticker.strip().upper() if isinstance(ticker, str) else None,
        "doc_date": date,
        "version": str(meta["version"]) if meta.get("version") is not None else None,
        "title": str(title) if title else None,
        "metadata": extra,
    }


_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)


def _markdown_metadata(text: str, rel_path: str) -> dict[str, Any]:
    front: dict[str, Any] = {}
    if match := _FRONT_MATTER.match(text):
        try:
            loaded = parse_yaml(match.group(1))
            front = loaded if isinstance(loaded, dict) else {}
        except yaml.YAMLError:
            front = {}  # front matter is optional decoration; its text is still indexed in _intro
    title_match = re.search(r"^# (.+)$", text, re.M)
    title = front.get("title") or front.get("name") or (title_match.group(1).strip() if title_match else None)
    return {
        "doc_id": str(front.get("id") or rel_path),
        "doc_type": normalise_type(front.get("type")) or "note",
        "ticker": None,
        "doc_date": _as_date(front.get("date")),
        "version": str(front["version"]) if front.get("version") is not None else None,
        "title": str(title) if title else Path(rel_path).stem,
        "metadata": {k: str(v) for k, v in front.items() if isinstance(v, (str, int, float))},
    }


def _decode(raw: bytes) -> str | tuple[str, str]:
    """Text of a file, or (reason, detail) if it is binary or not UTF-8."""
    if b"\x00" in raw[:8192]:
        return ("binary", "binary file (NUL bytes); only UTF-8 text is ingested")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return ("not_utf8", f"not valid UTF-8 at byte {exc.start}; re-save the file as UTF-8")


def load_file(path: Path, root: Path, collection: str, max_bytes: int) -> list[Document | Skipped]:
    """Parse one file into documents (JSONL: one per record) or a skip record with its reason."""
    rel = path.relative_to(root).as_posix() if root.is_dir() else path.name
    suffix = path.suffix.lower()

    def skip(reason: str, detail: str, digest: str | None = None) -> list[Document | Skipped]:
        return [Skipped(collection, rel, reason, detail, digest)]

    if suffix not in SUPPORTED_SUFFIXES:
        return skip("unknown_format", f"unsupported file type '{suffix or path.name}'; use .yaml, .md or .jsonl")
    size = path.stat().st_size
    # A JSONL corpus is many documents: the size limit applies to each record, not the file.
    if size > max_bytes and suffix not in JSONL_SUFFIXES:
        return skip("too_large", f"{size} bytes is over the {max_bytes}-byte limit (max_file_bytes)")
    raw = path.read_bytes()
    digest = content_hash(raw)
    if not raw.strip():
        return skip("empty", "file is empty", digest)
    text = _decode(raw)
    if isinstance(text, tuple):
        return skip(*text, digest)
    common = {"collection": collection, "source_path": str(path.resolve()), "size_bytes": size}

    if suffix in JSONL_SUFFIXES:
        return list(_load_jsonl(text, rel, digest, common, max_bytes))
    if suffix in MARKDOWN_SUFFIXES:
        meta = _markdown_metadata(text, rel)
        return [Document(path=rel, format="markdown", content_hash=digest, body=text, **meta, **common)]

    try:
        body = parse_yaml(text)
    except yaml.YAMLError as exc:
        return skip("malformed_yaml", _yaml_error_detail(exc), digest)
    if body is None:
        return skip("empty", "YAML holds no data", digest)
    if not isinstance(body, dict):
        return skip("unsupported_structure", f"top level is a {type(body).__name__}, expected a mapping", digest)
    if is_template(body):
        return skip("template", "template with {PLACEHOLDER} values, not a real document", digest)
    meta = _yaml_metadata(body, rel)
    return [Document(path=rel, format="yaml", content_hash=digest, body=body, **meta, **common)]


def _load_jsonl(
    text: str, rel: str, digest: str, common: dict[str, Any], max_bytes: int
) -> Iterator[Document | Skipped]:
    """BEIR-style records: `{"_id", "title", "text"}`; each is a document whose path is its id."""
    collection = common["collection"]
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(line.encode()) > max_bytes:
            yield Skipped(collection, f"{rel}:{lineno}", "too_large",
                          f"line {lineno} is over the {max_bytes}-byte limit (max_file_bytes)", digest)
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield Skipped(collection, f"{rel}:{lineno}", "malformed_json", f"line {lineno}: {exc.msg}", digest)
            continue
        if not isinstance(record, dict) or "_id" not in record:
            yield Skipped(collection, f"{rel}:{lineno}", "missing_id", f"line {lineno}: record has no _id", digest)
            continue
        doc_id = str(record["_id"])
        body_text = str(record.get("text") or "").strip()
        if not body_text:
            yield Skipped(collection, doc_id, "empty", f"line {lineno}: record {doc_id} has no text", digest)
            continue
        title = str(record.get("title") or "").strip() or None
        record_hash = content_hash(line.encode())
        yield Document(
            path=doc_id,
            doc_id=doc_id,
            doc_type=str(record.get("type") or "record"),
            format="jsonl",
            content_hash=record_hash,
            body=body_text,
            title=title,
            metadata={"source_file": rel, "line": lineno},
            **{**common, "size_bytes": len(line)},
        )
