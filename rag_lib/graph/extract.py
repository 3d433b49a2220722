"""Build a document's knowledge-graph contribution from what the corpus states explicitly: the
`_graph` entities and triples, the `_links` to other documents, the metadata (ticker, type, date)
and known tickers named in the text. Pure: no database, no model."""

from __future__ import annotations

import dataclasses
import posixpath
import re
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from rag_lib.corpus_files import FileRefused, read_file, walk
from rag_lib.documents import SUPPORTED_SUFFIXES, content_hash, graph_statements, parse_yaml
from rag_lib.models import Document, DocumentGraph, GraphAlias, GraphEdge, GraphNode, Section

# Bump when extraction changes what a document contributes (the Dagster asset's code version).
# 2: a document's own id is an alias of its node (no `describes` entity), a ticker profile's id and
#    company name are aliases of the ticker, every spelling is kept as an alias.
# 3: `_links` with `../` resolve (they were dangling).
GRAPH_VERSION = "3"
GRAPH_SECTION = "_graph"
LINKS_SECTION = "_links"
META_SECTION = "_meta"

# Predicates the extractor itself adds (the `_graph` triples keep the corpus's own names).
ABOUT = "about_ticker"
HAS_TYPE = "has_type"
DATED = "dated"
HAS_ENTITY = "has_entity"
LINKS_TO = "links_to"
MENTIONS = "mentions"
STRUCTURAL = (HAS_TYPE, DATED)  # hub edges: every document has them; walks skip them by default

_TICKER_WORD = re.compile(r"(?<![A-Za-z0-9$])\$?([A-Z]{1,5})(?![A-Za-z0-9])")
_FILE_TICKER = re.compile(r"^([A-Z]{1,5})_\d{8}T\d{4}")
_SPACES = re.compile(r"[\s_]+")


def normalise_name(name: Any) -> str:
    """One spelling per entity: `loss_aversion`, `Loss Aversion` and `loss-aversion` are one node."""
    return _SPACES.sub("-", str(name).strip().lower()).strip("-")


_CORPORATE = re.compile(r"[\s,]+(inc|incorporated|corp|corporation|co|company|ltd|limited|plc|holdings?|group|"
                        r"sa|ag|nv|se|llc|lp)\.?$", re.I)


def alias_key(name: Any) -> str:
    """What a spelling is looked up by: `$NVDA`, `nvda` and `NVDA` are one alias; see normalise_name."""
    return normalise_name(str(name).strip().lstrip("$"))


def company_names(name: str) -> list[str]:
    """A company's name and its short forms: `NVIDIA Corporation` → also `NVIDIA`; `The Walt Disney
    Company` → also `Walt Disney` (legal suffixes and a leading `The` are not how people name it)."""
    out = [name.strip()]
    short = re.sub(r"^the\s+", "", out[0], flags=re.I)
    while (shorter := _CORPORATE.sub("", short).strip(" ,.")) != short and shorter:
        short = shorter
    if short and short != out[0]:
        out.append(short)
    return out


def _company_name(doc: Document, body: dict[str, Any], meta: dict[str, Any]) -> str | None:
    """The company name a document about one ticker states (`company.name`, `company_name`, `_meta.name`)."""
    company = body.get("company")
    for value in ((company.get("name") if isinstance(company, dict) else company), body.get("company_name"),
                  meta.get("company_name"), meta.get("name") if doc.ticker else None):
        if isinstance(value, str) and value.strip() and len(value) <= 100:
            return value.strip()
    return None


def ticker_key(ticker: str) -> str:
    return f"ticker:{ticker.strip().upper()}"


def doc_key(path: str) -> str:
    return f"doc:{path}"


@dataclass(frozen=True)
class CorpusIndex:
    """What extraction needs to know about the whole corpus: its file paths and known tickers."""

    paths: frozenset[str]
    tickers: frozenset[str]


def scan_corpus(root: Path) -> CorpusIndex:
    """Paths (relative, POSIX) of the ingestible files under `root` and the tickers their names carry."""
    paths, tickers = set(), set()
    if root.is_dir():
        for entry in walk(root):  # names only: nothing is read
            if entry.path.suffix.lower() in SUPPORTED_SUFFIXES:
                paths.add(entry.rel)
                if m := _FILE_TICKER.match(entry.path.name):
                    tickers.add(m.group(1))
    return CorpusIndex(frozenset(paths), frozenset(tickers))


