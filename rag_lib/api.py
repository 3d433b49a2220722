"""The Python API: a `KnowledgeBase` owns settings, store and provider; module functions use a
process-wide default instance (`rag_lib.ingest(...)`, `rag_lib.search(...)`, ...)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from rag_lib import search as search_mod
from rag_lib.config import Settings, get_settings
from rag_lib.embedding import EmbeddingProvider, get_provider
from rag_lib.embedding.spaces import SpaceProviders
from rag_lib.errors import ConfigError, NotFoundError, ValidationError
from rag_lib.ingest import ProgressFn
from rag_lib.ingest import ingest as run_ingest
from rag_lib.log import setup_logging
from rag_lib.models import CorpusRoot, IngestReport, SearchFilters, SearchResult
from rag_lib.pipeline import Pipeline
from rag_lib.store import Store


class KnowledgeBase:
    """One knowledge base: lazily opens the database and loads the model on first use."""

    def __init__(self, settings: Settings | None = None, provider: EmbeddingProvider | None = None):
        self.settings = settings or get_settings()
        setup_logging(self.settings.log_level)
        self._provider = provider

    @cached_property
    def store(self) -> Store:
        return Store(self.settings)

    @cached_property
    def provider(self) -> EmbeddingProvider:
        return self._provider or get_provider(self.settings)

    @cached_property
    def spaces(self) -> SpaceProviders:
        return SpaceProviders(self.settings, lambda: self.provider)

    def search_context(self) -> tuple[Any, EmbeddingProvider]:
        """(store, provider) pinned to the active space for one search (safe across a re-embed switch)."""
        return self.spaces.pinned(self.store)

    @cached_property
    def pipeline(self) -> Pipeline:
        return Pipeline(self.settings, self.store, self.provider)

    def close(self) -> None:
        if "store" in self.__dict__:
            self.store.close()
            del self.__dict__["store"]
            self.__dict__.pop("pipeline", None)

    def __enter__(self) -> KnowledgeBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _collection(self, collection: str | None) -> str:
        return collection or self.settings.collection

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
    ) -> IngestReport:
        """Ingest files/folders incrementally; see `rag_lib.ingest`. The roots ingested are
        registered (see `register_ingested_roots`), so the Dagster code location watches them."""
        self.pipeline.begin_run("ingest")  # one accounting run per ingest (cache hits, tokens, cost)
        paths = [Path(p) for p in paths]
        report = run_ingest(
            self.pipeline, paths, self._collection(collection),
            prune=prune, force=force, root=Path(root) if root else None, progress=progress,
        )
        self.register_ingested_roots(paths, self._collection(collection), root)
        return report

    def embed_document(self, path: str | Path, collection: str | None = None, root: str | Path | None = None,
                       force: bool = False) -> IngestReport:
        """Ingest one file (its path relative to `root`, default its folder)."""
        if not Path(path).is_file():
            raise ValidationError(f"{path}: not a file")
        return self.ingest([path], collection, root=root, force=force)

    def embed_text(self, text: str) -> np.ndarray:
        """The vector of one text in the configured space."""
        if not text or not text.strip():
            raise ValidationError("text is empty")
        return self.provider.embed([text])[0]

    def delete_document(self, ref: str, collection: str | None = None) -> list[str]:
        """Delete a document by path or id; returns the deleted paths."""
        deleted = self.store.delete_document(self._collection(collection), ref)
        if not deleted:
            raise NotFoundError(f"no document or skipped file '{ref}' in collection '{self._collection(collection)}'")
        return deleted

    # ---- corpus roots (the folders the Dagster code location watches) ----------------------

    def upload_folder(self) -> Path:
        """Where the HTTP API keeps uploaded text (never a watched root)."""
        return Path(self.settings.server.upload_dir or Path(self.settings.home) / "uploads").resolve()

    def roots(self) -> list[CorpusRoot]:
        """Registered roots, with `pipeline.roots` of rag.yaml merged in (registered on first read,
        so they get a stable label like any other root)."""
        for configured in self.settings.pipeline.roots:
            path = Path(configured.path).expanduser().resolve()
            self.store.register_root(path, configured.collection, source="config")
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
        return self.store.register_root(resolved, self._collection(collection), source=source)

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
                                root: str | Path | None = None) -> list[CorpusRoot]:
        """Register what an ingest read: `root` if given, else every directory argument (a directory
        is its own root). A single file without `root` registers nothing (its folder was not named
        as a corpus), and nothing under the upload folder is registered (uploads belong to the API)."""
        candidates = [Path(root)] if root else [Path(p) for p in paths if Path(p).is_dir()]
        uploads = self.upload_folder()
        registered = []
        for candidate in candidates:
            resolved = candidate.expanduser().resolve()
            if resolved.is_dir() and not resolved.is_relative_to(uploads):
                registered.append(self.store.register_root(resolved, collection, source="ingest"))
        return registered

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
    ) -> SearchResult:
        """Search (mode semantic | lexical | hybrid); `group` returns one hit per unit (its best chunk)."""
        filters = SearchFilters(
            collection=self._collection(collection), doc_type=doc_type, ticker=ticker, section=section,
            path=path, date_from=date_from, date_to=date_to,
        )
        store, provider = self.search_context()
        return search_mod.search(
            store, provider, query, mode=mode, filters=filters,
            top_k=self.settings.search.top_k if top_k is None else top_k, min_similarity=min_similarity,
            group=group, reranker=self.reranker, expander=self.expander,
        )

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
    ) -> Any:
        """Distinct passages for `query` within `token_budget` model tokens, with citations
        (a `ContextResult`; `.verify(ref, quote)` checks a quote against its cited chunk)."""
        from rag_lib.search.context import assemble

        if token_budget < 1:
            raise ValidationError(f"token_budget must be positive, got {token_budget}")
        mode = mode or "hybrid"
        result = self.search(query, mode=mode, collection=collection, doc_type=doc_type, ticker=ticker,
                             section=section, path=path, date_from=date_from, date_to=date_to,
                             top_k=max(30, min(200, token_budget // 40)), group=False)
        store, provider = self.search_context()
        positions = store.chunk_positions([h.chunk_id for h in result.hits])
        return assemble(query, mode, result.hits, provider.tokenizer().count, token_budget, positions)

    def status(self, collection: str | None = None) -> dict[str, Any]:
        counts = self.store.status_counts(collection)
        space = self.store.active_space()
        counts["active_space"] = space
        counts["configured_space"] = f"{self.settings.embedding.model}:{self.settings.embedding.dimensions}"
        return counts

    def list_documents(self, collection: str | None = None, limit: int = 1000, offset: int = 0) -> list[dict]:
        return self.store.list_documents(collection, limit, offset)

    def show(self, ref: str, collection: str | None = None) -> dict[str, Any]:
        return self.store.get_document(self._collection(collection), ref)


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


def embed_document(path: str | Path, collection: str | None = None, **kwargs: Any) -> IngestReport:
    return default_kb().embed_document(path, collection, **kwargs)


def embed_text(text: str) -> np.ndarray:
    return default_kb().embed_text(text)


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
