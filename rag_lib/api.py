"""The Python API: a `KnowledgeBase` owns settings, store and provider; module functions use a
process-wide default instance (`rag_lib.ingest(...)`, `rag_lib.search(...)`, ...)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from rag_lib import search as search_mod
from rag_lib.documents import file_of, type_spellings
from rag_lib.config import Settings, get_settings
from rag_lib.db import database_gone
from rag_lib.embedding import EmbeddingProvider, get_provider
from rag_lib.embedding.spaces import SpaceProviders, settings_naming
from rag_lib.errors import ConfigError, NotFoundError, ValidationError, close_matches, text_problem
from rag_lib.ingest import ProgressFn
from rag_lib.ingest import ingest as run_ingest
from rag_lib.log import get_logger, setup_logging
from rag_lib.models import (CorpusRoot, IngestReport, ParsedFile, SearchFilters, SearchResult, collection_problem,
                            is_number)
from rag_lib.ingest.stages import Engine
from rag_lib.ingest.state import held_files
from rag_lib.search.retrieval import SearchCaches
from rag_lib.store import Store
from rag_lib.store.roots import refuse_nested_root

log = get_logger(__name__)

@dataclasses.dataclass
class EmbedResult:
    """Seed 001's EmbedResult. `error_message` is None when embedded, "unchanged" when the file was
    already current, else why it was skipped or failed. Attributes of the ingest report (`count()`,
    `outcomes`, `embedded`, ...) read through for callers of the earlier return value."""

    doc_id: str | None = None
    file_path: str | None = None
    doc_type: str | None = None
    ticker: str | None = None
    chunk_count: int = 0
    embed_model: str | None = None
    error_message: str | None = None
    status: str = "new"  # new | changed | unchanged | skipped | failed (embedded | unchanged for texts)
    report: IngestReport | None = dataclasses.field(default=None, repr=False)

    def __getattr__(self, name: str) -> Any:
        report = self.__dict__.get("report")
        if report is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(report, name)


@dataclasses.dataclass
class RAGStats:
    """Seed 001's RAGStats."""

    document_count: int
    chunk_count: int
    tickers: list[str]
    doc_types: dict[str, int]
    last_embed: Any  # datetime of the last ingest, or None


class QueryType(str, enum.Enum):
    """Seed 004's query types (`analysis.query_type.value`); our query classes."""

    RETRIEVAL = "retrieval"
    RELATIONSHIP = "relationship"
    TREND = "trend"
    COMPARISON = "comparison"
    GLOBAL = "global"


# Seed 001's strategy for each query type (its table; `rag_classify_query`'s `suggested_strategy`).
SEED_STRATEGY = {"retrieval": "vector", "relationship": "graph", "trend": "vector", "comparison": "vector",
                 "global": "hybrid"}


@dataclasses.dataclass
class QueryAnalysis:
    """Seed 004's QueryAnalysis, from our rule-based classifier. `tickers` are those the collection
    knows (the seed took every upper-case word); `time_constraint` is the month or day the query names,
    as our search reads it ("2026-02-01/2026-02-28", a day alone for one day), "recent" for a question
    about the latest (seed 004's value), else None. `confidence`: 0.9 when a rule matched, 0.5 for the fallback class."""

    query_type: QueryType
    confidence: float
    tickers: list[str]
    time_constraint: str | None
    suggested_strategy: str
    query: str = ""
    doc_types: list[str] = dataclasses.field(default_factory=list)  # document types the query names

    def to_dict(self) -> dict[str, Any]:
        """The shape `rag_classify_query` returns."""
        return {"query": self.query, "query_type": self.query_type.value, "tickers": self.tickers,
                "doc_types": self.doc_types, "suggested_strategy": self.suggested_strategy,
                "confidence": self.confidence, "time_constraint": self.time_constraint}


@dataclasses.dataclass
class ExpandedQuery:
    """Seed 004's ExpandedQuery: `all_queries` is the original then its variations. `note` says why
    there are none when no expander is configured."""

    original: str
    variations: list[str]
    all_queries: list[str]
    note: str | None = None


NO_EXPANDER_NOTE = ("no query expander is configured, so there are no variations; set search.expansion_model "
                    "($RAG_SEARCH__EXPANSION_MODEL) and search.expansion_base_url for an OpenAI-compatible chat server")


@dataclasses.dataclass
class RAGEvalResult:
    """Seed 004's RAGEvalResult, judged by `eval.judge_model`. Without one every metric is None and
    `error_message` names the setting (as `rag_evaluate` answers). `context_recall` needs `ground_truth`
    (None without); `overall_score` is the harmonic mean of the metrics judged."""

    query: str
    context_precision: float | None
    context_recall: float | None
    faithfulness: float | None
    answer_relevancy: float | None
    overall_score: float | None
    model: str | None = None
    judge_calls: int = 0
    error_message: str | None = None


class _FirstN:
    """An expander limited to its first `n` variations (seed 004's `n_expansions`)."""

    def __init__(self, expander: Any, n: int):
        self.expander, self.n = expander, n

    def expand(self, query: str) -> list[str]:
        return list(self.expander.expand(query))[: self.n] if self.n > 0 else []


