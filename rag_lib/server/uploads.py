"""Ingest of request content (uploads) and of files named by path, done safely: the file is parsed
first in a sandboxed worker, every document it would produce must lie under its own file, an upload
may not take over a document from another file or root, and a failed upload leaves nothing on disk."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from rag_lib.errors import ValidationError
from rag_lib.server.errors import DocumentConflictError, DocumentRejectedError, scrub_outcomes
from rag_lib.server.isolation import Preflight, preflight
from rag_lib.server.security import confine, safe_relative

_FAILED = ("failed", "skipped")
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(target: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(str(target), threading.Lock())


def upload_base(kb: Any) -> Path:
    return Path(kb.settings.server.upload_dir or (Path(kb.settings.home) / "uploads")).resolve()


def _confined_identities(found: Preflight, rel: str) -> None:
    """Every document of a file is the file itself or `<file>#<id>` (JSONL records)."""
    outside = [p for p in found.paths if p != rel and not p.startswith(rel + "#")]
    if outside:
        raise DocumentRejectedError(
            f"'{rel}' would create documents outside itself ({outside[0][:100]!r}); record ids must stay "
            f"under their file as '{rel}#<id>'")


def _no_takeover(kb: Any, found: Preflight, target: Path, collection: str) -> None:
    """Refuse when a document this upload would write belongs to another file (another root, or a
    corpus file with the same relative path)."""
    from rag_lib.errors import NotFoundError

    for path in found.paths:
        try:
            existing = kb.show(path, collection)
        except NotFoundError:
            continue
        if existing.get("path") == path and existing.get("source_path") not in (None, str(target)):
            raise DocumentConflictError(
                f"document '{path[:200]}' in collection '{collection}' comes from another file; upload under "
                "another name, or delete that document first")


def ingest_path(kb: Any, path: str, collection: str | None = None, force: bool = False) -> dict[str, Any]:
    """Ingest a file inside a configured corpus root after a sandboxed parse of it."""
    roots = [Path(r) for r in kb.settings.server.corpus_roots]
    file, root = confine(path, roots)
    coll = collection or kb.settings.collection
    _confined_identities(preflight(kb, file, root, coll), file.relative_to(root).as_posix())
    report = kb.ingest([file], coll, root=root, force=force).to_dict()
    return scrub_outcomes(report, [r.resolve() for r in roots] + roots)


def ingest_upload(kb: Any, name: str, content: str, collection: str | None = None,
                  force: bool = False) -> dict[str, Any]:
    """Keep uploaded text under the upload folder as `name` and ingest it (its path is `name`)."""
    rel = safe_relative(name)
    data = content.encode("utf-8")
    if len(data) > kb.settings.max_file_bytes:
        raise ValidationError(f"content is {len(data)} bytes; the limit is {kb.settings.max_file_bytes}")
    coll = collection or kb.settings.collection
    base = upload_base(kb)
    root = (base / safe_relative(coll)).resolve()
    target = (root / rel).resolve()
    if not target.is_relative_to(root) or target == root:  # a symlinked folder inside the upload dir
        raise ValidationError(f"name '{name[:100]}' leaves the upload folder")
    if target.exists() and not target.is_file():
        raise ValidationError(f"name '{name[:100]}' is a folder of earlier uploads; choose a file name")
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=base, prefix=".staging-"))
    try:
        staged = staging / "new" / rel
        staged.parent.mkdir(parents=True)
        staged.write_bytes(data)
        found = preflight(kb, staged, staging / "new", coll)
        _confined_identities(found, rel.as_posix())
        with _lock_for(target):
            _no_takeover(kb, found, target, coll)
            return scrub_outcomes(_publish(kb, staged, staging / "previous", target, root, coll, force), [root, base])
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(kb: Any, staged: Path, previous: Path, target: Path, root: Path, collection: str,
             force: bool) -> dict[str, Any]:
    """Move the staged file into place and ingest it; on failure put back what was there."""
    had_previous = target.is_file()
    if had_previous:
        os.replace(target, previous)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, target)  # atomic: a concurrent ingest never reads half a file

    def restore() -> None:
        if had_previous:
            os.replace(previous, target)
        else:
            target.unlink(missing_ok=True)
            _prune_empty_dirs(target.parent, root)

    try:
        report = kb.ingest([target], collection, root=root, force=force).to_dict()
    except BaseException:
        restore()
        raise
    if any(item.get("status") in _FAILED for item in report.get("files", [])):
        restore()
    return report


def _prune_empty_dirs(folder: Path, root: Path) -> None:
    while folder != root and folder.is_relative_to(root):
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
