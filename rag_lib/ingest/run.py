"""Incremental ingest of corpus roots, in memory: new and changed files are processed, unchanged
ones are left alone, bad input is recorded and skipped, an unexpected error in one file is that
file's failure (the run goes on), and `prune` removes documents whose files are gone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from rag_lib.documents import iter_corpus_files
from rag_lib.ingest.stages import EMBED_BATCH_CHUNKS, Engine, Loaded, Prepared, error_text
from rag_lib.errors import LimitExceededError, RagError, TooManyChunksError, ValidationError
from rag_lib.graph.extract import forget_corpus_indexes
from rag_lib.log import get_logger
from rag_lib.models import FileOutcome, IngestReport, ParsedFile, Skipped, SourceFile

log = get_logger(__name__)

ProgressFn = Callable[[str, int, int], None]  # (file just done, files done, files in all)


def collect_files(paths: Iterable[Path], root: Path | None = None) -> list[tuple[Path, Path]]:
    """(root, file) pairs. A directory is its own root; a file's root is `root` or its folder. A
    file is taken as spelled (its link, if it is one, is not followed here): reading it confines
    it to its root, so a link out of the root is refused there, as for every file of a folder."""
    pairs: list[tuple[Path, Path]] = []
    for raw in paths:
        spelled = Path(os.path.abspath(raw))
        if not os.path.lexists(spelled):
            raise ValidationError(f"{raw}: no such file or directory")
        is_dir = spelled.is_dir()
        # a folder is resolved whole; a file only up to its folder
        path = spelled.resolve() if is_dir else spelled.parent.resolve() / spelled.name
        base = root.resolve() if root else (path if is_dir else path.parent)
        if root and not path.is_relative_to(base):
            raise ValidationError(f"{raw} is not inside --root {root}")
        pairs.extend((base, f) for f in iter_corpus_files(path))
    return pairs


def source_files(paths: Iterable[Path], collection: str, root: Path | None = None) -> list[SourceFile]:
    """The files under `paths` as `SourceFile`s of `collection` (see `collect_files` for roots)."""
    return [SourceFile(collection, base, file.relative_to(base).as_posix() if base.is_dir() else file.name)
            for base, file in collect_files(paths, root)]


def _reason(stage: str, exc: BaseException) -> str:
    return exc.code if isinstance(exc, RagError) else f"{stage}_failed"


def ingest(
    engine: Engine,
    paths: Iterable[Path],
    collection: str,
    *,
    prune: bool = False,
    force: bool = False,
    root: Path | None = None,
    progress: ProgressFn | None = None,
    parsed: Mapping[str, ParsedFile] | None = None,
    max_request_chunks: int | None = None,
) -> IngestReport:
    """Bring the collection in step with the files under `paths`; see module docstring.

    `parsed` (by path relative to the root): files loaded and flattened already (the server's parse
    sandbox), not parsed again. `max_request_chunks` (a server request): every document is prepared
    before any is embedded, and a document over `limits.max_chunks_per_document` or all of them over
    this number raise `LimitExceededError` with nothing embedded or written; without it, a document
    over the per-document limit is skipped with its reason and the others go on."""
    started = time.perf_counter()
    forget_corpus_indexes()  # files added since the last run name tickers and link targets for this one
    store = engine.store
    engine.ensure_space()
    report = IngestReport(collection=collection)
    states = store.document_states(collection)
    seen: set[str] = set()
    batch: list[tuple[Prepared, str]] = []

    def fail(path: str, stage: str, exc: BaseException) -> None:
        log.error("%s failed for %s: %s", stage, path, error_text(exc), exc_info=exc)
        store.record_failure(f"ingest:{stage}", f"{path}: {error_text(exc)}", run_id=engine.run_id, partition=path)
        report.outcomes.append(FileOutcome(path, "failed", reason=_reason(stage, exc), detail=error_text(exc)))

    def flush() -> None:
        if not batch:
            return
        result = engine.embed_files([(i, prepared.chunks) for i, (prepared, _) in enumerate(batch)])
        report.cache_hits += result.cache_hits
        report.embedded += result.embedded
        for i, (prepared, status) in enumerate(batch):
            if i in result.errors:
                fail(prepared.doc.path, "embed", result.errors[i])
                continue
            try:
                engine.publish(prepared, result.vectors[i])
                report.outcomes.append(FileOutcome(prepared.doc.path, status, chunks=len(prepared.chunks)))
            except Exception as exc:  # noqa: BLE001 - the per-file boundary
                fail(prepared.doc.path, "publish", exc)
        batch.clear()

    def too_many(doc, exc: TooManyChunksError) -> None:
        skip = Skipped(collection, doc.path, exc.reason, str(exc), doc.content_hash)
        store.record_skip(skip)
        report.outcomes.append(FileOutcome(doc.path, "skipped", reason=skip.reason, detail=skip.detail))

    strict = max_request_chunks is not None
    files = source_files(paths, collection, root)
    for done, source in enumerate(files, 1):
        early = (parsed or {}).get(source.rel)
        try:
            loaded = (Loaded(source, early.documents, early.skips, early.file_hash) if early
                      else engine.load(source))
        except Exception as exc:  # noqa: BLE001 - any error in one file is that file's failure
            seen.add(source.rel)  # a failed file keeps its last good version (prune leaves it)
            fail(source.rel, "load", exc)
            loaded = None
        for skip in loaded.skips if loaded else []:
            seen.add(skip.path)
            store.record_skip(skip)
            report.outcomes.append(FileOutcome(skip.path, "skipped", reason=skip.reason, detail=skip.detail))
        for doc in loaded.documents if loaded else []:
            seen.add(doc.path)
            if not force and engine.is_current(doc, states):
                report.outcomes.append(FileOutcome(doc.path, "unchanged"))
                continue
            try:
                prepared = engine.prepare(doc, early.sections.get(doc.path) if early else None)
            except TooManyChunksError as exc:
                if strict:
                    raise
                too_many(doc, exc)
                continue
            except Exception as exc:  # noqa: BLE001 - the per-file boundary (RecursionError included)
                fail(doc.path, "prepare", exc)
                continue
            batch.append((prepared, "changed" if doc.path in states else "new"))
            total = sum(len(p.chunks) for p, _ in batch)
            if strict and total > max_request_chunks:
                raise LimitExceededError(
                    f"this request has at least {total} chunks, over limits.max_chunks_per_request={max_request_chunks} "
                    "(RAG_LIMITS__MAX_CHUNKS_PER_REQUEST); send fewer documents per request or raise the setting")
            if not strict and total >= EMBED_BATCH_CHUNKS:
                flush()
        if progress:
            progress(str(source.path), done, len(files))
    flush()
    # Bulk loads build the HNSW index after loading; later ingests find it and insert into it.
    if report.chunks:
        store.ensure_hnsw_index(engine.provider.space, engine.settings.embedding.dimensions)
    if prune:
        report.pruned = store.delete_collection_documents_except(collection, seen)
    report.seconds = time.perf_counter() - started
    return report
