"""The only module that writes SQL. `Store` groups the SQL by subject (documents, vectors, status)."""

from __future__ import annotations

from rag_lib.config import Settings
from rag_lib.store.checks import CheckStore
from rag_lib.store.connection import Connections, apply_migrations, migration_files
from rag_lib.store.documents import DocumentStore
from rag_lib.store.evalruns import EvalRunStore
from rag_lib.store.graph import GraphStore
from rag_lib.store.lexical import LexicalStore
from rag_lib.store.metrics import MetricsStore
from rag_lib.store.profiles import ProfileStore
from rag_lib.store.roots import RootStore
from rag_lib.store.schema import SchemaStore
from rag_lib.store.similar import SimilarStore
from rag_lib.store.stages import StageStore
from rag_lib.store.spaces import SpaceStore
from rag_lib.store.status import StatusStore
from rag_lib.store.usage import UsageStore
from rag_lib.store.vectors import HeldVectorsCache, VectorStore


class Store(DocumentStore, VectorStore, StatusStore, SpaceStore, UsageStore, StageStore, CheckStore,
            LexicalStore, SimilarStore, RootStore, GraphStore, ProfileStore, MetricsStore, EvalRunStore, SchemaStore):
    """Database access for one process: open once, share, `close()` at the end."""

    def __init__(self, settings: Settings, read_url: str | None = None):
        """`read_url`: a read-only store on that server (a replica for searches), never migrated."""
        self.settings = settings
        self.db = Connections(settings, read_url=read_url)
        # The store's own short-lived answers (whether a collection filter is ranked exactly). An
        # attribute of the store, so the per-search pinned views (embedding/spaces.py) share it.
        self.scan_decisions: dict = {}
        self.held_vectors = HeldVectorsCache()  # small collections' vectors, for exact rankings in memory

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Store", "apply_migrations", "migration_files"]
