"""The ingest engine's stage functions, in three parts: `Preparer` (load → flatten → chunk: settings
and a tokenizer, no database, no provider; `rag validate` uses it alone), `Embedder` (vectors
through the embedding cache, many files per provider call; `rag reembed` uses it for the new space)
and `Publisher` (the serving tables and their index). `Engine` binds the three to one knowledge
base; the per-file state machine that drives them (`rag ingest` and the Dagster assets alike) is
`rag_lib.ingest.state`."""

from __future__ import annotations

import inspect
import threading
import uuid
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rag_lib.chunking import CHUNKER_VERSION, Chunker
from rag_lib.config import Settings
from rag_lib.corpus_files import ReadLimits
from rag_lib.db import database_gone
from rag_lib.documents import load_source
from rag_lib.embedding import EmbeddingProvider
from rag_lib.errors import DimensionMismatchError, EmbeddingError, StoppedError, TooManyChunksError, first_line
from rag_lib.flatten import flatten, load_mapping
from rag_lib.graph.extract import document_graph
from rag_lib.log import get_logger
from rag_lib.models import Chunk, Document, Section, Skipped, SourceFile
from rag_lib.store import Store
from rag_lib.tokens import Tokenizer
from rag_lib.versions import fingerprint, stage_versions

log = get_logger(__name__)

# How long a call waits for another thread's call that is embedding the same texts before embedding
# them itself (a stuck call costs duplicate work, never a hang)
BORROW_WAIT_SECONDS = 300.0
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
    cache_hits: int = 0  # chunks whose text's vector came from the cache (or another call's)
    embedded: int = 0  # distinct texts the provider embedded for the other chunks
    problems: list[str] = field(default_factory=list)
    usage: list = field(default_factory=list)  # rag_lib.embedding.usage.Usage per provider used


@dataclass
class FileVectors:
    """Vectors of many files' chunks, embedded together: per-file vectors or the file's error."""

    vectors: dict[Hashable, np.ndarray] = field(default_factory=dict)
    errors: dict[Hashable, Exception] = field(default_factory=dict)
    cache_hits: int = 0  # chunks, as `EmbedResult.cache_hits`
    embedded: int = 0  # distinct texts, as `EmbedResult.embedded`


def file_hash(path: Path, root: Path, settings: Settings) -> str:
    """SHA-256 of a file's bytes, read in blocks within its size limit (what decides whether a
    file changed); equal to what `Engine.load` records. See `rag_lib.corpus_files.file_digest`."""
    return ReadLimits.of(settings).digest(path, root)


def error_text(exc: BaseException) -> str:
    """One line naming the exception type and message (RecursionError etc. have no RagError code):
    the message's first line, as a database error's DETAIL and CONTEXT lines are for the log."""
    return f"{type(exc).__name__}: {first_line(exc, 2000)}"[:2000]


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


class Preparer:
    """Load, flatten and chunk files: needs settings and the model's tokenizer only."""

    def __init__(self, settings: Settings, tokenizer: Tokenizer):
        self.settings = settings
        self.mapping = load_mapping(Path(settings.sections_file))
        self.chunker = Chunker(tokenizer, settings.chunking)

    @classmethod
    def offline(cls, settings: Settings) -> Preparer:
        """A preparer cutting the chunks an ingest would, with the configured provider's tokenizer
        (a remote one's `tokenizer_path` and input limit), without a model, a key or a database: `rag validate`."""
        from rag_lib.embedding import configured_tokenizer

        return cls(settings, configured_tokenizer(settings))

    @property
    def token_limit(self) -> int:
        return self.chunker.limit

    def load(self, source: SourceFile) -> Loaded:
        """Read and parse one file: documents, skip records (bad input, with a reason) and its hash."""
        # One bounded read: the size is checked before any byte is read, the digest comes from the same bytes.
        items, digest = load_source(source.path, source.root, source.collection, self.settings.max_file_bytes,
                                    self.settings.limits)
        log.debug("document parsed", extra={"where": "in-process", "rel": source.rel})
        return Loaded(source, [i for i in items if isinstance(i, Document)],
                      [i for i in items if isinstance(i, Skipped)], digest)

    def flatten(self, doc: Document) -> list[Section]:
        """A document's sections (YAML: one per top-level key, with the key lines `load` noted;
        markdown: one per H2); the file is not read again."""
        return flatten(doc, self.mapping)

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


