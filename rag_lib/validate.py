"""Dry-run validation: what ingest would do to files, without a database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_lib.chunking import Chunker
from rag_lib.config import Settings
from rag_lib.corpus_files import read_text
from rag_lib.documents import load_file
from rag_lib.ingest.stages import error_text
from rag_lib.flatten import flatten, load_mapping
from rag_lib.ingest.run import collect_files
from rag_lib.log import get_logger
from rag_lib.models import Skipped
from rag_lib.tokens import get_tokenizer

log = get_logger(__name__)


def validate_paths(settings: Settings, paths: list[Path], root: Path | None = None) -> dict[str, Any]:
    """Per-file report (type, sections, chunk sizes, problem); nothing is written anywhere."""
    from rag_lib.embedding.local import default_model_path

    tokenizer = get_tokenizer(settings.embedding.model_path or default_model_path())
    chunker = Chunker(tokenizer, settings.chunking)
    mapping = load_mapping(Path(settings.sections_file))
    files: list[dict[str, Any]] = []
    for base, file in collect_files(paths, root):
        try:
            files.extend(_validate_file(file, base, settings, mapping, chunker, tokenizer.limit))
        except Exception as exc:  # noqa: BLE001 - one bad file is reported, the others still validated
            rel = file.relative_to(base).as_posix() if base.is_dir() else file.name
            log.error("validating %s failed: %s", rel, error_text(exc), exc_info=exc)
            files.append({"path": rel, "problem": f"failed: {error_text(exc)}"})
    problems = sum(1 for f in files if f.get("problem"))
    return {"files": files, "ok": len(files) - problems, "problems": problems}


def _validate_file(file: Path, base: Path, settings: Settings, mapping, chunker: Chunker, limit: int) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    for item in load_file(file, base, settings.collection, settings.max_file_bytes, settings.limits):
        if isinstance(item, Skipped):
            entries.append({"path": item.path, "problem": f"{item.reason}: {item.detail}"})
            continue
        raw = read_text(Path(item.source_path), None, settings.max_file_bytes) if item.format == "yaml" else None
        sections = flatten(item, mapping, raw)
        chunks = chunker.chunk(item, sections)
        over = [c for c in chunks if c.token_count > limit]
        entry = {
            "path": item.path, "doc_type": item.doc_type, "doc_id": item.doc_id,
            "sections": len(sections), "empty_sections": sum(s.is_empty for s in sections),
            "chunks": len(chunks), "max_tokens": max((c.token_count for c in chunks), default=0),
        }
        if over:
            entry["problem"] = f"{len(over)} chunks over the model limit of {limit} tokens"
        elif not chunks:
            entry["problem"] = "no indexable text"
        entries.append(entry)
    return entries
