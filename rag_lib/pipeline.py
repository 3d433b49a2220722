"""The pipeline stages, each callable alone (the Dagster assets call them one by one):
load → flatten → chunk → embed (through the cache) → publish."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag_lib.chunking import CHUNKER_VERSION, Chunker
from rag_lib.config import Settings
from rag_lib.documents import load_file
from rag_lib.embedding import EmbeddingProvider
from rag_lib.errors import DimensionMismatchError, EmbeddingError
from rag_lib.flatten import flatten, load_mapping
from rag_lib.log import get_logger
from rag_lib.models import Chunk, Document, Section, Skipped
from rag_lib.store import Store

log = get_logger(__name__)


@dataclass
class Prepared:
    """A document with its sections and chunks, not yet embedded."""

    doc: Document
    sections: list[Section]
    chunks: list[Chunk]


@dataclass
class EmbedResult:
    vectors: np.ndarray
    cache_hits: int = 0
    embedded: int = 0
    problems: list[str] = field(default_factory=list)
    usage: list = field(default_factory=list)  # rag_lib.embedding.usage.Usage per provider used


def check_vectors(vectors: np.ndarray, dimensions: int) -> list[str]:
    """Problems that must keep vectors out of the serving table (wrong size, NaN/inf, zero)."""
    problems = []
    if vectors.ndim != 2 or (len(vectors) and vectors.shape[1] != dimensions):
        problems.append(f"vectors have shape {vectors.shape}, expected (n, {dimensions})")
        return problems
    if not np.isfinite(vectors).all():
        problems.append(f"{int((~np.isfinite(vectors)).any(axis=1).sum())} vectors contain NaN or infinity")
    norms = np.linalg.norm(vectors, axis=1) if len(vectors) else np.zeros(0)
    if (norms == 0).any():
        problems.append(f"{int((norms == 0).sum())} vectors are all zeros")
    return problems


class Pipeline:
    """Stage functions bound to one settings object, store and provider."""

    def __init__(self, settings: Settings, store: Store, provider: EmbeddingProvider):
        self.settings = settings
        self.store = store
        self.provider = provider
        self.mapping = load_mapping(Path(settings.sections_file))
        self.chunker = Chunker(provider.tokenizer(), settings.chunking)
        self.fingerprint = settings.pipeline_fingerprint(CHUNKER_VERSION)
        self.begin_run()

    def begin_run(self, kind: str = "ingest", run_id: str | None = None) -> str:
        """Start a new accounting run (cache hits, tokens, cost go to rag_embedding_runs/usage);
        Dagster passes its run id so asset metadata can show `store.run_usage(run_id)`."""
        self.run_kind = kind
        self.run_id = run_id or f"{kind}-{uuid.uuid4().hex[:12]}"
        return self.run_id

    def load(self, path: Path, root: Path, collection: str) -> list[Document | Skipped]:
        return load_file(path, root, collection, self.settings.max_file_bytes, self.settings.limits)

    def sections(self, doc: Document) -> list[Section]:
        raw = Path(doc.source_path).read_text(encoding="utf-8-sig") if doc.format == "yaml" and doc.source_path else None
        return flatten(doc, self.mapping, raw)

    def prepare(self, doc: Document) -> Prepared:
        sections = self.sections(doc)
        return Prepared(doc, sections, self.chunker.chunk(doc, sections))

    def embed(self, chunks: list[Chunk]) -> EmbedResult:
        """Vectors for chunks, from the cache where possible; new vectors are validated then cached."""
        cfg = self.settings.embedding
        if not chunks:
            return EmbedResult(np.zeros((0, cfg.dimensions), dtype=np.float32))
        texts = {c.content_hash: c.embed_text for c in chunks}
        cached = self.store.cache_get(list(texts), cfg.cache_model(cfg.model), cfg.dimensions)
        missing = [h for h in texts if h not in cached]
        usage: list = []
        if missing:
            try:
                fresh, usage = self.provider.embed_counted([texts[h] for h in missing])
            except EmbeddingError as exc:  # account for the requests the failure cost, then fail
                self._record(len(texts) - len(missing), len(missing), getattr(exc, "usage", []))
                raise
            problems = check_vectors(fresh, cfg.dimensions)
            if problems:
                error = DimensionMismatchError if "shape" in problems[0] else EmbeddingError
                raise error(f"provider {self.provider.name} returned bad vectors: {'; '.join(problems)}")
            new = dict(zip(missing, fresh))
            self.store.cache_put(new, cfg.cache_model(cfg.model), cfg.dimensions)
            cached.update(new)
        vectors = np.stack([cached[c.content_hash] for c in chunks]).astype(np.float32)
        hits = sum(1 for c in chunks if c.content_hash not in missing)
        self._record(len(texts) - len(missing), len(missing), usage)
        return EmbedResult(vectors, cache_hits=hits, embedded=len(missing), usage=usage)

    def _record(self, hits: int, misses: int, usage: list) -> None:
        self.store.record_embedding(self.run_id, self.run_kind, self.provider.space, hits, misses, usage,
                                    self.settings.embedding.prices)

    def publish(self, prepared: Prepared, vectors: np.ndarray) -> None:
        cfg = self.settings.embedding
        problems = check_vectors(vectors, cfg.dimensions) if len(vectors) else []
        if problems:
            raise DimensionMismatchError(f"{prepared.doc.path}: {'; '.join(problems)}; nothing was written")
        active = self.store.active_space()
        if active is not None and active["space"] != self.provider.space:  # a re-embed switched spaces
            raise DimensionMismatchError(
                f"{prepared.doc.path}: this process embeds into {self.provider.space} but the active space is now "
                f"{active['space']}; set embedding.model/dimensions to match and restart (nothing was written)"
            )
        self.store.publish_document(
            prepared.doc, prepared.sections, prepared.chunks, vectors, self.provider.space,
            cfg.dimensions, self.fingerprint,
        )

    def is_current(self, doc: Document, states: dict[str, tuple[str, str]]) -> bool:
        """True when the stored version has the same content and was made with the same settings."""
        return states.get(doc.path) == (doc.content_hash, self.fingerprint)