@dataclass
class Call:
    """Texts on their way through the embedding cache and the provider (`Embedder.start`)."""

    texts: dict[str, str]  # content hash → text
    cached: dict[str, np.ndarray] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)  # sent to the provider by this call
    borrowed: dict[str, Call] = field(default_factory=dict)  # hash → the earlier call embedding it
    pending: Callable[[], tuple[np.ndarray, list]] | None = None
    error: Exception | None = None
    fresh: dict[str, np.ndarray] = field(default_factory=dict)  # once finished: what the provider made
    done: threading.Event = field(default_factory=threading.Event)  # set once finished or abandoned


@dataclass(eq=False)
class FileGroup:
    """Files whose chunks are embedded together, and the call started for them (None: not yet)."""

    files: list[tuple[Hashable, list[Chunk]]]
    call: Call | None


def _texts(chunks: Iterable[Chunk]) -> dict[str, str]:
    """content hash → the text embedded for it (what `Embedder.start` takes)."""
    return {c.content_hash: c.embed_text for c in chunks}


def _groups(files: Sequence[tuple[Hashable, list[Chunk]]]) -> list[list[tuple[Hashable, list[Chunk]]]]:
    """Consecutive files in groups of at least EMBED_BATCH_CHUNKS chunks (the last one smaller)."""
    groups: list[list[tuple[Hashable, list[Chunk]]]] = [[]]
    size = 0
    for item in files:
        if size >= EMBED_BATCH_CHUNKS:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += len(item[1])
    return [g for g in groups if g]


@dataclass
class CachedVectors:
    """Vectors by content hash; `fresh`: the hashes the provider embedded (the rest were cached)."""

    vectors: dict[str, np.ndarray]
    fresh: list[str]
    usage: list


