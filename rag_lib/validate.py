"""Dry-run validation: what ingest would do to files, without a database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_lib.chunking import Chunker
from rag_lib.config import Settings
from rag_lib.flatten import flatten, load_mapping
from rag_lib.ingest import collect_files
from rag_lib.documents import load_file
from rag_lib.models import Skipped
from rag_lib.tokens import get_tokenizer


def validate_paths(settings: Settings, paths: list[Path], root: Path | None = None) -> dict[str, Any]:
    """Per-file report (type, sections, chunk sizes, problem); nothing is written anywhere."""
    from rag_lib.embedding.local import default_model_path

    tokenizer = get_tokenizer(settings.embedding.model_path or default_model_path())
    chunker = Chunker(tokenizer, settings.chunking)
    mapping = load_mapping(Path(settings.sections_file))
    files: list[dict[str, Any]] = []
    for base, file in collect_files(paths, root):
        for item in load_file(file, base, settings.collection, settings.max_file_bytes, settings.limits):
            if isinstance(item, Skipped):
                files.append({"path": item.path, "problem": f"{item.reason}: {item.detail}"})
                continue
            raw = file.read_text(encoding="utf-8-sig") if item.format == "yaml" else None
            sections = flatten(item, mapping, raw)
            chunks = chunker.chunk(item, sections)
            over = [c for c in chunks if c.token_count > tokenizer.limit]
            entry = {
                "path": item.path, "doc_type": item.doc_type, "doc_id": item.doc_id,
                "sections": len(sections), "empty_sections": sum(s.is_empty for s in sections),
                "chunks": len(chunks), "max_tokens": max((c.token_count for c in chunks), default=0),
            }
            if over:
                entry["problem"] = f"{len(over)} chunks over the model limit of {tokenizer.limit} tokens"
            elif not chunks:
                entry["problem"] = "no indexable text"
            files.append(entry)
    problems = sum(1 for f in files if f.get("problem"))
    return {"files": files, "ok": len(files) - problems, "problems": problems}
