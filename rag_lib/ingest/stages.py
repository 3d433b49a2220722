"""The ingest engine: one set of per-file stage functions, load → flatten → chunk → embed (through
the cache, many files per provider call) → publish. `rag ingest` calls them in memory; the Dagster
assets call the same functions and store each stage's output between assets."""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag_lib.chunking import CHUNKER_VERSION, Chunker
from rag_lib.config import Settings
from rag_lib.corpus_files import ReadLimits, read_text
from rag_lib.documents import load_source
from rag_lib.embedding import EmbeddingProvider
from rag_lib.errors import DimensionMismatchError, EmbeddingError, TooManyChunksError
from rag_lib.flatten import flatten, load_mapping
from rag_lib.graph.extract import document_graph
from rag_lib.log import get_logger
from rag_lib.models import Chunk, Document, Section, Skipped, SourceFile
from rag_lib.store import Store
from rag_lib.versions import fingerprint, stage_versions

log = get_logger(__name__)

EMBED_BATCH_CHUNKS = 512  # chunks per provider call group: large batches keep the encoder busy


@dataclass
class Loaded:
    """One file read: its documents (JSONL: one per record), skip records and the file's hash."""

    source: SourceFile
    documents: list[Document]
    skips: list[Skipped]
    file_hash: str


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


@dataclass
class FileVectors:
    """Vectors of many files' chunks, embedded together: per-file vectors or the file's error."""

    vectors: dict[Hashable, np.ndarray] = field(default_factory=dict)
    errors: dict[Hashable, Exception] = field(default_factory=dict)
    cache_hits: int = 0
    embedded: int = 0


def file_hash(path: Path, root: Path, settings: Settings) -> str:
    """SHA-256 of a file's bytes, read in blocks within its size limit (what decides whether a
    file changed); equal to what `Engine.load` records. See `rag_lib.corpus_files.file_digest`."""
    return ReadLimits.of(settings).digest(path, root)


def error_text(exc: BaseException) -> str:
    """One line naming the exception type and message (RecursionError etc. have no RagError code)."""
    return f"{type(exc).__name__}: {exc}"[:2000]


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


