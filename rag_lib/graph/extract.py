"""Build a document's knowledge-graph contribution from what the corpus states explicitly: the
`_graph` entities and triples, the `_links` to other documents, the metadata (ticker, type, date)
and known tickers named in the text. Pure: no database, no model."""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from rag_lib.corpus_files import FileRefused, read_file, walk
from rag_lib.documents import SUPPORTED_SUFFIXES, content_hash, parse_yaml
from rag_lib.models import Document, DocumentGraph, GraphEdge, GraphNode, Section

# Bump when extraction changes what a document contributes (the Dagster asset's code version).
GRAPH_VERSION = "1"
GRAPH_SECTION = "_graph"
LINKS_SECTION = "_links"
META_SECTION = "_meta"

# Predicates the extractor itself adds (the `_graph` triples keep the corpus's own names).
ABOUT = "about_ticker"
HAS_TYPE = "has_type"
DATED = "dated"
DESCRIBES = "describes"
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
        candidate = PurePosixPath(*parts[:n], link).as_posix()
        if candidate in known_paths:
            return candidate
    return None


class _Builder:
    def __init__(self, doc: Document):
        self.graph = DocumentGraph(doc.collection, doc.path)
        self.nodes: dict[str, GraphNode] = {}
        self.seen: set[tuple[str, str, str]] = set()

    def node(self, key: str, kind: str, label: str) -> str:
        old = self.nodes.get(key)
        if old is None or (old.kind == "entity" and kind != "entity"):
            self.nodes[key] = GraphNode(key, kind, label)
        return key

    def edge(self, src: str, predicate: str, dst: str, section: str, role: str | None = None) -> None:
        if src == dst or (src, predicate, dst) in self.seen:
            return
        self.seen.add((src, predicate, dst))
        self.graph.edges.append(GraphEdge(src, predicate, dst, section, role))

    def done(self) -> DocumentGraph:
        self.graph.nodes = list(self.nodes.values())
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
    own_id = normalise_name(meta["id"]) if meta.get("id") else None
    if own_id:
        b.edge(me, DESCRIBES, b.node(own_id, "entity", str(meta["id"])), META_SECTION)

    graph = body.get(GRAPH_SECTION) if isinstance(body.get(GRAPH_SECTION), dict) else {}
    kinds: dict[str, tuple[str, str]] = {}  # raw name → (key, kind)

    def entity(name: Any, kind: str | None = None) -> str:
        raw = str(name).strip()
        if raw.lower() == "this":
            return me
        if kind is None and raw in kinds:
            return kinds[raw][0]
        kind = normalise_name(kind) if kind else None
        if kind == "ticker" or (kind is None and raw.upper() == raw and raw.upper() in tickers):
            tickers.add(raw.upper())
            return b.node(ticker_key(raw), "ticker", raw.upper())
        return b.node(normalise_name(raw), kind or "entity", raw)

    for item in graph.get("entities") or []:
        if isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(v, (str, int)) for v in item):
            key = entity(item[1], str(item[0]))
            kinds[str(item[1]).strip()] = (key, str(item[0]))
            if key != me:
                b.edge(me, HAS_ENTITY, key, GRAPH_SECTION)
    for item in graph.get("relations") or []:
        if isinstance(item, (list, tuple)) and len(item) == 3 and all(isinstance(v, (str, int)) for v in item):
            subject, predicate, obj = item
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