_cache: dict[Path, tuple[float, CorpusIndex]] = {}
_cache_lock = threading.Lock()
CACHE_SECONDS = 30.0  # a long-running ingest sees new files within this delay; scanning per file would be O(n^2)


def corpus_index(root: Path) -> CorpusIndex:
    """`scan_corpus(root)`, cached for a few seconds per root."""
    now = time.monotonic()
    with _cache_lock:
        hit = _cache.get(root)
        if hit and now - hit[0] < CACHE_SECONDS:
            return hit[1]
    index = scan_corpus(root)
    with _cache_lock:
        _cache[root] = (now, index)
    return index


def forget_corpus_indexes() -> None:
    """Drop the cached corpus indexes (a new ingest run scans its roots afresh)."""
    with _cache_lock:
        _cache.clear()


def corpus_root(doc: Document) -> Path | None:
    """The corpus root a document was loaded from (its source path minus its relative path)."""
    if not doc.source_path or doc.format == "jsonl":
        return None
    source = Path(doc.source_path)
    depth = len(PurePosixPath(doc.path).parts)
    if depth == 0 or len(source.parts) < depth:
        return None
    return source.parents[depth - 1]


def resolve_link(link: str, from_path: str, known_paths: Collection[str]) -> str | None:
    """The corpus path a `_links` value points to: tried against the root, then against each folder
    above the linking document (links are often written relative to a `knowledge/` folder)."""
    link = link.strip()
    if link.startswith("./"):
        link = link[2:]
    if not link:
        return None
    if link in known_paths:
        return link
    parts = PurePosixPath(from_path).parts[:-1]
    for n in range(len(parts), 0, -1):
        # normpath: `../notes/x.md` from `knowledge/learnings/` is `knowledge/notes/x.md`, then `notes/x.md`
        candidate = posixpath.normpath(PurePosixPath(*parts[:n], link).as_posix())
        if candidate in known_paths:
            return candidate
    return None


class _Builder:
    def __init__(self, doc: Document):
        self.graph = DocumentGraph(doc.collection, doc.path)
        self.nodes: dict[str, GraphNode] = {}
        self.seen: set[tuple[str, str, str]] = set()
        self.aliases: dict[tuple[str, str], str] = {}  # (alias, key) → the first spelling

    def node(self, key: str, kind: str, label: str) -> str:
        old = self.nodes.get(key)
        if old is None or (old.kind == "entity" and kind != "entity"):
            self.nodes[key] = GraphNode(key, kind, label)
        if kind not in ("doc", "date", "doc_type"):
            self.alias(key, label)
        return key

    def alias(self, key: str, spelling: Any) -> str:
        spelling = str(spelling).strip()
        if spelling and (alias := alias_key(spelling)):
            self.aliases.setdefault((alias, key), spelling)
        return key

    def edge(self, src: str, predicate: str, dst: str, section: str, role: str | None = None) -> None:
        if src == dst or (src, predicate, dst) in self.seen:
            return
        self.seen.add((src, predicate, dst))
        self.graph.edges.append(GraphEdge(src, predicate, dst, section, role))

    def done(self) -> DocumentGraph:
        self.graph.nodes = list(self.nodes.values())
        used = {k for e in self.graph.edges for k in (e.src, e.dst)}
        self.graph.aliases = [GraphAlias(a, k, s) for (a, k), s in self.aliases.items() if k in used]
        return self.graph


def _as_links(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, str):
                yield item


