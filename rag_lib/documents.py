"""Turn files into `Document`s or `Skipped` records: detect format and type, extract metadata,
hash content, and recognise bad input (malformed, template, empty, binary, oversize, unknown)."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rag_lib.config import ParseLimits
from rag_lib.corpus_files import IGNORED_DIRS, FileRefused, ReadLimits, check_rel_path, refused_digest, walk  # noqa: F401
from rag_lib.corpus_files import is_jsonl_name
from rag_lib.flatten import key_lines
from rag_lib.limits import LimitExceeded, check_json, check_lines, check_yaml
from rag_lib.log import get_logger
from rag_lib.errors import unstorable_char
from rag_lib.models import UNDECLARED_TYPES, Document, Skipped, is_text_or_texts

log = get_logger(__name__)

YAML_SUFFIXES = {".yaml", ".yml"}
MARKDOWN_SUFFIXES = {".md", ".markdown"}
JSONL_SUFFIXES = {".jsonl"}
SUPPORTED_SUFFIXES = YAML_SUFFIXES | MARKDOWN_SUFFIXES | JSONL_SUFFIXES

PLACEHOLDER = re.compile(r"\{[A-Z][A-Z0-9_\-]*\}")
TICKER = re.compile(r"^[A-Z][A-Z0-9.\-]{0,9}$")
FILE_DATE = re.compile(r"(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})")  # NVDA_20250115T1000: date and time of day
ISO_FILE_DATE = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?!\d)")  # a note named for its day

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


class _NotingLoader(YamlLoader):  # type: ignore[misc, valid-type]
    """The safe loader, noting the keys a mapping gives twice: YAML keeps the last value without a
    word, so the first one's text would be lost silently."""

    def __init__(self, stream: str, first_line: int = 1):
        super().__init__(stream)
        self.duplicates: list[str] = []
        self.first_line = first_line

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        lines: dict[str, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == "tag:yaml.org,2002:str":
                line = key_node.start_mark.line + self.first_line
                if key_node.value in lines:
                    self.duplicates.append(f"key '{key_node.value[:80]}' appears twice (lines {lines[key_node.value]} "
                                           f"and {line}); only the last value was kept: rename or merge them")
                lines.setdefault(key_node.value, line)
        return super().construct_mapping(node, deep)


def parse_yaml_noting(text: str, first_line: int = 1) -> tuple[Any, list[str]]:
    """`parse_yaml` and a warning for each key a mapping gives twice (lines counted from `first_line`)."""
    loader = _NotingLoader(text, first_line)
    try:
        return loader.get_single_data(), loader.duplicates
    finally:
        loader.dispose()


def normalise_type(raw: str | None) -> str | None:
    """Canonical document type for a `_meta.type` spelling (e.g. `stock_analysis`)."""
    if not raw or not isinstance(raw, str):
        return None
    key = raw.strip().lower().replace("_", "-").replace(" ", "-")
    return TYPE_ALIASES.get(key, key)


def type_spellings(doc_type: Any) -> Any:
    """A type filter in every spelling it is stored under (`research`, `research-analysis`,
    `stock_analysis`): documents stored before `research` became `research-analysis` still match. A
    value that is not a string or a list of strings is returned as it is, for the search to name."""
    if not doc_type or not is_text_or_texts(doc_type):
        return doc_type
    out: list[str] = []
    for value in [doc_type] if isinstance(doc_type, str) else doc_type:
        for name in (value, normalise_type(value)):
            if name and name not in out:
                out.append(name)
        if normalise_type(value) == "research-analysis" and "research" not in out:
            out.append("research")
    return out


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def iter_corpus_files(root: Path) -> Iterator[Path]:
    """Every non-directory entry under `root` whose path can be a key (sorted; see
    `corpus_files.walk`), or `root` itself if it is not a folder. Reading goes through `load_file`."""
    if not root.is_dir():
        yield root
        return
    for entry in walk(root):
        yield entry.path


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


def _shown(value: Any, limit: int = 40) -> str:
    text = repr(value) if not isinstance(value, str) else f"'{value}'"
    return text if len(text) <= limit else text[:limit] + "…"


def _not_a_date(field_name: str, value: Any, instead: str = "") -> str:
    return (f"{field_name} {_shown(value)} is not a date (YYYY-MM-DD); "
            + (instead or "the document has no date, so date filters and the date boost skip it"))


def _ticker(value: Any, warnings: list[str]) -> str | None:
    """`value` as a ticker symbol (upper case), or None; a value given that is not one is a warning."""
    if isinstance(value, str) and TICKER.match(value.strip().upper()):
        return value.strip().upper()
    if value is not None and value != "" and not isinstance(value, (dict, list)):
        warnings.append(f"ticker {_shown(value)} is not a ticker symbol (letters first, up to 10 of A-Z, "
                        "0-9, '.', '-'); the document has no ticker, so ticker filters and boosts skip it")
    return None


def date_in_file_name(rel_path: str) -> dt.date | None:
    """The date a file's name carries (`NVDA_20250115T1000.yaml`, `2026-02-03-daily.md`), if any: the
    document's date unless an explicit date field (`analysis_date`, `date`, ...) gives one."""
    name = Path(rel_path).name
    match = FILE_DATE.search(name) or ISO_FILE_DATE.search(name)
    return _as_date(f"{match.group(1)}-{match.group(2)}-{match.group(3)}") if match else None


GRAPH_RELATION_KEYS = ("relations", "triples")  # `triples`: what the README and most writers call them


@dataclass
class GraphStatements:
    """What a YAML document's `_graph` states: entities as (kind or None, name), relations as
    (subject, predicate, object), and a warning for each part that could not be read."""

    entities: list[tuple[str | None, str]] = field(default_factory=list)
    relations: list[tuple[str, str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _is_name(value: Any) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool) and str(value).strip() != ""


def graph_statements(graph: Any) -> GraphStatements:
    """Read `_graph`: `entities` items are `[kind, name]` or a bare name; `relations` (or `triples`)
    items are `[subject, predicate, object]`. Anything else is named in `problems`, never dropped silently."""
    out = GraphStatements()
    if graph is None:
        return out
    if not isinstance(graph, dict):
        out.problems.append(f"_graph is a {type(graph).__name__}, not a mapping of entities and relations; "
                            "the knowledge graph has none of it")
        return out
    skipped: list[str] = []
    for key, items in graph.items():
        where = f"_graph.{key}"
        if key not in ("entities", *GRAPH_RELATION_KEYS):
            out.problems.append(f"{where} is not read (a _graph holds entities and relations); "
                                "the knowledge graph has none of it")
            continue
        if items is None:
            continue
        if not isinstance(items, list):
            out.problems.append(f"{where} is a {type(items).__name__}, not a list; the knowledge graph has none of it")
            continue
        for n, item in enumerate(items):
            if key == "entities" and _is_name(item):
                out.entities.append((None, str(item)))
            elif key == "entities" and isinstance(item, list) and len(item) == 2 and all(map(_is_name, item)):
                out.entities.append((str(item[0]), str(item[1])))
            elif key != "entities" and isinstance(item, list) and len(item) == 3 and all(map(_is_name, item)):
                out.relations.append((str(item[0]), str(item[1]), str(item[2])))
            else:
                skipped.append(f"{where}[{n}] {_shown(item)}")
    if skipped:
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        out.problems.append(f"{'; '.join(skipped[:3])}{more}: not [kind, name] or a name (entities), nor "
                            "[subject, predicate, object] (relations); the knowledge graph skipped them")
    return out


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
    """Every scalar of a nested value, depth first (iterative: no recursion limit to hit)."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        else:
            yield item


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
        or UNDECLARED_TYPES["yaml"]
    )
    warnings: list[str] = []
    ticker = _ticker(body.get("ticker") or meta.get("ticker") or body.get("symbol"), warnings)
    if ticker is None:
        match = re.match(r"^([A-Z]{1,5})_\d{8}T\d{4}", Path(rel_path).name)
        if match and doc_type not in ("research-analysis", UNDECLARED_TYPES["yaml"]):
            ticker = match.group(1)
    date, unread = None, []  # unread: (field, value) given but not a date, before the one used
    for name, value in (
        ("analysis_date", body.get("analysis_date")),
        ("date", body.get("date")),
        ("trade_date", body.get("trade_date")),
        ("_meta.date", meta.get("date")),
        # a file named for a moment (`NVDA_20250115T1000.yaml`) records that event: a trade is dated by its
        # entry, not by the exit that last updated it
        ("its file name", date_in_file_name(rel_path)),
        # a document rewritten in place (a ticker profile, a strategy: `version: 5`) says what it says as
        # of its last update, so a date filter or boost for that month should find it, not its first draft's
        ("_meta.updated", meta.get("updated")),
        ("_meta.created", meta.get("created")),
    ):
        if date := _as_date(value):
            break
        if value is not None and value != "":
            unread.append((name, value))
    instead = f"the document's date is {name}'s, {date.isoformat()}" if date else ""
    warnings += [_not_a_date(n, v, instead) for n, v in unread]
    warnings += graph_statements(body.get("_graph")).problems
    title = body.get("title") or meta.get("title")
    extra = {k: str(v) for k, v in meta.items() if k in ("status", "created", "updated", "skill_version")}
    return {
        "doc_id": str(meta.get("id") or body.get("id") or Path(rel_path).stem),
        "doc_type": doc_type,
        "ticker": ticker,
        "doc_date": date,
        "version": str(meta["version"]) if meta.get("version") is not None else None,
        "title": str(title) if title else None,
        "metadata": extra,
        "warnings": warnings,
    }


_FRONT_MATTER = re.compile(r"\A---\s*\n(.*?)\n---\s*\n", re.S)


def front_matter(text: str) -> str | None:
    """The YAML between a leading `---` line and the next `---` line, if the file has one."""
    match = _FRONT_MATTER.match(text)
    return match.group(1) if match else None


def _markdown_metadata(text: str, rel_path: str, front_text: str | None = None) -> dict[str, Any]:
    front: dict[str, Any] = {}
    warnings: list[str] = []
    if front_text is not None:
        # Front matter that cannot be read costs the note its type, id, date and title: a warning, as
        # for any metadata that cannot be used; its text is still indexed in _intro.
        lost = "its type, id, date and title were not read; fix the front matter"
        try:
            loaded, duplicates = parse_yaml_noting(front_text, first_line=2)  # after the `---` line
            warnings += [f"front matter: {d}" for d in duplicates]
            front = loaded if isinstance(loaded, dict) else {}
            if loaded is not None and not isinstance(loaded, dict):
                warnings.append(f"front matter is not a mapping of fields (it is a {type(loaded).__name__}); {lost}")
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 2}, column {mark.column + 1}" if mark is not None else ""  # + the `---` line
            reason = getattr(exc, "problem", None) or type(exc).__name__
            warnings.append(f"front matter is not valid YAML{where} ({reason}); {lost}")
    title_match = re.search(r"^# (.+)$", text, re.M)
    title = front.get("title") or front.get("name") or (title_match.group(1).strip() if title_match else None)
    # a note's ticker filters and boosts it as a YAML document's does (`ticker: NVDA` in front matter)
    ticker = _ticker(front.get("ticker") or front.get("symbol"), warnings)
    given = front.get("date")
    date = _as_date(given)
    named = None if date else date_in_file_name(rel_path)
    if date is None and given not in (None, ""):
        warnings.append(_not_a_date("date", given, f"the document's date is its file name's, {named.isoformat()}"
                                    if named else ""))
    date = date or named
    return {
        "doc_id": str(front.get("id") or rel_path),
        "doc_type": normalise_type(front.get("type")) or UNDECLARED_TYPES["markdown"],
        "ticker": ticker,
        "doc_date": date,
        "version": str(front["version"]) if front.get("version") is not None else None,
        "title": str(title) if title else Path(rel_path).stem,
        "metadata": {str(k): str(v) for k, v in front.items() if isinstance(v, (str, int, float))},
        "warnings": warnings,
    }


def _decode(raw: bytes) -> str | tuple[str, str]:
    """Text of a file, or (reason, detail) if it is binary or not UTF-8."""
    if b"\x00" in raw:
        return ("binary", "binary file (NUL bytes); only UTF-8 text is ingested")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return ("not_utf8", f"not valid UTF-8 at byte {exc.start}; re-save the file as UTF-8")


def load_file(
    path: Path, root: Path, collection: str, max_bytes: int, limits: ParseLimits | None = None
) -> list[Document | Skipped]:
    """Parse one file into documents (JSONL: one per record) or a skip record with its reason.
    Never raises for the file's content: any error reading or parsing it is the file's skip."""
    return load_source(path, root, collection, max_bytes, limits)[0]


def load_source(
    path: Path, root: Path, collection: str, max_bytes: int, limits: ParseLimits | None = None
) -> tuple[list[Document | Skipped], str]:
    """`load_file` and the file's digest (what `ReadLimits.digest` gives for the same file). The
    file is read once, through `corpus_files` (inside `root`, regular, within its size limit)."""
    limits = limits or ParseLimits()
    reader = ReadLimits(max_bytes, limits.max_jsonl_bytes)
    confine = root if root.is_dir() else path.parent  # a file given as its own root: its folder confines it
    rel = path.relative_to(root).as_posix() if root.is_dir() else path.name
    raw: list[bytes] = []  # the bytes, once read (a file skipped by its name is never read)

    def read() -> bytes:
        raw.append(reader.read(path, confine))
        return raw[0]

    def digest() -> str:
        return content_hash(raw[0]) if raw else reader.digest(path, confine)

    try:
        check_rel_path(rel)
        items = _load_file(path, rel, collection, max_bytes, limits, read)
    except FileRefused as exc:
        log.info("not reading %s: %s (%s)", path, exc.reason, exc.detail)
        return [Skipped(collection, exc.path or rel, exc.reason, exc.detail, limit=exc.setting)], digest()
    except RecursionError:
        log.exception("loading %s hit the recursion limit", path)
        items = [Skipped(collection, rel, "too_deep", "nesting too deep to parse; lower its nesting depth")]
    except MemoryError:
        log.exception("loading %s ran out of memory", path)
        items = [Skipped(collection, rel, "too_large", "ran out of memory while parsing this file")]
    except OSError as exc:  # gone, a dangling link, no permission: the skip says it in one line
        log.warning("cannot read %s: %s", path, exc)
        return ([Skipped(collection, rel, "unreadable", f"cannot read the file: {exc.strerror or exc}")],
                refused_digest("unreadable", None))
    except Exception as exc:  # noqa: BLE001 (a parser's unexpected error must fail this file only)
        log.exception("loading %s failed", path)
        items = [Skipped(collection, rel, "load_error", f"cannot parse the file ({type(exc).__name__}: "
                                                        f"{str(exc)[:200]}); see the log for details")]
    items = [_storable(item) for item in items]
    try:
        return items, digest()
    except OSError as exc:  # gone or unreadable since: the next scan sees it
        log.warning("hashing %s failed: %s", path, exc)
        return items, refused_digest("unreadable", None)


def _shown_key(key: Any) -> str:
    """A key as a user can read it in a one-line error (a NUL or surrogate in it written as an escape)."""
    return str(key).encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\0")[:80]


# what a file wrote to get such a character (`unstorable_char`): an escape, as raw NULs mark it binary
_FILE_TEXT_PROBLEMS = {"nul": "holds a NUL character (an escape such as \\0 or \\u0000)",
                       "surrogate": "holds an unpaired surrogate (an escape such as \\ud800)"}


def _text_flaw(text: str) -> str | None:
    kind = unstorable_char(text)
    return _FILE_TEXT_PROBLEMS[kind] if kind else None


def _unstorable(value: Any, where: str) -> str | None:
    """'<where> holds ...' for the first string of a parsed document PostgreSQL cannot store (a NUL,
    an unpaired surrogate: YAML's "\\0" or JSON's "\\u0000" and "\\ud800" escapes make them), or None."""
    if isinstance(value, str):
        problem = _text_flaw(value)
        return f"{where} {problem}" if problem else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = f"{where}.{_shown_key(key)}" if where else _shown_key(key)
            if isinstance(key, str) and (problem := _text_flaw(key)):
                return f"key '{name}' {problem}"
            if found := _unstorable(item, name):
                return found
    elif isinstance(value, (list, tuple)):
        for n, item in enumerate(value):
            if found := _unstorable(item, f"{where}[{n}]"):
                return found
    return None


def _storable(item: Document | Skipped) -> Document | Skipped:
    """A document with a value PostgreSQL cannot store is this file's (or JSONL record's) skip: it
    used to stop the whole ingest when its stage row was written, and every file after it."""
    if isinstance(item, Skipped):
        return item
    fields = {"title": item.title, "ticker": item.ticker, "doc_type": item.doc_type, "doc_id": item.doc_id,
              "version": item.version, "metadata": item.metadata}
    problem = _unstorable(fields, "") or _unstorable(item.body, "the text" if isinstance(item.body, str) else "")
    if problem is None:
        return item
    return Skipped(item.collection, item.path, "invalid_character",
                   f"{problem}, which cannot be stored; remove it from the file", item.content_hash)


def _load_file(path: Path, rel: str, collection: str, max_bytes: int, limits: ParseLimits,
               read: Callable[[], bytes]) -> list[Document | Skipped]:
    suffix = path.suffix.lower()

    def skip(reason: str, detail: str, digest: str | None = None, limit: str | None = None) -> list[Document | Skipped]:
        return [Skipped(collection, rel, reason, detail, digest, limit)]

    if ".jsonl#" in rel.lower():
        # `<file>.jsonl#<_id>` is where JSONL records live; a file named like one could replace them.
        return skip("reserved_path", "'.jsonl#' in a path is reserved for JSONL records; rename the file")
    if suffix not in SUPPORTED_SUFFIXES:
        return skip("unknown_format", f"unsupported file type '{suffix or path.name}'; use .yaml, .md or .jsonl")
    # Confined, regular, size checked on the open descriptor before a byte is read (corpus_files).
    raw = read()
    size = len(raw)
    digest = content_hash(raw)
    if not raw.strip():
        return skip("empty", "file is empty", digest)
    text = _decode(raw)
    if isinstance(text, tuple):
        return skip(*text, digest)
    common = {"collection": collection, "source_path": str(path.resolve()), "size_bytes": size}

    if suffix in JSONL_SUFFIXES:
        return list(_load_jsonl(text, rel, digest, common, max_bytes, limits)) or skip(
            "empty", "no JSONL records (only blank lines)", digest)
    if suffix in MARKDOWN_SUFFIXES:
        front_text = front_matter(text)
        problem = check_lines(text, limits) or (
            check_yaml(front_text, limits, "front matter") if front_text is not None else None
        ) or _check_markdown_sections(text, limits)
        if problem:
            return skip(problem.reason, problem.detail, digest, problem.setting)
        meta = _markdown_metadata(text, rel, front_text)
        return [Document(path=rel, format="markdown", content_hash=digest, body=text, **meta, **common)]

    problem = check_yaml(text, limits)
    if problem:
        return skip(problem.reason, problem.detail, digest, problem.setting)
    try:
        body, duplicates = parse_yaml_noting(text)
    except yaml.YAMLError as exc:
        return skip("malformed_yaml", _yaml_error_detail(exc), digest)
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a timestamp like 2024-02-30
        return skip("malformed_yaml", f"malformed YAML: a value cannot be read ({exc})", digest)
    if body is None:
        return skip("empty", "YAML holds no data", digest)
    if not isinstance(body, dict):
        return skip("unsupported_structure", f"top level is a {type(body).__name__}, expected a mapping", digest)
    if is_template(body):
        return skip("template", "template with {PLACEHOLDER} values, not a real document", digest)
    meta = _yaml_metadata(body, rel)
    meta["warnings"] = duplicates + meta["warnings"]
    return [Document(path=rel, format="yaml", content_hash=digest, body=body, key_lines=key_lines(text),
                     **meta, **common)]


def _check_markdown_sections(text: str, limits: ParseLimits) -> LimitExceeded | None:
    """The first H2 section (or intro) longer than `max_section_chars` (one pass over the lines)."""
    if len(text) <= limits.max_section_chars:
        return None
    from rag_lib.flatten import flatten_markdown

    for section in flatten_markdown(text):
        if len(section.text) > limits.max_section_chars:
            return LimitExceeded("section_too_large", f"section '{section.name[:80]}' at line {section.line} holds "
                                 f"{len(section.text)} characters, over the limit of {limits.max_section_chars}; "
                                 "raise limits.max_section_chars (RAG_LIMITS__MAX_SECTION_CHARS) to accept it",
                                 "limits.max_section_chars")
    return None


def record_id_problem(raw: Any, limits: ParseLimits) -> LimitExceeded | None:
    """Why a JSONL `_id` cannot name a document (None if it can), as an `invalid_id` refusal: a
    string or integer of at most `max_id_chars` printable characters that is not a path escape
    (`..`, leading `/`)."""
    def invalid(detail: str, setting: str | None = None) -> LimitExceeded:
        return LimitExceeded("invalid_id", detail, setting)

    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        return invalid(f"_id must be a string or an integer, not {type(raw).__name__}")
    value = str(raw)
    if not value.strip():
        return invalid("_id is empty")
    if len(value) > limits.max_id_chars:
        return invalid(f"_id has {len(value)} characters, over the limit of {limits.max_id_chars} (limits.max_id_chars)",
                       "limits.max_id_chars")
    if value != value.strip():
        return invalid("_id starts or ends with whitespace")
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn")), None)
    if bad is not None:
        return invalid(f"_id contains the control or unassigned character U+{ord(bad):04X}")
    if value.startswith(("/", "\\")) or ".." in re.split(r"[/\\]", value) or value == ".":
        return invalid("_id looks like a path escape ('..' segment or leading '/'); use a plain identifier")
    return None


def file_of(doc_path: str) -> str:
    """The file a document path names: `<file>.jsonl#<_id>` (a JSONL record) is in `<file>.jsonl`;
    any other document is its own file."""
    cut = doc_path.lower().find(".jsonl#")
    return doc_path[: cut + len(".jsonl")] if cut >= 0 else doc_path


def record_of(path: str) -> tuple[str, str] | None:
    """(file, record) of a JSONL record's path: `<file>.jsonl:<line>` (a skipped record) gives
    (file, "line N"), `<file>.jsonl#<_id>` gives (file, the id); None for any other path."""
    file = file_of(path)
    if file != path:
        return file, path[len(file) + 1:]
    head, sep, line = path.rpartition(":")
    if sep and line.isdigit() and is_jsonl_name(head):
        return head, f"line {line}"
    return None


def _load_jsonl(
    text: str, rel: str, digest: str, common: dict[str, Any], max_bytes: int, limits: ParseLimits
) -> Iterator[Document | Skipped]:
    """BEIR-style records: `{"_id", "title", "text"}`; each is a document at `<file>#<_id>`, so a
    record can never replace a document of another file. Bad records are skipped at `<file>:<line>`."""
    collection = common["collection"]
    first_line: dict[str, int] = {}
    # Records end at "\n" only: str.splitlines() also breaks at U+0085/U+2028/U+2029, which JSON
    # strings may hold unescaped, and would cut such a record in two.
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue

        def skip(reason: str, detail: str, limit: str | None = None) -> Skipped:
            return Skipped(collection, f"{rel}:{lineno}", reason, f"line {lineno}: {detail}", digest, limit)

        if len(line.encode()) > max_bytes:
            yield skip("too_large", f"over the {max_bytes}-byte limit (max_file_bytes)", "max_file_bytes")
            continue
        problem = check_json(line, limits)
        if problem:
            yield skip(problem.reason, problem.detail, problem.setting)
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield skip("malformed_json", exc.msg)
            continue
        except (RecursionError, ValueError) as exc:  # e.g. an integer with too many digits
            yield skip("malformed_json", f"cannot be read ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        if not isinstance(record, dict) or "_id" not in record:
            yield skip("missing_id", "record has no _id")
            continue
        id_problem = record_id_problem(record["_id"], limits)
        if id_problem:
            yield skip(id_problem.reason, id_problem.detail, id_problem.setting)
            continue
        doc_id = str(record["_id"])
        if doc_id in first_line:
            yield skip("duplicate_id", f"_id {doc_id!r} is already used on line {first_line[doc_id]}; "
                                       "the first record is kept")
            continue
        first_line[doc_id] = lineno
        raw_text, raw_title = record.get("text"), record.get("title")
        if not isinstance(raw_text, (str, int, float, type(None))) or not isinstance(
                raw_title, (str, int, float, type(None))):
            yield skip("unsupported_structure", f"record {doc_id}: text and title must be strings")
            continue
        body_text = str(raw_text or "").strip()
        if not body_text:
            yield skip("empty", f"record {doc_id} has no text")
            continue
        if len(body_text) > limits.max_value_chars:
            yield skip("value_too_long", f"record {doc_id}: text of {len(body_text)} characters is over the limit of "
                                         f"{limits.max_value_chars}; raise limits.max_value_chars "
                                         "(RAG_LIMITS__MAX_VALUE_CHARS) to accept it", "limits.max_value_chars")
            continue
        title = str(raw_title or "").strip() or None
        record_hash = content_hash(line.encode())
        yield Document(
            path=f"{rel}#{doc_id}",
            doc_id=doc_id,
            doc_type=str(record.get("type") or UNDECLARED_TYPES["jsonl"]),
            format="jsonl",
            content_hash=record_hash,
            body=body_text,
            title=title,
            metadata={"source_file": rel, "line": lineno},
            **{**common, "size_bytes": len(line)},
        )
