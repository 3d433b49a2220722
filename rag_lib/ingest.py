"""Incremental ingest of corpus roots: new and changed files are processed, unchanged ones are
left alone, bad input is recorded and skipped, and `prune` removes documents whose files are gone."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from rag_lib.documents import iter_corpus_files
from rag_lib.errors import RagError, ValidationError
from rag_lib.log import get_logger
from rag_lib.models import FileOutcome, IngestReport, Skipped
from rag_lib.pipeline import Pipeline, Prepared

log = get_logger(__name__)

ProgressFn = Callable[[str, int, int], None]  # (file just done, files done, files in all)
FLUSH_CHUNKS = 512  # chunks embedded per provider call group: large batches keep the encoder busy


def collect_files(paths: Iterable[Path], root: Path | None = None) -> list[tuple[Path, Path]]:
    """(root, file) pairs. A directory is its own root; a file's root is `root` or its folder."""
    pairs: list[tuple[Path, Path]] = []
    for raw in paths:
        path = Path(raw).resolve()
        if not path.exists():
            raise ValidationError(f"{raw}: no such file or directory")
        base = (root.resolve() if root else (path if path.is_dir() else path.parent))
        if root and not path.is_relative_to(base):
            raise ValidationError(f"{raw} is not inside --root {root}")
        pairs.extend((base, f) for f in iter_corpus_files(path))
    return pairs


def ingest(
    pipeline: Pipeline,
    paths: Iterable[Path],
    collection: str,
    *,
    prune: bool = False,
    force: bool = False,
    root: Path | None = None,
    progress: ProgressFn | None = None,
) -> IngestReport:
    """Bring the collection in step with the files under `paths`; see module docstring."""
    started = time.perf_counter()
    store = pipeline.store
    provider = pipeline.provider
    cfg = pipeline.settings.embedding
    store.ensure_space(provider.space, cfg.model, cfg.dimensions, provider.name)
    report = IngestReport(collection=collection)
    states = store.document_states(collection)
    seen: set[str] = set()
    batch: list[tuple[Prepared, str]] = []

    def flush() -> None:
        if not batch:
            return
        chunks = [c for prepared, _ in batch for c in prepared.chunks]
        result = pipeline.embed(chunks)
        report.cache_hits += result.cache_hits
        report.embedded += result.embedded
        offset = 0
        for prepared, status in batch:
            n = len(prepared.chunks)
            try:
                pipeline.publish(prepared, result.vectors[offset : offset + n])
                report.outcomes.append(FileOutcome(prepared.doc.path, status, chunks=n))
            except RagError as exc:
                log.exception("publishing %s failed", prepared.doc.path)
                report.outcomes.append(FileOutcome(prepared.doc.path, "failed", reason=exc.code, detail=str(exc)))
            offset += n
        batch.clear()

    files = collect_files(paths, root)
    for done, (base, file) in enumerate(files, 1):
        for item in pipeline.load(file, base, collection):
            seen.add(item.path)
            if isinstance(item, Skipped):
                store.record_skip(item)
                report.outcomes.append(FileOutcome(item.path, "skipped", reason=item.reason, detail=item.detail))
                continue
            if not force and pipeline.is_current(item, states):
                report.outcomes.append(FileOutcome(item.path, "unchanged"))
                continue
            try:
                prepared = pipeline.prepare(item)
            except (RagError, ValueError, TypeError, OSError) as exc:
                log.exception("preparing %s failed", item.path)
                report.outcomes.append(FileOutcome(item.path, "failed", reason="prepare_failed", detail=str(exc)))
                continue
            batch.append((prepared, "changed" if item.path in states else "new"))
            if sum(len(p.chunks) for p, _ in batch) >= FLUSH_CHUNKS:
                flush()
        if progress:
            progress(str(file), done, len(files))
    flush()
    # Bulk loads build the HNSW index after loading; later ingests find it and insert into it.
    if report.chunks:
        store.ensure_hnsw_index(provider.space, cfg.dimensions)
    if prune:
        report.pruned = store.delete_collection_documents_except(collection, seen)
    report.seconds = time.perf_counter() - started
    return report