class KnowledgeBase:
    """One knowledge base: lazily opens the database and loads the model on first use."""

    def __init__(self, settings: Settings | None = None, provider: EmbeddingProvider | None = None):
        self.settings = settings or get_settings()
        setup_logging(self.settings.log_level)
        self._provider = provider

    @cached_property
    def store(self) -> Store:
        self.__dict__.pop("_closed", None)  # used again after close(): its metrics are written again
        return Store(self.settings)

    @cached_property
    def search_store(self) -> Store:
        """Where searches read: a read-only store on `search.database_url` (a replica) when set, else
        `store`. Writes, metrics included, always go to the primary."""
        url = self.settings.search.database_url
        if not url:
            return self.store
        self.store  # noqa: B018 - the primary opens (and migrates) first; the replica follows it
        return Store(self.settings, read_url=url)

    @cached_property
    def provider(self) -> EmbeddingProvider:
        return self._provider or get_provider(self.settings)

    @cached_property
    def spaces(self) -> SpaceProviders:
        return SpaceProviders(self.settings, lambda: self.provider)

    @cached_property
    def search_caches(self) -> SearchCaches:
        """Term statistics and known tickers reused between this knowledge base's searches; cleared
        after its own writes (other processes' writes show within `lexical.GENERATION_TTL`)."""
        return SearchCaches()

    def search_context(self) -> tuple[Any, EmbeddingProvider]:
        """(store, provider) pinned to the active space for one search (safe across a re-embed switch)."""
        return self.spaces.pinned(self.search_store)

    @cached_property
    def engine(self) -> Engine:
        """The ingest engine (per-file stage functions) bound to this knowledge base."""
        return Engine(self.settings, self.store, self.provider)

    def close(self) -> None:
        recorder = self.__dict__.pop("metrics", None)
        if recorder is not None:
            recorder.close()  # write queued records while the store is still open
        search_store = self.__dict__.pop("search_store", None)
        if search_store is not None and search_store is not self.__dict__.get("store"):
            search_store.close()
        if "store" in self.__dict__:
            self.store.close()
            del self.__dict__["store"]
            self.__dict__.pop("engine", None)
        self.__dict__["_closed"] = True

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _collection(self, collection: str | None) -> str:
        name = collection or self.settings.collection
        if problem := collection_problem(name):
            raise ValidationError(problem)
        return name

    # ---- writing -------------------------------------------------------------------------

    def ingest(
        self,
        paths: Iterable[str | Path],
        collection: str | None = None,
        *,
        prune: bool = False,
        force: bool = False,
        root: str | Path | None = None,
        progress: ProgressFn | None = None,
        parsed: Mapping[str, ParsedFile] | None = None,
        max_request_chunks: int | None = None,
        prune_empty: bool = False,
    ) -> IngestReport:
        """Ingest files/folders incrementally; see `rag_lib.ingest` (`parsed`: files the caller
        loaded and flattened already; `max_request_chunks`: refuse, not skip, over the chunk limits;
        `prune_empty`: prune also a folder that lists no files at all, which `prune` leaves).
        The roots ingested are registered (see `register_ingested_roots`), so the Dagster code
        location watches them."""
        paths = [Path(paths)] if isinstance(paths, (str, Path)) else [Path(p) for p in paths]  # one path is a list of one
        name = self._collection(collection)
        for missing in (p for p in paths if not os.path.lexists(p)):
            raise ValidationError(self._missing_path_message(missing, name))
        if root is None:
            root = self._registered_root_of(paths, name)
        elif Path(root).is_dir():  # a --root inside or holding a root of the collection: its files again, other paths
            refuse_nested_root(Path(root).expanduser().resolve(), name, self._roots_of(name))
        # Claimed before anything is written: the nested-root check and the registration are one step
        # under the registry's lock, so an ingest of a folder inside (or holding) a root another ingest
        # is registering meanwhile is refused, not published a second time under other paths.
        claimed = self.register_ingested_roots(paths, name, root, new_only=True)
        self.engine.embedder.begin_run("ingest")  # one accounting run per ingest (cache hits, tokens, cost)
        with self.recording_metrics():
            try:
                report = run_ingest(
                    self.engine, paths, name,
                    prune=prune, force=force, root=Path(root) if root else None, progress=progress,
                    parsed=parsed, max_request_chunks=max_request_chunks, prune_empty=prune_empty,
                )
            except BaseException:
                self._release_roots(claimed)  # a refused or failed ingest registers nothing, as before
                raise
            changed = bool(report.count("new") or report.count("changed") or report.pruned)
            if changed:
                self.search_caches.clear()
            report.profiles = self.rebuild_profiles(report.collection, changed=changed) or {}
        self.register_ingested_roots(paths, name, root)  # again (idempotent): a failed ingest beside may have released it
        return report

    def rebuild_profiles(self, collection: str | None = None, *, changed: bool = True) -> dict[str, Any] | None:
        """Rebuild the collection's ticker profiles (entity linking) from its documents and graph when
        its documents `changed` or it has none in the active space; only profiles whose text or
        documents changed are embedded again. The `ProfileReport` as a dict, or None when nothing was
        to do; with `search.entity_linking` off nothing is built (no embedding calls for an unused feature)."""
        from rag_lib.graph.profiles import build_profiles

        if not self.settings.search.entity_linking:
            return None
        collection = self._collection(collection)
        if not changed:
            space = (self.store.active_space() or {}).get("space")
            if not space or self.store.ticker_profile_hashes(collection, space):
                return None
        report = build_profiles(self.store, self.provider, collection).to_dict()
        self.search_caches.clear()  # its searches link to the rebuilt profiles at once
        return report

    def ticker_profiles(self, collection: str | None = None) -> list[dict[str, Any]]:
        """The stored ticker profiles (ticker, space, text, sources, updated_at)."""
        return self.store.ticker_profiles(self._collection(collection))

    def embed_document(self, path: str | Path | None = None, collection: str | None = None,
                       root: str | Path | None = None, force: bool = False, *,
                       file_path: str | Path | None = None) -> EmbedResult:
        """Ingest one file (its path relative to `root`, default the registered root of the collection
        holding it, else its folder); `file_path` is seed 000's name for `path`. Returns seed 001's
        EmbedResult fields (doc_id, chunk_count, embed_model, error_message, ...); the ingest report's
        attributes (`count()`, `outcomes`) read through."""
        if (path is None) == (file_path is None):
            raise ValidationError("give the file as `path` or `file_path` (one of them)")
        path = path if path is not None else file_path
        if not Path(path).is_file():
            raise ValidationError(f"{path}: not a file")
        report = self.ingest([path], collection, root=root, force=force)
        outcome = report.outcomes[0] if report.outcomes else None
        result = EmbedResult(file_path=str(path), status=outcome.status if outcome else "skipped",
                             embed_model=self.settings.embedding.model, report=report)
        if outcome is None or outcome.status not in ("new", "changed", "unchanged"):
            result.error_message = ": ".join(x for x in (outcome.reason, outcome.detail) if x) if outcome else "skipped"
            return result
        doc = self.show(outcome.path, report.collection)
        result.doc_id, result.doc_type, result.ticker = doc["doc_id"], doc["doc_type"], doc.get("ticker")
        result.chunk_count = int(doc.get("chunk_count") or 0)
        result.error_message = "unchanged" if outcome.status == "unchanged" else None
        return result

    def embed_text(self, text: str, doc_id: str | None = None, doc_type: str | None = None,
                   ticker: str | None = None, *, title: str | None = None, doc_date: Any = None,
                   collection: str | None = None, force: bool = False) -> Any:
        """Without `doc_id`: the vector of `text` in the configured space (nothing stored). With it
        (seed 000's `embed_text(text, doc_id, doc_type, ticker)`): the text is stored as a searchable
        document with that id, as `POST /api/rag/embed-text` does, and an `EmbedResult` returned."""
        check_text_to_embed(text)
        if doc_id is None:
            if any(v is not None for v in (doc_type, ticker, title, doc_date)):
                raise ValidationError("doc_type, ticker, title and doc_date describe a stored text: give doc_id too")
            with self.recording_metrics():
                return self.provider.embed([text])[0]
        from rag_lib.server import service  # the stored-text layout is the HTTP route's
        from rag_lib.server.isolation import parsing_in_process

        with parsing_in_process():
            out = service.store_text(self, text, doc_id=doc_id, doc_type=doc_type, ticker=ticker, title=title,
                                     doc_date=doc_date, collection=collection, force=force)
        return EmbedResult(doc_id=out["doc_id"], file_path=out["path"], doc_type=doc_type or "note",
                           ticker=ticker.upper() if ticker else None, chunk_count=out["chunks"],
                           embed_model=self.settings.embedding.model, status=out["status"],
                           error_message="unchanged" if out["status"] == "unchanged" else None)

    def rag_stats(self, collection: str | None = None) -> RAGStats:
        """Seed 001's `get_rag_stats()`: document and chunk counts, tickers, documents per type, last embed."""
        import datetime as dt

        st = self.status(collection)
        last = st.get("last_ingest")
        return RAGStats(document_count=int(st["documents"]), chunk_count=int(st["chunks"]), tickers=st["tickers"],
                        doc_types=dict(st["by_type"]), last_embed=dt.datetime.fromisoformat(last) if last else None)

    def delete_document(self, ref: str, collection: str | None = None) -> list[str]:
        """Delete a document by path or id; returns the deleted paths."""
        name = self._collection(collection)
        deleted = self.store.delete_document(name, ref)
        if not deleted:
            raise NotFoundError(f"no document or skipped file '{ref}' in collection '{name}'"
                                f"{self.store.not_found_hint(name, ref)}")
        self.search_caches.clear()
        self.rebuild_profiles(collection)  # a profile built from the deleted document changes or goes
        return deleted

    def set_tags(self, path: str, tags: dict[str, Any], collection: str | None = None) -> int:
        """Attach client tags to a document (seed 003's index `metadata`); they survive re-ingests and
        filter searches (`tags=`). Returns how many documents were tagged (a JSONL file: its records)."""
        return self.store.set_tags(self._collection(collection), path, tags)

    def tags_of(self, paths: Sequence[str], collection: str | None = None) -> dict[str, dict[str, Any]]:
        """Client tags by document path."""
        return self.store.tags_of(self._collection(collection), paths)

    # ---- corpus roots (the folders the Dagster code location watches) ----------------------

    def upload_folder(self) -> Path:
        """Where the HTTP API keeps uploaded text (never a watched root)."""
        return Path(self.settings.server.upload_dir or Path(self.settings.home) / "uploads").resolve()

    def roots(self) -> list[CorpusRoot]:
        """Registered roots, with `pipeline.roots` of rag.yaml merged in (registered on first read,
        so they get a stable label like any other root)."""
        for configured in self.settings.pipeline.roots:
            path = Path(configured.path).expanduser().resolve()
            try:  # the rules of `rag roots add`; a settings file is read by every process, so a warning
                refuse_nested_root(path, configured.collection, self._roots_of(configured.collection))
                self.store.register_root(path, configured.collection, source="config")
            except ValidationError as exc:
                _warn_once(f"pipeline.roots entry {path} is not registered: {exc}")
        return self.store.list_roots()

    def registered_roots(self) -> list[CorpusRoot]:
        """Registered roots as stored (nothing is registered by reading them, unlike `roots`)."""
        return self.store.list_roots()

    def add_root(self, path: str | Path, collection: str | None = None, *, source: str = "cli") -> CorpusRoot:
        """Register a folder as a corpus root of `collection` (idempotent). It must be an existing
        directory outside the upload folder. Registering ingests nothing: `rag materialize` or the
        corpus sensor does."""
        resolved = Path(path).expanduser().resolve()
        if not resolved.is_dir():
            raise ValidationError(f"{path}: not an existing directory (a corpus root is a folder)")
        if resolved.is_relative_to(self.upload_folder()):
            raise ValidationError(f"{path}: inside the HTTP API's upload folder {self.upload_folder()}, "
                                  "which is not a corpus root")
        name = self._collection(collection)
        refuse_nested_root(resolved, name, self._roots_of(name))
        return self.store.register_root(resolved, name, source=source)

    def _registered_root_of(self, paths: list[Path], collection: str) -> Path | None:
        """The registered root of `collection` every one of `paths` lies under (a file or subfolder of
        a corpus is ingested with the paths the corpus gives it, `notes/x.md`, not `x.md` a second
        time), or None. A folder holding a registered root of the collection is refused: its files
        would become documents a second time under longer paths."""
        roots = self._roots_of(collection)
        if not roots:
            return None
        spelled = [Path(os.path.abspath(p)) for p in paths]
        for folder in (p.resolve() for p in spelled if p.is_dir()):
            refuse_nested_root(folder, collection, roots, allow_inside=True)
        # realpath, not Path.resolve(): a link loop named directly is then skipped as `link_loop` when read,
        # where resolve() raised RuntimeError (Python 3.11)
        real = {p: Path(os.path.realpath(p)) for p in spelled}
        holders = {r for r in roots for p in spelled if real[p].is_relative_to(r) or p.is_relative_to(r)}
        covering = [r for r in holders if all(real[p].is_relative_to(r) or p.is_relative_to(r) for p in spelled)]
        return max(covering, key=lambda r: len(r.parts)) if covering else None

    def _missing_path_message(self, path: Path, collection: str) -> str:
        """"no such file or directory", and for a path under a root of `collection` (a folder or file
        moved or deleted) how many documents read from there are still served and what deletes them:
        an ingest of the nearest folder that exists, with --prune (it prunes only under that folder)."""
        message = f"{path}: no such file or directory"
        spelled = Path(os.path.abspath(path))
        roots = [r for r in self._roots_of(collection) if spelled.is_relative_to(r)]
        if not roots:
            return message
        root = max(roots, key=lambda r: len(r.parts))
        rel = spelled.relative_to(root).as_posix()
        served = len(self.store.document_sources_under(collection, [rel], [rel]))
        if not served:
            return message
        message += (f"; {served} document{'s' if served != 1 else ''} of collection '{collection}' read from there "
                    f"{'is' if served == 1 else 'are'} still served")
        parent = next(p for p in spelled.parents if p.is_dir())
        if parent.is_relative_to(root):
            message += f": `rag ingest {parent} --collection {collection} --prune` deletes {'it' if served == 1 else 'them'}"
        return message

    def _roots_of(self, collection: str) -> list[Path]:
        """The registered roots of `collection` (one read of the registry)."""
        return [r.path for r in self.store.list_roots() if r.collection == collection]

    def remove_root(self, path: str | Path, collection: str | None = None) -> list[CorpusRoot]:
        """Stop watching a root (one collection, or every collection it is registered for). Its
        documents stay searchable and are not deleted: the next partition sync drops the root's
        Dagster partitions only; use `rag delete` (or `rag ingest --prune`) to remove documents."""
        resolved = Path(path).expanduser().resolve()
        for configured in self.settings.pipeline.roots:
            if (Path(configured.path).expanduser().resolve() == resolved
                    and collection in (None, configured.collection)):
                raise ConfigError(f"{resolved} is in pipeline.roots of rag.yaml; remove it there first")
        removed = self.store.unregister_root(resolved, collection)
        if not removed:
            raise NotFoundError(f"{resolved} is not a registered corpus root"
                                + (f" of collection '{collection}'" if collection else ""))
        return removed

    def register_ingested_roots(self, paths: Iterable[str | Path], collection: str,
                                root: str | Path | None = None, new_only: bool = False) -> list[CorpusRoot]:
        """Register what an ingest read: `root` if given, else every directory argument (a directory
        is its own root). A single file without `root` registers nothing (its folder was not named
        as a corpus), and nothing under the upload folder is registered (uploads belong to the API).
        A folder inside or holding another root of the collection is refused (`ValidationError`).
        Returns the roots registered (`new_only`: only those not registered before)."""
        candidates = [Path(root)] if root else [Path(p) for p in paths if Path(p).is_dir()]
        uploads = self.upload_folder()
        registered: list[CorpusRoot] = []
        try:
            for candidate in candidates:
                resolved = candidate.expanduser().resolve()
                if resolved.is_dir() and not resolved.is_relative_to(uploads):
                    entry, new = self.store.claim_root(resolved, collection, source="ingest")
                    if new or not new_only:
                        registered.append(entry)
        except ValidationError:
            self._release_roots([r for r in registered if new_only])  # all or none of an ingest's roots
            raise
        return registered

    def _release_roots(self, roots: list[CorpusRoot]) -> None:
        """Unregister roots an ingest claimed and did not ingest (it failed); a failure here is logged,
        not raised over the ingest's own error."""
        for r in roots:
            try:
                self.store.unregister_root(r.path, r.collection)
            except Exception as exc:  # noqa: BLE001 - the ingest's error is the one to raise
                # with the database gone the command says so in one line, and running it again resumes
                gone = database_gone(exc)
                log.log(logging.INFO if gone else logging.WARNING, "could not unregister corpus root %s after a "
                        "failed ingest (`rag roots remove %s`): %s", r.path, r.path, exc)

    # ---- reading -------------------------------------------------------------------------

    def search(
        self,
        query: str,
        *,
        mode: str = "semantic",
        collection: str | None = None,
        doc_type: str | list[str] | None = None,
        ticker: str | list[str] | None = None,
        section: str | None = None,
        date_from: Any = None,
        date_to: Any = None,
        top_k: int | None = None,
        min_similarity: float = 0.0,
        path: str | None = None,
        group: bool = True,
        rerank: bool | None = None,
        tags: dict[str, str | list[str]] | None = None,
        expand: bool = False,
        n_expansions: int | None = None,
        section_contains: str | None = None,
        formats: str | list[str] | None = None,
        semantic_weight: float | None = None,
        lexical_weight: float | None = None,
        rerank_depth: int | None = None,
    ) -> SearchResult:
        """Search (mode semantic | lexical | hybrid); `group` returns one hit per unit (its best chunk).
        `min_similarity` drops hits whose cosine with the query (`hit.similarity`) is lower, whichever
        retriever found them. `rerank` (default: settings) reorders the head with the configured
        reranker (`result.reranked` says whether one did); hits keep the fused `score` beside
        `rerank_score`. `expand` adds the configured expander's variations (at most `n_expansions`).
        `section` matches a section exactly; `section_contains` any section path containing the text,
        case-insensitively (the seeds' `ILIKE '%risk%'`); `formats` the documents' file formats (yaml,
        markdown, jsonl). Every search is recorded in the metrics."""
        from rag_lib.metrics import search_metric
        from rag_lib.search.retrieval import SearchOptions

        filters = SearchFilters(
            collection=self._collection(collection), doc_type=type_spellings(doc_type), ticker=ticker, section=section,
            path=path, date_from=as_date(date_from, "date_from"), date_to=as_date(date_to, "date_to"), tags=tags or None,
            section_contains=section_contains, formats=_formats(formats),
        )
        store, provider = self.search_context()
        reranked = self.rerank_enabled(rerank) and self.has_reranker()
        options = None
        overrides = {k: v for k, v in (("semantic_weight", semantic_weight), ("lexical_weight", lexical_weight),
                                        ("rerank_depth", rerank_depth)) if v is not None}
        for name, value in overrides.items():
            if not is_number(value) or value < (1 if name == "rerank_depth" else 0):
                raise ValidationError(f"{name} must be a number, {'1' if name == 'rerank_depth' else '0'} or more, got {value!r}")
        if overrides:
            options = dataclasses.replace(SearchOptions.from_settings(self.settings), **overrides)
        expander = None
        if expand and self.expander is not None:
            expander = self.expander if n_expansions is None else _FirstN(self.expander, n_expansions)
        with self.recording_metrics():
            result = search_mod.search(
                store, provider, query, mode=mode, filters=filters,
                top_k=self.settings.search.top_k if top_k is None else top_k, min_similarity=min_similarity,
                group=group, reranker=self.reranker if reranked else None, expander=expander, options=options,
                caches=self.search_caches,
            )
        if self.metrics is not None:
            self.metrics.record(search_metric(result, filters.collection, reranked))
        if not result.hits:
            result.note = self.no_results_note(filters, min_similarity)
        return result

    def rerank_enabled(self, rerank: bool | None = None) -> bool:
        """Whether a search reranks: the argument, else `search.rerank` / `$RAG_RERANKING`, else
        whether a real (not no-op) reranker is configured."""
        if rerank is not None:
            return rerank
        if self.settings.search.rerank is not None:
            return self.settings.search.rerank
        return self.has_reranker()

    def has_reranker(self) -> bool:
        """Whether a real (not no-op) reranker is configured (search.rerank_model_path / rerank_base_url)."""
        from rag_lib.search.rerank import NoopReranker

        return self.reranker is not None and not isinstance(self.reranker, NoopReranker)

    @cached_property
    def metrics(self) -> Any:
        """The background metrics recorder (None when `search_metrics.enabled` is off)."""
        from rag_lib.metrics import MetricsRecorder

        cfg = self.settings.search_metrics
        if not cfg.enabled:
            return None

        def write(searches: list, embeds: list) -> None:
            # a store not opened yet is opened (a caller recording searches it timed, seed 004's
            # record_search, may touch nothing else first); a closed one is never reopened for metrics
            if not self.__dict__.get("_closed"):
                self.store.insert_metrics(searches, embeds)

        def gone() -> bool:
            store = self.__dict__.get("store")
            return store is not None and store.db.gone

        return MetricsRecorder(write, cfg.jsonl_path, gone)

    def metrics_summary(self, since: Any = None) -> dict[str, Any]:
        """p50/p95 latency per mode, zero-result rate, query-class and strategy mix, embedding failure
        rate and fallback share since `since` (a datetime, date, ISO string or "7d"/"24h"; None: all)."""
        if self.metrics is not None:
            self.metrics.flush()
        return self.store.metrics_summary(_since(since))

    def units_not_held(self, units: Iterable[str], unit: str = "section",
                       collection: str | None = None) -> dict[str, list[str]]:
        """Judged `units` no chunk of the collection carries (a search can never return them), each with
        the held unit spelled closest to it, if any: a qrels typo would otherwise score as a retrieval miss."""
        asked = sorted(set(units))
        held, near = self.store.held_units(self._collection(collection), asked, unit)
        return {u: close_matches([u], sorted(near))[:1] for u in asked if u not in held}

    def evaluate(self, queries: Any, qrels: Any, *, mode: str = "hybrid", unit: str = "section",
                 collection: str | None = None, judge: bool = False, top_k: int = 5,
                 references: Any = None) -> dict[str, Any]:
        """nDCG@10 / Recall@10,100 / MRR@10 of retrieval on a judged set (`queries` {id: text} or a
        queries.jsonl path, `qrels` {id: {unit: grade}} or a qrels .tsv path); with `judge`, also the
        RAGAS metrics (context precision, context recall, faithfulness) from the configured chat model
        on the top `top_k` chunks (context recall needs `references` {id: answer} or a `reference` field)."""
        from rag_lib import eval as ev

        query_map = ev.load_queries(queries) if isinstance(queries, (str, Path)) else dict(queries)
        judged = ev.load_qrels(qrels) if isinstance(qrels, (str, Path)) else {
            q: {u: int(g) for u, g in units.items()} for q, units in qrels.items()}
        report = ev.evaluate_kb(self, query_map, judged, mode=mode, unit=unit, collection=collection)
        out = report.summary()
        if judge:
            if references is None and isinstance(queries, (str, Path)):
                references = ev.load_references(queries)
            out["ragas"] = ev.judge_kb(self, {q: query_map[q] for q in judged if q in query_map},
                                       mode=mode, collection=collection, top_k=top_k, references=references)
        return out

    def evaluate_answer(self, query: str, contexts: Sequence[str], answer: str,
                        ground_truth: str | None = None) -> dict[str, Any]:
        """RAGAS metrics of one answer to `query` given `contexts` (seed 004's `evaluate_rag`), judged by
        `eval.judge_model`: context precision, faithfulness, answer relevancy, context recall (with
        `ground_truth`) and overall_score. Without a judge model every metric is None and
        `error_message` says what to set."""
        from rag_lib.eval import NO_JUDGE_NOTE, judge_answer

        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query is empty")
        if isinstance(contexts, str) or not isinstance(contexts, Sequence) or not contexts \
                or not all(isinstance(c, str) for c in contexts):
            raise ValidationError("contexts must be a non-empty list of strings")
        if not isinstance(answer, str) or not answer.strip():
            raise ValidationError("answer is empty")
        if ground_truth is not None and not isinstance(ground_truth, str):
            raise ValidationError("ground_truth must be a string")
        if not self.settings.eval.judge_model:
            return {"query": query, "model": None, "contexts": len(contexts), "context_precision": None,
                    "context_recall": None, "faithfulness": None, "answer_relevancy": None, "overall_score": None,
                    "judge_calls": 0, "error_message": NO_JUDGE_NOTE}
        return judge_answer(self.settings, query, list(contexts), answer, reference=ground_truth)

    def reset(self) -> list[str]:
        """Drop every table and recreate the schema (all data is lost); returns the migrations applied."""
        self.__dict__.pop("engine", None)
        applied = self.store.recreate_schema()
        self.search_caches.clear()
        return applied

    def validate_database(self) -> dict[str, Any]:
        """Orphans, chunks without a vector in the active space, stale hashes and duplicates;
        `problems` counts them all (0: healthy)."""
        space = self.store.active_space()
        checks = self.store.serving_orphans(space["space"] if space else "")
        checks["active_space"] = space["space"] if space else None
        checks["documents_with_other_settings"] = self.documents_with_other_settings()
        names = ("chunks_without_vector", "vectors_without_chunk", "chunks_with_stale_hash",
                 "chunks_without_document", "duplicate_chunks", "documents_with_other_settings")
        checks["problems"] = sum(checks[n]["count"] for n in names)
        return checks

    def documents_with_other_settings(self, collection: str | None = None) -> dict[str, Any]:
        """Documents published under settings other than today's (chunking, embedding model,
        sections mapping, loader version): `count` and the first `ids` (collection:path). Searches
        serve them as they were until `rag ingest` (or `rag reembed --all`) publishes them again."""
        from rag_lib.chunking import CHUNKER_VERSION

        return self.store.documents_under_other_fingerprint(self.settings.pipeline_fingerprint(CHUNKER_VERSION),
                                                            collection)

    def space_mismatch(self) -> str | None:
        """One line when the settings name another embedding space than the active one (a `rag
        reembed` switched it, or embedding.* was edited): ingests are refused until they match."""
        active = self.store.active_space()
        configured = self.settings.embedding.space
        if active is None or active["space"] == configured:
            return None
        # the space a rollback returns to needs no re-embedding: its vectors were kept
        back = ("`rag reembed --rollback` switches back to it" if configured == self.store.previous_space()
                else f"`rag reembed --to {configured}`")
        return (f"the settings name embedding space {configured}, not the active {active['space']}: ingests are "
                f"refused until they match ({back}, or set {settings_naming(active)})")

    def reembed_version(self, version: str, progress: ProgressFn | None = None) -> dict[str, Any]:
        """Re-ingest (re-chunk, re-embed, re-publish) the documents published under embed_version
        `version` with today's settings; their source files must still exist."""
        from rag_lib.chunking import CHUNKER_VERSION

        old = self.settings.with_embedding(embed_version=str(version))
        rows = self.store.documents_with_fingerprint(old.pipeline_fingerprint(CHUNKER_VERSION))
        return {"version": str(version), **self._reingest(rows, progress)}

    def reembed_all(self, progress: ProgressFn | None = None) -> dict[str, Any]:
        """Re-ingest every document from its source file with today's settings (after model or
        chunking changes); unchanged chunks come from the embedding cache."""
        return {"version": None, **self._reingest(self.store.document_sources(), progress)}

    def _reingest(self, rows: list[dict[str, Any]], progress: ProgressFn | None) -> dict[str, Any]:
        missing = [r["path"] for r in rows if not r["source_path"] or not Path(r["source_path"]).is_file()]
        reports = []
        by_root: dict[tuple[str, str], dict[str, None]] = {}  # ordered sets: a JSONL file holds many records
        for r in rows:
            if r["path"] in missing:
                continue
            src = str(r["source_path"])
            # the document path is relative to its corpus root: keep it (and so its unit ids) unchanged.
            # A JSONL record's path is `<file>#<_id>`: the root is found from the file's part.
            rel = file_of(r["path"])
            root = src[: -len(rel)] if src.endswith("/" + rel) else str(Path(src).parent)
            by_root.setdefault((r["collection"], root), {})[src] = None
        for (coll, root), files in by_root.items():
            reports.append(self.ingest(list(files), coll, force=True, root=root, progress=progress))
        return self._reembedded(reports, len(rows), missing)

    def reembed_paths(self, paths: Iterable[str | Path], collection: str | None = None,
                      progress: ProgressFn | None = None) -> dict[str, Any]:
        """`reembed_all` for the documents of `paths` alone (files or corpus folders, as `ingest` takes
        them), in the same shape, with `paths`."""
        paths = [str(p) for p in paths]
        report = self.ingest(paths, collection, force=True, progress=progress)
        documents = sum(report.count(s) for s in ("new", "changed", "unchanged", "failed"))
        return {"version": None, "paths": paths, **self._reembedded([report], documents, [])}

    def _reembedded(self, reports: list[IngestReport], documents: int, missing: list[str]) -> dict[str, Any]:
        """What `reembed_all`/`reembed_version`/`reembed_paths` report of their forced ingests."""
        return {
            "current_version": self.settings.embedding.embed_version, "documents": documents,
            "reembedded": sum(r.count("new") + r.count("changed") + r.count("unchanged") for r in reports),
            "failed": sum(r.count("failed") for r in reports), "missing_sources": missing,
            # as `rag reembed --to` counts them (`ReembedReport`): chunks, and the distinct texts embedded
            "chunks": sum(r.chunks for r in reports), "chunks_from_cache": sum(r.chunks_from_cache for r in reports),
            "texts_embedded": sum(r.texts_embedded for r in reports),
        }

    def init(self) -> dict[str, Any]:
        """Start the database, apply migrations, register the configured space and load the model."""
        cfg = self.settings.embedding
        self.store.ensure_space(self.provider.space, self.provider.key, cfg.dimensions, self.provider.name,
                                self.provider.chunker())
        self.provider.embed(["warm-up"])
        from rag_lib.db import redacted_url

        return {"database": redacted_url(self.store.db.url), "space": self.provider.space}

    def reindex(self) -> dict[str, Any]:
        """Rebuild the active space's HNSW index (records build time and parameters)."""
        space = self.store.active_space()
        if space is None:
            raise NotFoundError("nothing is indexed yet; run `rag ingest` first")
        return self.store.ensure_hnsw_index(space["space"], space["dimensions"], rebuild=True)

    def cache_stats(self) -> dict[str, Any]:
        return self.store.cache_stats()

    def cache_prune(self, older_than_days: float = 30.0, include_referenced: bool = False,
                    model: str | None = None) -> int:
        """Delete embedding-cache entries unused for `older_than_days` (0 or more); returns how many."""
        if not is_number(older_than_days) or older_than_days < 0:
            raise ValidationError(f"older_than_days must be a number of days, 0 or more, got {older_than_days!r}")
        return self.store.cache_prune(older_than_days, include_referenced, model)

    def reembed_status(self) -> dict[str, Any]:
        from rag_lib import reembed as rm

        return rm.status(self.store)

    def reembed_drop_old(self) -> dict[str, int]:
        from rag_lib import reembed as rm

        return rm.drop_old(self.store)

    def reembed_abort(self) -> str | None:
        from rag_lib import reembed as rm

        return rm.abort(self.store)

    def reembed_to(self, spec: str, *, switch: bool = True, skip_quality: bool = False, progress: Any = None) -> Any:
        """Fill space `MODEL[:DIMS]` beside the active one and (with `switch`) switch when the gates pass."""
        from rag_lib import reembed as rm

        with self.recording_metrics():
            return rm.reembed(self.settings, self.store, spec, switch=switch, skip_quality=skip_quality,
                              progress=progress)

    def reembed_rollback(self, progress: Any = None) -> Any:
        from rag_lib import reembed as rm

        return rm.rollback(self.settings, self.store, progress=progress)

    def recording_metrics(self) -> Any:
        """A context in which embedding calls are recorded in the metrics (`rag metrics`): ingests,
        re-embeds and the Dagster embeddings stage run inside one."""
        from rag_lib.metrics import bound

        return bound(self.metrics)

    @cached_property
    def reranker(self) -> Any:
        """The configured second-stage reranker (None: off). Assign any object with `rerank()`."""
        from rag_lib.search.rerank import reranker_from_settings

        return reranker_from_settings(self.settings)

    @cached_property
    def expander(self) -> Any:
        """The configured query expander (None: off). Assign any object with `expand()`."""
        from rag_lib.search.rerank import expander_from_settings

        return expander_from_settings(self.settings)

    def get_similar(self, ref: str, *, top_k: int = 10, collection: str | None = None) -> SearchResult:
        """Documents related to `ref` (unit id, chunk id, document path or id), one hit each."""
        from rag_lib.search.similar import get_similar

        if not 1 <= top_k <= 1000:
            raise ValidationError(f"top_k must be between 1 and 1000, got {top_k}")
        store, _ = self.search_context()
        return get_similar(store, ref, collection=self._collection(collection), top_k=top_k)

    def build_context(
        self,
        query: str,
        token_budget: int = 4000,
        *,
        mode: str | None = None,
        collection: str | None = None,
        doc_type: str | list[str] | None = None,
        ticker: str | list[str] | None = None,
        section: str | None = None,
        path: str | None = None,
        date_from: Any = None,
        date_to: Any = None,
        section_contains: str | None = None,
    ) -> Any:
        """Distinct passages for `query` within `token_budget` model tokens, with citations
        (a `ContextResult`; `.verify(ref, quote)` checks a quote against its cited chunk)."""
        from rag_lib.search.context import assemble

        if token_budget < 1:
            raise ValidationError(f"token_budget must be positive, got {token_budget}")
        mode = mode or "hybrid"
        result = self.search(query, mode=mode, collection=collection, doc_type=doc_type, ticker=ticker,
                             section=section, path=path, date_from=date_from, date_to=date_to,
                             section_contains=section_contains, top_k=max(30, min(200, token_budget // 40)), group=False)
        store, provider = self.search_context()
        positions = store.chunk_positions([h.chunk_id for h in result.hits])
        return assemble(query, mode, result.hits, provider.tokenizer().count, token_budget, positions)

    # ---- knowledge graph -----------------------------------------------------------------

    def ticker_context(self, ticker: str, *, depth: int = 2, collection: str | None = None) -> dict[str, Any]:
        """What the knowledge graph relates to a ticker: biases, strategies, catalysts, sectors, signals,
        trades, outcomes, learnings, documents and peer tickers (with what they share)."""
        from rag_lib.graph.queries import ticker_context

        return ticker_context(self.store, self._collection(collection), ticker, depth)

    def neighbors(self, node: str, *, depth: int = 1, predicates: list[str] | None = None,
                  collection: str | None = None) -> dict[str, Any]:
        """Nodes and edges within `depth` (1-3) steps of a node (ticker, document path/id, entity name)."""
        from rag_lib.graph.queries import neighbors

        return neighbors(self.store, self._collection(collection), node, depth, predicates)

    def graph_path(self, a: str, b: str, *, max_depth: int = 4, collection: str | None = None) -> dict[str, Any]:
        """A shortest chain of graph edges between two nodes (`found` False when none within `max_depth`)."""
        from rag_lib.graph.queries import graph_path

        return graph_path(self.store, self._collection(collection), a, b, max_depth)

    def hybrid_context(self, query: str, ticker: str | None = None, token_budget: int = 4000, *,
                       collection: str | None = None, analysis_type: str | None = None,
                       exclude_doc_id: str | None = None) -> Any:
        """Passages and graph facts for `query`, routed by its class, within `token_budget` tokens
        (a `rag_lib.graph.hybrid.HybridContext`; seed 004's `vector_results`, `graph_context` and
        `formatted` are attributes of it)."""
        from rag_lib.graph.hybrid import hybrid_context

        return hybrid_context(self, query, ticker, token_budget, collection, analysis_type, exclude_doc_id)

    def build_analysis_context(self, ticker: str, analysis_type: str = "stock-analysis", token_budget: int = 4000,
                               *, collection: str | None = None) -> Any:
        """Context before a new analysis of `ticker`: past and peer analyses, learnings, graph facts."""
        from rag_lib.graph.hybrid import build_analysis_context

        return build_analysis_context(self, ticker, analysis_type, token_budget, collection)

    def get_similar_analyses(self, ticker: str, analysis_type: str | None = None, top_k: int = 5, *,
                             collection: str | None = None) -> list:
        """Past analyses of `ticker` (one `SearchHit` per document, best first)."""
        from rag_lib.graph.hybrid import get_similar_analyses

        return get_similar_analyses(self, ticker, analysis_type, top_k, collection)

    def graph_export(self, fmt: str = "cypher", collection: str | None = None) -> str:
        """The collection's graph as Cypher statements (Neo4j) or GraphML (Gephi, yEd, NetworkX)."""
        from rag_lib.graph.export import export_graph

        nodes, edges = self.store.graph_export_rows(self._collection(collection))
        return export_graph(nodes, edges, fmt)

    def graph_checks(self, collection: str | None = None) -> list[Any]:
        """Graph quality checks: dangling links (warn), orphan nodes and stale edges (error), counts."""
        from rag_lib.graph.checks import graph_checks

        return graph_checks(self.store, collection)

    def graph_check(self, name: str, collection: str | None = None) -> Any:
        """One graph check by name (`rag_lib.graph.checks.GRAPH_CHECKS`): dangling_links, orphan_nodes,
        stale_edges or counts; a `QualityResult`."""
        from rag_lib.graph.checks import GRAPH_CHECKS

        if name not in GRAPH_CHECKS:
            raise ValidationError(f"unknown graph check '{name}'; use one of {', '.join(GRAPH_CHECKS)}")
        return GRAPH_CHECKS[name](self.store, collection)

    def status(self, collection: str | None = None) -> dict[str, Any]:
        counts = self.store.status_counts(collection)
        space = self.store.active_space()
        counts["active_space"] = space
        counts["configured_space"] = self.settings.embedding.space
        counts["documents_with_other_settings"] = self.documents_with_other_settings(collection)["count"]
        stats = self.store.index_stats()
        counts["index_size_mb"] = stats["index_size_mb"]
        counts["index"] = stats
        counts["tickers"] = sorted(self.store.known_tickers(collection))
        counts["held"] = held_files(self.store, collection)  # served from an older version: see held_files
        # seed 001's RAGStats names beside ours
        counts.update(document_count=counts["documents"], chunk_count=counts["chunks"],
                      doc_types=counts["by_type"], last_embed=counts["last_ingest"])
        return counts

    def chunk_total(self, collection: str | None = None) -> int:
        """Chunks in the collection a search of `collection` runs over (default: settings.collection)."""
        return self.store.chunk_total(self._collection(collection))

    def empty_collection_note(self, collection: str | None = None) -> str | None:
        """Why a search of `collection` finds nothing when it holds no documents (a name mistyped, or
        the documents ingested into another collection), naming the collections that hold some; None
        when it holds documents."""
        from rag_lib.search import notes

        facts = self.store.empty_search_facts(SearchFilters(collection=self._collection(collection)))
        return notes.empty_collection_note(facts)

    def empty_database_note(self) -> str | None:
        """When no collection of this database holds a document: which database it is and how to
        point at another (with RAG_HOME unset each working folder gets its own `.rag`, so a command run
        from another folder opened a new, empty database without a word); None otherwise. For the
        CLI only: it names a server path."""
        facts = self.store.empty_search_facts(SearchFilters(collection=self._collection(None)))
        if any(c["documents"] for c in facts["collections"]):
            return None
        from rag_lib.db import redacted_url

        where = (f"the database at {redacted_url(self.settings.database_url)} ($RAG_DATABASE_URL)"
                 if self.settings.database_url else f"the embedded database in {self.settings.pgdata}")
        return (f"{where} holds no documents at all; if your knowledge base is elsewhere, point RAG_HOME at the folder "
                "holding its pgdata (or RAG_DATABASE_URL at its server), else ingest with `rag ingest PATH`")

    def no_results_note(self, filters: SearchFilters, min_similarity: float = 0.0) -> str | None:
        """Why a search of `filters` found nothing (`SearchResult.note`): an empty collection, a filter
        matching none of its documents (with what it holds: types, close tickers, dates, paths), filters
        that match only apart, or the similarity threshold; None when nothing explains it."""
        from rag_lib.search import notes

        return notes.no_results_note(self.store.empty_search_facts(filters), filters, min_similarity)

    def list_documents(self, collection: str | None = None, limit: int = 1000, offset: int = 0) -> list[dict]:
        return self.store.list_documents(collection, limit, offset)

    def show(self, ref: str, collection: str | None = None) -> dict[str, Any]:
        return self.store.get_document(self._collection(collection), ref)

    def documents_with_id(self, doc_id: str, collection: str | None = None) -> list[str]:
        """Paths of the documents of a collection that carry `doc_id` (ids may repeat across files)."""
        return self.store.documents_with_id(self._collection(collection), doc_id)

    def document_sources(self, ref: str, collection: str | None = None) -> dict[str, str | None]:
        """path → source file of the documents a path or id names (what `delete_document` would delete)."""
        return self.store.ref_sources(self._collection(collection), ref)

    def sources_in_use(self, source_paths: Sequence[str]) -> set[str]:
        """Which of these source files still back a document."""
        return self.store.sources_in_use(source_paths)

    # ---- serving helpers (HTTP API / MCP use these instead of reaching into store/provider) ----

    def ping(self) -> bool:
        """True when the database answers a round trip."""
        return self.store.ping()

    def model_loaded(self) -> bool:
        """True when the embedding model is in memory (checked without loading it)."""
        provider = self.__dict__.get("provider")
        return provider is not None and provider.loaded

    def warm_up(self, fill_pool: bool = False) -> None:
        """Open the pool and load the model now, so the first request pays nothing. `fill_pool` (a
        server's): open all `pool_max_size` connections now and keep them open."""
        _ = self.store
        if fill_pool:
            for store in {id(s): s for s in (self.store, self.search_store)}.values():
                store.db.fill()
        if hasattr(self.provider, "load"):
            self.provider.load()
        self.provider.embed(["warm-up"])

    def embedding_info(self) -> dict[str, Any]:
        """Model, dimensions and space of the configured provider."""
        p = self.provider
        return {"model": p.model, "dimensions": int(p.dimensions), "space": p.space}

    def classify_query(self, query: str, collection: str | None = None) -> Any:
        """The rule-based `QueryPlan` of a query (kind, tickers known to the collection, doc types)."""
        from rag_lib.search.retrieval import plan_query

        if not query or not query.strip():
            raise ValidationError("query is empty")
        return plan_query(self.store, query, self._collection(collection), self.search_caches)

    def query_analysis(self, query: str, collection: str | None = None) -> QueryAnalysis:
        """Seed 004's `QueryAnalysis` of a query (what `classify_query` and `rag_classify_query` return)."""
        plan = self.classify_query(query, collection)
        dates = list(plan.dates)
        when = (dates[0] if dates[0] == dates[-1] else f"{dates[0]}/{dates[-1]}") if dates else None
        return QueryAnalysis(
            query_type=QueryType(plan.kind), confidence=0.5 if plan.kind == "retrieval" else 0.9,
            tickers=list(plan.tickers), suggested_strategy=SEED_STRATEGY.get(plan.kind, "hybrid"), query=query,
            time_constraint=when or ("recent" if plan.recent else None), doc_types=list(plan.doc_types),
        )

    def expand_query(self, query: str, n: int = 3) -> list[str]:
        """Up to `n` alternative phrasings by the configured expander ([] when none is configured)."""
        if not query or not query.strip():
            raise ValidationError("query is empty")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValidationError(f"n must be a whole number, 0 or more, got {n!r}")
        return list(self.expander.expand(query))[:n] if self.expander is not None else []

    # ---- data-quality checks over the whole store (the Dagster asset checks report them; the
    # rest of the pipeline works on `store` and `engine` directly) ----

    def _eval_search(self, text: str) -> list[Any]:
        """One query of the configured eval set, as `rag eval` runs it (100 units deep)."""
        cfg = self.settings.eval
        if cfg.unit == "section":
            return self.search(text, mode=cfg.mode, collection=cfg.collection, top_k=100).hits
        return self.search(text, mode=cfg.mode, collection=cfg.collection, top_k=300, group=False).hits

    def quality_check(self, name: str) -> Any:
        """Run one data-quality check (`rag_lib.quality`) over the whole store: embeddings,
        vector_table, chunks, skipped, failed, metadata, hnsw or retrieval. Returns a `QualityResult`."""
        from rag_lib import quality

        checks = {
            "embeddings": lambda: quality.check_embeddings(self.store, self.settings),
            "vector_table": lambda: quality.check_vector_table(self.store, self.provider.space),
            "chunks": lambda: quality.check_chunks(self.store, self.settings, self.provider.max_tokens),
            "skipped": lambda: quality.check_skipped(self.store),
            "failed": lambda: quality.check_failed(self.store),
            "metadata": lambda: quality.check_metadata(self.store),
            "hnsw": lambda: quality.check_hnsw(self.store, self.settings, self.provider.space,
                                               self.settings.embedding.dimensions),
            "retrieval": lambda: quality.check_retrieval(self.store, self.settings, self._eval_search),
        }
        if name not in checks:
            raise ValidationError(f"unknown quality check '{name}'; use one of {', '.join(checks)}")
        return checks[name]()


_WARNED: set[str] = set()


def check_text_to_embed(text: Any, name: str = "text") -> None:
    """The one check of a text to embed (`embed_text`, `EmbeddingClient`): a string with some
    non-blank character and none that PostgreSQL or the model cannot take; `name` says which text."""
    if not isinstance(text, str) or not text.strip():
        raise ValidationError(f"{name} is empty")
    if problem := text_problem(text):
        raise ValidationError(f"{name} {problem}")


def _warn_once(message: str) -> None:
    """Log a warning once per process (settings are read again and again)."""
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning("%s", message)


def as_date(value: Any, name: str) -> Any:
    """A date filter as a `datetime.date`: dates, datetimes and ISO strings ("2025-01-31"); anything
    else is left for the search's validation to name."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            raise ValidationError(f"{name} {value!r} is not a date; write it as YYYY-MM-DD") from None
    return value


# file formats as the documents table names them, with the spellings clients use (seed 003's source_type)
_FORMAT_NAMES = {"yaml": "yaml", "yml": "yaml", "markdown": "markdown", "md": "markdown", "jsonl": "jsonl"}


def _formats(value: str | list[str] | None) -> list[str] | None:
    """A format filter as the documents table's names; an unknown name is an error naming the known ones
    (seed 003's other source types, such as openapi, are never ingested: they match nothing)."""
    if value is None or value == [] or value == "":
        return None
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValidationError(f"formats must be a format name or a list of them, got {value!r}")
    out = []
    for name in names:
        key = name.strip().lower()
        if key not in _FORMAT_NAMES and key not in ("openapi", "run_report"):
            raise ValidationError(f"unknown format {name!r}; use yaml, markdown or jsonl")
        out.append(_FORMAT_NAMES.get(key, key))
    return sorted(set(out))


def _since(value: Any) -> Any:
    """None, a datetime/date, an ISO date(-time) string, or a span like `7d`, `24h`, `30m`."""
    import datetime as dt
    import re

    if value is None or isinstance(value, dt.datetime):
        return value
    if isinstance(value, dt.date):
        return dt.datetime.combine(value, dt.time(), dt.timezone.utc)
    text = str(value).strip()
    span = re.fullmatch(r"(\d+)\s*([dhm])", text)
    if span:
        unit = {"d": "days", "h": "hours", "m": "minutes"}[span.group(2)]
        return dt.datetime.now(dt.timezone.utc) - dt.timedelta(**{unit: int(span.group(1))})
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError(f"since must be a date like 2026-01-01, a date-time, or a span like 7d / 24h, "
                              f"got '{value}'") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


_default: KnowledgeBase | None = None
_default_lock = threading.Lock()


def default_kb() -> KnowledgeBase:
    global _default
    with _default_lock:
        if _default is None:
            _default = KnowledgeBase()
        return _default


def ingest(paths: Iterable[str | Path], collection: str | None = None, **kwargs: Any) -> IngestReport:
    return default_kb().ingest(paths, collection, **kwargs)


def close() -> None:
    """Close the default knowledge base (its database pool); the next call opens a new one."""
    global _default
    with _default_lock:
        base, _default = _default, None
    if base is not None:
        base.close()


def embed_document(path: str | Path | None = None, collection: str | None = None, **kwargs: Any) -> EmbedResult:
    return default_kb().embed_document(path, collection, **kwargs)


def embed_text(text: str, doc_id: str | None = None, doc_type: str | None = None, ticker: str | None = None,
               **kwargs: Any) -> Any:
    return default_kb().embed_text(text, doc_id, doc_type, ticker, **kwargs)


# ---- the seeds' search functions (000's `semantic_search`/`get_hybrid_context` and Python API, §4.1/§4.3/
# §5.5; 001; 004's rerank and expansion): thin calls on the default knowledge base.
# They keep the seeds' defaults (top_k 5, min_similarity 0.3) and return lists of hits, which carry the
# seeds' names (`r.content`, `r.similarity`, `r.file_path`, `r.section_label`). `section` matches as the
# seeds' `ILIKE '%section%'`.

def semantic_search(query: str, ticker: str | list[str] | None = None, doc_type: str | list[str] | None = None,
                    section: str | None = None, date_from: Any = None, date_to: Any = None, top_k: int = 5,
                    min_similarity: float = 0.3, **kwargs: Any) -> list:
    return default_kb().search(query, mode="semantic", ticker=ticker, doc_type=doc_type, section_contains=section,
                               date_from=date_from, date_to=date_to, top_k=top_k, min_similarity=min_similarity,
                               **kwargs).hits


def hybrid_search(query: str, ticker: str | list[str] | None = None, doc_type: str | list[str] | None = None,
                  top_k: int = 5, vector_weight: float | None = None, bm25_weight: float | None = None,
                  min_similarity: float = 0.0, **kwargs: Any) -> list:
    """Weights default to ours (search.semantic_weight / lexical_weight, tuned on the dev sets)."""
    return default_kb().search(query, mode="hybrid", ticker=ticker, doc_type=doc_type, top_k=top_k,
                               semantic_weight=vector_weight, lexical_weight=bm25_weight,
                               min_similarity=min_similarity, **kwargs).hits


def search_with_rerank(query: str, ticker: str | list[str] | None = None, doc_type: str | list[str] | None = None,
                       top_k: int = 5, retrieval_k: int = 50, use_hybrid: bool = True, **kwargs: Any) -> list:
    """Reranks when a reranker is configured (else the hybrid order, as seed 004's NoOpReranker)."""
    return default_kb().search(query, mode="hybrid" if use_hybrid else "semantic", ticker=ticker, doc_type=doc_type,
                               top_k=top_k, rerank=True, rerank_depth=retrieval_k, **kwargs).hits


def search_with_expansion(query: str, ticker: str | list[str] | None = None, top_k: int = 5, n_expansions: int = 3,
                          **kwargs: Any) -> list:
    return default_kb().search(query, mode=kwargs.pop("mode", "hybrid"), ticker=ticker, top_k=top_k, expand=True,
                               n_expansions=n_expansions, **kwargs).hits


def get_rag_stats(collection: str | None = None) -> RAGStats:
    return default_kb().rag_stats(collection)


def get_similar_analyses(ticker: str, analysis_type: str | None = None, top_k: int = 3, **kwargs: Any) -> list:
    return default_kb().get_similar_analyses(ticker, analysis_type, top_k, **kwargs)


def build_analysis_context(ticker: str, analysis_type: str = "stock-analysis", **kwargs: Any) -> Any:
    """A `HybridContext`; `str()` of it (or `.formatted`) is the prompt text."""
    return default_kb().build_analysis_context(ticker, analysis_type, **kwargs)


def get_hybrid_context(ticker: str, query: str, analysis_type: str | None = None, exclude_doc_id: str | None = None,
                       **kwargs: Any) -> Any:
    """Seed 000 §4.3 / 004's argument order (ticker first). A `HybridContext` with `vector_results`,
    `graph_context` and `formatted`; `str()` of it is the prompt text seed 000 returns."""
    return default_kb().hybrid_context(query, ticker, analysis_type=analysis_type, exclude_doc_id=exclude_doc_id,
                                       **kwargs)


def get_hybrid_context_adaptive(ticker: str, query: str, analysis_type: str | None = None,
                                exclude_doc_id: str | None = None, **kwargs: Any) -> Any:
    """Seed 001/004's adaptive hybrid context: our hybrid context is routed by the query's class
    always (relationship → graph first, comparison → per ticker, trend → time-filtered, else hybrid;
    `route` says which), so this is `get_hybrid_context` under the seed's other name."""
    return get_hybrid_context(ticker, query, analysis_type=analysis_type, exclude_doc_id=exclude_doc_id, **kwargs)


def classify_query(query: str, collection: str | None = None) -> QueryAnalysis:
    """Seed 001/004's `classify_query`: a `QueryAnalysis` (query_type, confidence, tickers,
    time_constraint, suggested_strategy) from the classifier our searches route by."""
    return default_kb().query_analysis(query, collection)


def expand_query(query: str, n: int = 3) -> ExpandedQuery:
    """Seed 004's `expand_query`: up to `n` variations by the configured expander
    (`search.expansion_model`); without one, none, and `note` says what to set."""
    kb = default_kb()
    variations = kb.expand_query(query, n)
    return ExpandedQuery(original=query, variations=variations, all_queries=[query, *variations],
                         note=None if kb.expander is not None else NO_EXPANDER_NOTE)


def evaluate_rag(query: str, contexts: Sequence[str], answer: str, ground_truth: str | None = None) -> RAGEvalResult:
    """Seed 004's `evaluate_rag`: the RAGAS metrics of one answer, judged by `eval.judge_model`
    (without one, every metric None and `error_message` naming the setting; a failing judge server
    raises `RagError`)."""
    out = default_kb().evaluate_answer(query, contexts, answer, ground_truth)
    fields = {f.name for f in dataclasses.fields(RAGEvalResult)}
    return RAGEvalResult(**{k: v for k, v in out.items() if k in fields})


def get_metrics_collector() -> Any:
    """Seed 004's `get_metrics_collector()`: `record_search(...)` and `get_summary(days=7)` over the
    default knowledge base's search metrics (`rag_lib.metrics.MetricsCollector`)."""
    from rag_lib.metrics import MetricsCollector

    return MetricsCollector(default_kb())


class EmbeddingClient:
    """Seed 000's embedding client (§2.3, §5.5 option 5): `EmbeddingClient(config).get_embedding(text)`
    is the text's vector as a list of floats. `config`: None for the configured provider (the default
    knowledge base's, the model loaded once), a `Settings`, or the seed's embedding config as a dict
    (`default_provider`, `fallback_chain`, `timeout_seconds`, `ollama:`/`openrouter:`/`openai:` blocks;
    or a whole config.yaml with `embedding:`), read as rag.yaml reads it (the rest of the settings
    from the environment and rag.yaml). A fallback only serves within the primary's vector space."""

    def __init__(self, config: Mapping[str, Any] | Settings | None = None):
        self._own = config is not None
        self.kb = default_kb() if config is None else KnowledgeBase(_client_settings(config))

    @property
    def model(self) -> str:
        return self.kb.settings.embedding.model

    @property
    def dimensions(self) -> int:
        return int(self.kb.settings.embedding.dimensions)

    def get_embedding(self, text: str) -> list[float]:
        return [float(x) for x in self.kb.embed_text(text)]

    def get_embeddings_batch(self, texts: Sequence[str]) -> list[list[float]]:
        """Vectors of several texts in one call (seed 004's `get_embeddings_batch`)."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise ValidationError("texts must be a list of strings")
        for n, text in enumerate(texts):
            check_text_to_embed(text, f"texts[{n}]")
        if not texts:
            return []
        with self.kb.recording_metrics():
            return [[float(x) for x in v] for v in self.kb.provider.embed(list(texts))]

    def close(self) -> None:
        """Release a client built from its own config (the default knowledge base stays open)."""
        if self._own:
            self.kb.close()

    def __enter__(self) -> EmbeddingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _client_settings(config: Any) -> Settings:
    """`EmbeddingClient`'s settings from its `config` (see there), read by rag.yaml's reader: a key
    naming no setting is refused with the same message."""
    from pydantic import ValidationError as PydanticValidationError

    from rag_lib.config import settings_file_values

    if isinstance(config, Settings):
        return config
    if not isinstance(config, Mapping):
        raise ValidationError(f"config must be the seed's embedding config (a dict), a Settings or None, "
                              f"got {type(config).__name__}")
    whole = bool(set(config) & (set(Settings.model_fields) | {"features"}))
    values = settings_file_values(dict(config) if whole else {"embedding": dict(config)}, "EmbeddingClient config")
    try:
        return Settings(**values)
    except PydanticValidationError as exc:
        problems = "; ".join(".".join(map(str, e.get("loc", ()))) + ": " + e.get("msg", "invalid") for e in exc.errors())
        raise ConfigError(f"EmbeddingClient config: {problems}") from exc


def search(query: str, **kwargs: Any) -> SearchResult:
    return default_kb().search(query, **kwargs)


def get_similar(ref: str, **kwargs: Any) -> SearchResult:
    return default_kb().get_similar(ref, **kwargs)


def build_context(query: str, token_budget: int = 4000, **kwargs: Any) -> Any:
    return default_kb().build_context(query, token_budget, **kwargs)


def delete_document(ref: str, collection: str | None = None) -> list[str]:
    return default_kb().delete_document(ref, collection)


def status(collection: str | None = None) -> dict[str, Any]:
    return default_kb().status(collection)
