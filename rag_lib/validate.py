"""Dry-run validation: what ingest would do to files, without a database or a provider (the
ingest engine's `Preparer` alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_lib.config import Settings
from rag_lib.errors import TooManyChunksError
from rag_lib.ingest.run import source_files
from rag_lib.ingest.stages import Preparer, error_text
from rag_lib.log import get_logger

log = get_logger(__name__)


def validate_paths(settings: Settings, paths: list[Path], root: Path | None = None) -> dict[str, Any]:
    """Per-file report (type, sections, chunk sizes, problem); nothing is written anywhere."""
    preparer = Preparer.offline(settings)
    files: list[dict[str, Any]] = []
    for source in source_files(paths, settings.collection, root):
        try:
            files.extend(_validate_file(preparer, source))
        except Exception as exc:  # noqa: BLE001 - one bad file is reported, the others still validated
            log.error("validating %s failed: %s", source.rel, error_text(exc), exc_info=exc)
            files.append({"path": source.rel, "problem": f"failed: {error_text(exc)}"})
    problems = sum(1 for f in files if f.get("problem"))
    return {"files": files, "ok": len(files) - problems, "problems": problems}


def _validate_file(preparer: Preparer, source) -> list[dict[str, Any]]:
    loaded = preparer.load(source)
    entries: list[dict[str, Any]] = [{"path": s.path, "problem": f"{s.reason}: {s.detail}"} for s in loaded.skips]
    limit = preparer.token_limit
    for doc in loaded.documents:
        sections = preparer.flatten(doc)
        entry = {"path": doc.path, "doc_type": doc.doc_type, "doc_id": doc.doc_id,
                 "sections": len(sections), "empty_sections": sum(s.is_empty for s in sections),
                 "warnings": doc.warnings}  # metadata ingest would leave out: reported, not a problem
        try:
            chunks = preparer.chunk(doc, sections)
        except TooManyChunksError as exc:  # ingest would skip it with this reason
            entries.append({**entry, "problem": f"{exc.reason}: {exc}"})
            continue
        over = [c for c in chunks if c.token_count > limit]
        entry.update(chunks=len(chunks), max_tokens=max((c.token_count for c in chunks), default=0))
        if over:
            entry["problem"] = f"{len(over)} chunks over the model limit of {limit} tokens"
        elif not chunks:
            entry["problem"] = "no indexable text"
        entries.append(entry)
    return entries