class Embedder:
    """Vectors from one provider through the embedding cache (keyed by content hash, model and
    dimensions): cached texts are never sent again, new vectors are checked before they are cached,
    and every call is accounted to the current run (rag_embedding_runs/usage)."""

    def __init__(self, settings: Settings, store: Store, provider: EmbeddingProvider, *,
                 model: str | None = None, dimensions: int | None = None, kind: str = "ingest"):
        self.settings = settings
        self.store = store
        self.provider = provider
        self.model = model or settings.embedding.key
        self.dimensions = dimensions or settings.embedding.dimensions
        self._lock = threading.Lock()
        self._in_flight: dict[str, Call] = {}  # content hash → the started, unfinished call embedding it
        self.begin_run(kind)

    def begin_run(self, kind: str = "ingest", run_id: str | None = None) -> str:
        """Start a new accounting run (cache hits, tokens, cost), read back with `store.run_usage(run_id)`."""
        self.run_kind = kind
        self.run_id = run_id or f"{kind}-{uuid.uuid4().hex[:12]}"
        return self.run_id

    def vectors(self, texts: dict[str, str], borrow: bool = True) -> CachedVectors:
        """Vectors for texts by content hash, from the cache where possible; the rest from the
        provider, checked (size, NaN, zero) and then cached. Bad vectors raise, nothing is cached."""
        return self.finish(self.start(texts, borrow))

    def start(self, texts: dict[str, str], borrow: bool = True, stop: threading.Event | None = None) -> Call:
        """Look `texts` up in the cache and start the provider on the rest (`provider.start_counted`:
        the local model queues them for its workers and returns); `finish` waits for them. A text
        that a call started before and not finished yet is embedding is taken from that call, not
        sent twice (`borrow` False: sent anyway). Never raises: an error is raised by `finish`.
        `stop`: the run's stop signal, for a provider that can stop early (`start_counted`)."""
        call = Call(texts)
        try:
            call.cached = self.store.cache_get(list(texts), self.settings.embedding.cache_model(self.model),
                                               self.dimensions)
            with self._lock:
                for h in texts:
                    if h in call.cached:
                        continue
                    other = self._in_flight.get(h) if borrow else None
                    if other is None:
                        call.missing.append(h)
                        self._in_flight.setdefault(h, call)
                    else:
                        call.borrowed[h] = other
            if call.missing:
                missing = [texts[h] for h in call.missing]
                # the stop signal only to a provider that takes it (a plugin's may not)
                takes_stop = stop is not None and "stop" in inspect.signature(self.provider.start_counted).parameters
                call.pending = (self.provider.start_counted(missing, stop=stop) if takes_stop
                                else self.provider.start_counted(missing))
        except Exception as exc:  # noqa: BLE001 - raised by finish, on the thread that reports it
            call.error = exc
        return call

    def finish(self, call: Call) -> CachedVectors:
        """A started call's vectors (see `vectors`), accounted to the current run."""
        try:
            return self._finish(call)
        finally:
            self.abandon(call)
            call.pending, call.borrowed = None, {}  # a long run holds no chain of finished calls

    def abandon(self, call: Call) -> None:
        """Forget a started call that will not be finished (its run stopped): later calls embed its
        texts themselves instead of waiting for it, and what the provider has not started on is
        dropped (where it can say so: the local model's queued mini-batches)."""
        cancel = getattr(call.pending, "cancel", None)
        if cancel is not None:
            cancel()
        with self._lock:
            for h in call.missing:
                if self._in_flight.get(h) is call:
                    del self._in_flight[h]
        call.done.set()

    def _finish(self, call: Call) -> CachedVectors:
        if call.error is not None:
            raise call.error
        cached, missing, usage = call.cached, call.missing, []
        if missing:
            try:
                fresh, usage = call.pending()
            except EmbeddingError as exc:  # account for the requests the failure cost, then fail
                self._record(len(call.texts) - len(missing), len(missing), getattr(exc, "usage", []))
                raise
            problems = check_vectors(fresh, self.dimensions)
            if problems:
                error = DimensionMismatchError if "shape" in problems[0] else EmbeddingError
                label = getattr(self.provider, "label", self.provider.name)
                raise error(f"provider {label} returned bad vectors for {self.provider.space}: "
                            f"{'; '.join(problems)}; nothing was written")
            new = dict(zip(missing, fresh))
            self.store.cache_put(new, self.settings.embedding.cache_model(self.model), self.dimensions)
            cached.update(new)
            call.fresh = new
        # texts another call was embedding: wait for it (on another thread it may still be running),
        # then take its vectors, or embed them here when it failed or was abandoned. Never borrowed
        # again: a failing call's texts would otherwise be borrowed from its retry, and so on
        for other in {id(o): o for o in call.borrowed.values()}.values():
            other.done.wait(BORROW_WAIT_SECONDS)
        again = {h: call.texts[h] for h, other in call.borrowed.items() if h not in other.fresh}
        cached.update((h, other.fresh[h]) for h, other in call.borrowed.items() if h in other.fresh)
        self._record(len(call.texts) - len(missing) - len(again), len(missing), usage)
        if not again:
            return CachedVectors(cached, missing, usage)
        more = self.vectors(again, borrow=False)
        cached.update(more.vectors)
        return CachedVectors(cached, missing + more.fresh, usage + more.usage)

    def embed(self, chunks: list[Chunk]) -> EmbedResult:
        """Vectors for chunks, in their order (see `vectors`)."""
        return self._embedded(chunks, self.start(_texts(chunks)) if chunks else None)

    def _embedded(self, chunks: list[Chunk], call: Call | None) -> EmbedResult:
        if not chunks:
            return EmbedResult(np.zeros((0, self.dimensions), dtype=np.float32))
        got = self.finish(call)
        vectors = np.stack([got.vectors[c.content_hash] for c in chunks]).astype(np.float32)
        fresh = set(got.fresh)
        hits = sum(1 for c in chunks if c.content_hash not in fresh)
        return EmbedResult(vectors, cache_hits=hits, embedded=len(fresh), usage=got.usage)

    def start_files(self, files: Sequence[tuple[Hashable, list[Chunk]]],
                    stop: threading.Event | None = None) -> list[FileGroup]:
        """Start embedding many files' chunks, in the groups `embed_files` makes (see `start`);
        `embed_files(files, started)` finishes them."""
        return [FileGroup(group, self.start(_texts(c for _, cs in group for c in cs), stop=stop))
                for group in _groups(files)]

    def embed_files(self, files: Sequence[tuple[Hashable, list[Chunk]]],
                    started: Sequence[FileGroup] = (), stop: threading.Event | None = None) -> FileVectors:
        """Embed the chunks of many files in large batches; a failing batch is retried file by file
        so only the bad file gets an error (any exception, not only provider errors). A provider
        that fails for every file (an outage, not a bad file) raises its `EmbeddingError`, as before.
        `started`: groups `start_files` started, for the files with these same chunks (others are
        grouped and embedded here). Once `stop` is set, the next group (or a failing one) raises
        `StoppedError` instead of being embedded or retried."""
        out = FileVectors()
        streak = [0]  # consecutive single-file provider errors while nothing has succeeded yet
        hashes = {key: [c.content_hash for c in cs] for key, cs in files}
        ready = [g for g in started
                 if all(hashes.get(key) == [c.content_hash for c in cs] for key, cs in g.files)]
        covered = {key for g in ready for key, _ in g.files}
        for g in started:
            if g not in ready:  # its files' chunks changed since: its vectors are cached all the same
                try:
                    self.finish(g.call)
                except Exception as exc:  # noqa: BLE001 - these files are embedded again below
                    log.warning("embedding started for %d files failed (%s)", len(g.files), error_text(exc))
        groups = ready + [FileGroup(group, None) for group in _groups([f for f in files if f[0] not in covered])]

        def run(group: list[tuple[Hashable, list[Chunk]]], call: Call | None) -> None:
            if stop is not None and stop.is_set():
                raise StoppedError("the ingest was stopped")
            try:
                if call is None:
                    call = self.start(_texts(c for _, cs in group for c in cs), stop=stop)
                result = self._embedded([c for _, cs in group for c in cs], call)
            except Exception as exc:  # noqa: BLE001 - the per-file boundary: the file fails, not the run
                if stop is not None and stop.is_set():  # e.g. its queued mini-batches were dropped
                    raise StoppedError("the ingest was stopped") from exc
                if database_gone(exc):  # no file's fault: retried file by file, each waited out the pool's timeout
                    raise
                if len(group) > 1:
                    log.warning("embedding %d files failed (%s); retrying file by file", len(group), error_text(exc))
                    for item in group:
                        run([item], None)
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

        for g in groups:
            run(g.files, g.call)
        return out

    def _record(self, hits: int, misses: int, usage: list) -> None:
        self.store.record_embedding(self.run_id, self.run_kind, self.provider.space, hits, misses, usage,
                                    self.settings.embedding.prices)