def extract_graph(
    doc: Document,
    sections: Iterable[Section] = (),
    known_paths: Collection[str] = frozenset(),
    known_tickers: Collection[str] = frozenset(),
) -> DocumentGraph:
    """The nodes and edges `doc` contributes (see module docstring); `_links` not in `known_paths`
    stay as edges to their raw path and are listed in `dangling`."""
    b = _Builder(doc)
    me = b.node(doc_key(doc.path), "doc", doc.title or doc.doc_id or doc.path)
    body = doc.body if isinstance(doc.body, dict) else {}
    tickers = {t.upper() for t in known_tickers}
    if doc.ticker:
        tickers.add(doc.ticker)
        b.edge(me, ABOUT, b.node(ticker_key(doc.ticker), "ticker", doc.ticker), META_SECTION)
    if doc.doc_type:
        b.edge(me, HAS_TYPE, b.node(f"doc_type:{doc.doc_type}", "doc_type", doc.doc_type), META_SECTION)
    if doc.doc_date:
        day = doc.doc_date.isoformat()
        b.edge(me, DATED, b.node(f"date:{day}", "date", day), META_SECTION)
    meta = body.get("_meta") if isinstance(body.get("_meta"), dict) else {}
    # One node per real thing: a ticker profile's id is its ticker, any other document's id names the
    # document itself (a trade's TRD-2025-001 is its journal), a company name names its ticker.
    own_ids: set[str] = set()
    names: dict[str, str] = {}  # alias → ticker key, from this document's own statements
    for value in (meta.get("id"), doc.doc_id if meta.get("id") else None):
        if isinstance(value, (str, int)) and str(value).strip():
            if doc.ticker and str(value).strip().upper() == doc.ticker:
                names[alias_key(value)] = b.alias(ticker_key(doc.ticker), value)
            else:
                own_ids.add(alias_key(value))
                b.alias(me, value)
    if doc.ticker and (company := _company_name(doc, body, meta)):
        for name in company_names(company):
            names[alias_key(name)] = b.alias(ticker_key(doc.ticker), name)

    graph = graph_statements(body.get(GRAPH_SECTION))  # what cannot be read is the document's warning
    kinds: dict[str, tuple[str, str]] = {}  # raw name → (key, kind)

    def entity(name: Any, kind: str | None = None) -> str:
        raw = str(name).strip()
        if raw.lower() == "this":
            return me
        if alias_key(raw) in own_ids:
            return b.alias(me, raw)
        if kind is None and raw in kinds:
            return kinds[raw][0]
        kind = normalise_name(kind) if kind else None
        if kind == "ticker" or (kind is None and raw.upper() == raw and raw.upper() in tickers):
            tickers.add(raw.upper())
            return b.alias(b.node(ticker_key(raw), "ticker", raw.upper()), raw)
        if alias_key(raw) in names:
            return b.alias(names[alias_key(raw)], raw)
        return b.node(normalise_name(raw), kind or "entity", raw)

    for kind, name in graph.entities:
        key = entity(name, kind)
        if kind is not None:
            kinds[name.strip()] = (key, kind)
        if key != me:
            b.edge(me, HAS_ENTITY, key, GRAPH_SECTION)
    for subject, predicate, obj in graph.relations:
        b.edge(entity(subject), normalise_name(predicate).replace("-", "_"), entity(obj), GRAPH_SECTION)

    links = body.get(LINKS_SECTION) if isinstance(body.get(LINKS_SECTION), dict) else {}
    for role, value in links.items():
        for link in _as_links(value):
            link = link.strip()
            if not link:
                continue
            if "/" not in link and "." not in link and link.upper() in tickers | {link.upper()} and \
                    re.fullmatch(r"[A-Za-z]{1,5}", link):
                b.edge(me, LINKS_TO, b.node(ticker_key(link), "ticker", link.upper()), LINKS_SECTION, str(role))
                continue
            target = resolve_link(link, doc.path, known_paths)
            if target is None:
                b.graph.dangling.append(link)
                target = link
            b.edge(me, LINKS_TO, b.node(doc_key(target), "doc", target), LINKS_SECTION, str(role))

    for section in sections:
        if section.name.startswith("_graph") or section.name.startswith("_links"):
            continue
        for symbol in _TICKER_WORD.findall(section.text):
            if symbol in tickers and symbol != doc.ticker:
                b.edge(me, MENTIONS, b.node(ticker_key(symbol), "ticker", symbol), section.name)
    return b.done()


def _with_body(doc: Document) -> Document:
    """Stage runs carry documents without their parsed body: read it again from the source file,
    only if the file still has the content that was chunked (else the graph keeps metadata facts)."""
    if doc.body is not None or doc.format != "yaml" or not doc.source_path:
        return doc
    try:
        # the size the document had: a file that grew, or became a pipe or a link, is not the one chunked
        raw = read_file(Path(doc.source_path), None, doc.size_bytes)
        if content_hash(raw) != doc.content_hash:
            return doc
        body = parse_yaml(raw.decode("utf-8-sig"))
    except (OSError, FileRefused, UnicodeDecodeError, yaml.YAMLError):
        return doc  # the file changed or went: the graph keeps the metadata facts
    return dataclasses.replace(doc, body=body) if isinstance(body, dict) else doc


def document_graph(doc: Document, sections: Iterable[Section] = ()) -> DocumentGraph:
    """`extract_graph` with the corpus facts read from the document's own corpus root."""
    doc = _with_body(doc)
    root = corpus_root(doc)
    index = corpus_index(root) if root else CorpusIndex(frozenset(), frozenset())
    return extract_graph(doc, sections, index.paths, index.tickers)