class Engine:
    """The stage functions bound to one settings object, store and provider."""

    def __init__(self, settings: Settings, store: Store, provider: EmbeddingProvider):
        self.settings = settings
        self.store = store
        self.provider = provider
        self.mapping = load_mapping(Path(settings.sections_file))
        self.chunker = Chunker(provider.tokenizer(), settings.chunking)
        self.versions = stage_versions(settings, CHUNKER_VERSION)
        self.fingerprint = fingerprint(self.versions)
        self.begin_run()

    def begin_run(self, kind: str = "ingest") -> str:
        """Start a new accounting run (cache hits, tokens, cost go to rag_embedding_runs/usage) under
        a fresh id, read back with `store.run_usage(run_id)`."""
        self.run_kind = kind
        self.run_id = f"{kind}-{uuid.uuid4().hex[:12]}"
        return self.run_id

    # ---- per-file stages ---------------------------------------------------------------

    def load(self, source: SourceFile) -> Loaded:
        """Read and parse one file: documents, skip records (bad input, with a reason) and its hash."""
        # One bounded read: the size is checked before any byte is read, the digest comes from the same bytes.
        items, digest = load_source(source.path, source.root, source.collection, self.settings.max_file_bytes,
                                    self.settings.limits)
        log.debug("document parsed", extra={"where": "in-process", "rel": source.rel})
        return Loaded(source, [i for i in items if isinstance(i, Document)],
                      [i for i in items if isinstance(i, Skipped)], digest)

    def flatten(self, doc: Document) -> list[Section]:
        """A document's sections (YAML: one per top-level key; markdown: one per H2)."""
        raw = None
        if doc.format == "yaml" and doc.source_path:  # for line numbers; load confined and resolved this path
            raw = read_text(Path(doc.source_path), None, self.settings.max_file_bytes)
        return flatten(doc, self.mapping, raw)

    def chunk(self, doc: Document, sections: list[Section]) -> list[Chunk]:
        """Token-aware chunks of a document's sections; TooManyChunksError over
        `limits.max_chunks_per_document` (each chunk costs a model call), checked before chunking too
        when the non-empty sections alone are over it (every one makes at least one chunk)."""
        limit = self.settings.limits.max_chunks_per_document
        at_least = sum(1 for s in sections if not s.is_empty)
        if at_least > limit:
            raise self._too_many(doc, f"at least {at_least}", limit)
        chunks = self.chunker.chunk(doc, sections)
        if len(chunks) > limit:
            raise self._too_many(doc, str(len(chunks)), limit)
        return chunks

    @staticmethod
    def _too_many(doc: Document, count: str, limit: int) -> TooManyChunksError:
        return TooManyChunksError(doc.path, f"document has {count} chunks, over limits.max_chunks_per_document={limit} "
                                  "(RAG_LIMITS__MAX_CHUNKS_PER_DOCUMENT); split it or raise the setting")

    def prepare(self, doc: Document, sections: list[Section] | None = None) -> Prepared:
        """Flatten (unless `sections` were made already, e.g. by the parse sandbox) then chunk one document."""
        sections = self.flatten(doc) if sections is None else sections
        return Prepared(doc, sections, self.chunk(doc, sections))

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

    def embed_files(self, files: Sequence[tuple[Hashable, list[Chunk]]]) -> FileVectors:
        """Embed the chunks of many files in large batches; a failing batch is retried file by file
        so only the bad file gets an error (any exception, not only provider errors). A provider
        that fails for every file (an outage, not a bad file) raises its `EmbeddingError`, as before."""
        out = FileVectors()
        streak = [0]  # consecutive single-file provider errors while nothing has succeeded yet

        def run(group: list[tuple[Hashable, list[Chunk]]]) -> None:
            try:
                result = self.embed([c for _, cs in group for c in cs])
            except Exception as exc:  # noqa: BLE001 - the per-file boundary: the file fails, not the run
                if len(group) > 1:
                    log.warning("embedding %d files failed (%s); retrying file by file", len(group), error_text(exc))
                    for item in group:
                        run([item])
                    return
                if isinstance(exc, EmbeddingError) and not out.vectors:
                    streak[0] += 1
                    if streak[0] >= 2 or len(files) == 1:
                        raise
                log.error("embedding %s failed", group[0][0], exc_info=exc)
                out.errors[group[0][0]] = exc
                return
            out.cache_hits += result.cache_hits
            out.embedded += result.embedded
            offset = 0
            for key, cs in group:
                out.vectors[key] = result.vectors[offset: offset + len(cs)]
                offset += len(cs)

        group: list[tuple[Hashable, list[Chunk]]] = []
        for item in files:
            group.append(item)
            if sum(len(cs) for _, cs in group) >= EMBED_BATCH_CHUNKS:
                run(group)
                group = []
        if group:
            run(group)
        return out

    def _record(self, hits: int, misses: int, usage: list) -> None:
        self.store.record_embedding(self.run_id, self.run_kind, self.provider.space, hits, misses, usage,
                                    self.settings.embedding.prices)

    def publish(self, prepared: Prepared, vectors: np.ndarray) -> None:
        """Write one document with its sections, chunks and vectors in one transaction."""
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
            cfg.dimensions, self.fingerprint, graph=document_graph(prepared.doc, prepared.sections),
        )

    def ensure_space(self) -> None:
        """Register the provider's embedding space (before the first publish)."""
        cfg = self.settings.embedding
        self.store.ensure_space(self.provider.space, cfg.model, cfg.dimensions, self.provider.name)

    def ensure_index(self) -> dict:
        """The one place the HNSW index is built: the provider space's index if missing (bulk loads
        build it after loading; later publishes insert into it). The store's build record."""
        return self.store.ensure_hnsw_index(self.provider.space, self.settings.embedding.dimensions)

    def is_current(self, doc: Document, states: dict[str, tuple[str, str]]) -> bool:
        """True when the stored version has the same content and was made with the same settings."""
        return states.get(doc.path) == (doc.content_hash, self.fingerprint)