class Publisher:
    """The serving tables: one document (sections, chunks, vectors, graph) per transaction, the
    embedding space it is published in, and that space's HNSW index."""

    def __init__(self, settings: Settings, store: Store, provider: EmbeddingProvider, fingerprint: str):
        self.settings = settings
        self.store = store
        self.provider = provider
        self.fingerprint = fingerprint

    def ensure_space(self) -> None:
        """Register the provider's embedding space (before the first publish)."""
        cfg = self.settings.embedding
        self.store.ensure_space(self.provider.space, self.provider.key, cfg.dimensions, self.provider.name,
                                self.provider.chunker())

    def publish(self, prepared: Prepared, vectors: np.ndarray) -> None:
        """Write one document with its sections, chunks and vectors in one transaction; refused
        (DimensionMismatchError) once a re-embed has made another space active."""
        cfg = self.settings.embedding
        problems = check_vectors(vectors, cfg.dimensions) if len(vectors) else []
        if problems:
            raise DimensionMismatchError(f"{prepared.doc.path}: {'; '.join(problems)}; nothing was written")
        self.store.publish_document(
            prepared.doc, prepared.sections, prepared.chunks, vectors, self.provider.space,
            cfg.dimensions, self.fingerprint, graph=document_graph(prepared.doc, prepared.sections),
        )

    def ensure_index(self) -> dict:
        """After a load: the one place the HNSW index is built (the provider space's, if missing:
        bulk loads build it after loading; later publishes insert into it), and fresh statistics
        for the tables the load changed much. The store's build record, with `analyzed`: those tables."""
        built = self.store.ensure_hnsw_index(self.provider.space, self.settings.embedding.dimensions)
        return {**built, "analyzed": self.store.refresh_statistics()}

    def is_current(self, doc: Document, states: dict[str, tuple[str, str]]) -> bool:
        """True when the stored version has the same content and was made with the same settings."""
        return states.get(doc.path) == (doc.content_hash, self.fingerprint)


class Engine:
    """The three parts bound to one settings object, store and provider, with the stage versions
    and the fingerprint (what makes a stored output current) they share."""

    def __init__(self, settings: Settings, store: Store, provider: EmbeddingProvider):
        self.settings = settings
        self.store = store
        self.provider = provider
        self.versions = stage_versions(settings, CHUNKER_VERSION, provider.chunker())
        self.fingerprint = fingerprint(self.versions)
        self.preparer = Preparer(settings, provider.tokenizer())
        self.embedder = Embedder(settings, store, provider)
        self.publisher = Publisher(settings, store, provider, self.fingerprint)
