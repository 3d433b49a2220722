"""Ingest of request content (uploads) and of files named by path, done safely: the file is parsed
first in a sandboxed worker, every document it would produce must lie under its own file, an upload
may not take over a document (its path or its id) from another file or root, a failed upload leaves
nothing on disk, uploads per collection stay within a quota, and a delete removes the files it frees."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rag_lib.errors import DocumentConflictError, ValidationError
from rag_lib.server.errors import DocumentRejectedError, UploadQuotaError, scrub_outcomes
from rag_lib.server.isolation import Preflight, preflight
from rag_lib.server.schemas import check_collection
from rag_lib.server.security import confine, safe_relative

log = logging.getLogger("rag_lib.server")

_FAILED = ("failed", "skipped")
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()
# bytes and files of uploads being published right now, per collection folder (quota accounting)
_reserved: dict[Path, list[int]] = {}
_reserved_guard = threading.Lock()


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
    # An id is how clients fetch, compare and delete a document: one another file's document already
    # carries would make those lookups ambiguous (and a delete by id hit both).
    for path, doc_id in zip(found.paths, found.doc_ids):
        others = [p for p in kb.documents_with_id(doc_id, collection) if p != path]
        if others:
            raise DocumentConflictError(
                f"id '{doc_id[:200]}' already belongs to document '{others[0][:200]}' in collection "
                f"'{collection}'; give this document another id (YAML `_meta.id`, markdown front matter `id`) "
                "or delete that document first")


def ingest_path(kb: Any, path: str, collection: str | None = None, force: bool = False) -> dict[str, Any]:
    """Ingest a file inside a configured corpus root after a sandboxed parse of it."""
    roots = [Path(r) for r in kb.settings.server.corpus_roots]
    file, root = confine(path, roots)
    coll = collection or kb.settings.collection
    rel = file.relative_to(root).as_posix()
    found = preflight(kb, file, root, coll)
    _confined_identities(found, rel)
    return _conflict_raised(scrub_outcomes(_ingest(kb, file, root, coll, force, found, rel),
                                           [r.resolve() for r in roots] + roots))


def _conflict_raised(report: dict[str, Any]) -> dict[str, Any]:
    """`report`, unless a file of it names another file's document: then `DocumentConflictError`
    (409), however the conflict was found (before publishing, or by the ingest itself)."""
    for item in report.get("files", []):
        if item.get("reason") == "document_conflict":
            raise DocumentConflictError(str(item.get("detail", "")).removeprefix("DocumentConflictError: "))
    return report


def _ingest(kb: Any, file: Path, root: Path, collection: str, force: bool, found: Preflight, rel: str) -> dict[str, Any]:
    """Ingest one file of a request from its sandboxed parse (not parsed again), refusing it whole
    when a document or the request is over the chunk limits (LimitExceededError, nothing written)."""
    parsed = {rel: found.parsed} if found.parsed is not None else None
    return kb.ingest([file], collection, root=root, force=force, parsed=parsed,
                     max_request_chunks=kb.settings.limits.max_chunks_per_request).to_dict()


def ingest_upload(kb: Any, name: str, content: str, collection: str | None = None,
                  force: bool = False) -> dict[str, Any]:
    """Keep uploaded text under the upload folder as `name` and ingest it (its path is `name`)."""
    rel = safe_relative(name)
    data = content.encode("utf-8")
    if len(data) > kb.settings.max_file_bytes:
        raise ValidationError(f"content is {len(data)} bytes; the limit is {kb.settings.max_file_bytes}")
    coll = collection or kb.settings.collection
    try:
        check_collection(coll)  # one folder under the upload dir, never a path into another collection's
    except ValueError as exc:
        raise ValidationError(str(exc)) from None
    base = upload_base(kb)
    root = (base / coll).resolve()
    target = (root / rel).resolve()
    if not target.is_relative_to(root) or target == root:  # a symlinked folder inside the upload dir
        raise ValidationError(f"name '{name[:100]}' leaves the upload folder")
    if target.exists() and not target.is_file():
        raise ValidationError(f"name '{name[:100]}' is a folder of earlier uploads; choose a file name")
    base.mkdir(parents=True, exist_ok=True)
    with _quota(kb, root, target, len(data), coll):
        return _stage_and_publish(kb, data, rel, target, root, base, coll, force)


def _stage_and_publish(kb: Any, data: bytes, rel: Any, target: Path, root: Path, base: Path, coll: str,
                       force: bool) -> dict[str, Any]:
    staging = Path(tempfile.mkdtemp(dir=base, prefix=".staging-"))
    try:
        staged = staging / "new" / rel
        staged.parent.mkdir(parents=True)
        staged.write_bytes(data)
        found = preflight(kb, staged, staging / "new", coll)
        _confined_identities(found, rel.as_posix())
        with _lock_for(target):
            _no_takeover(kb, found, target, coll)
            found = found.moved_to(staged.resolve(), target)
            return _conflict_raised(scrub_outcomes(_publish(kb, staged, staging / "previous", target, root, coll,
                                                            force, found, rel.as_posix()), [root, base]))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(kb: Any, staged: Path, previous: Path, target: Path, root: Path, collection: str,
             force: bool, found: Preflight, rel: str) -> dict[str, Any]:
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
        report = _ingest(kb, target, root, collection, force, found, rel)
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


def _usage(root: Path) -> tuple[int, int]:
    """(bytes, files) of the regular files under a collection's upload folder (links not followed)."""
    size = files = 0
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                size += entry.stat(follow_symlinks=False).st_size
                files += 1
    return size, files


@contextmanager
def _quota(kb: Any, root: Path, target: Path, size: int, collection: str) -> Iterator[None]:
    """Refuse an upload that would take the collection's upload folder past its quota, counting the
    uploads being published concurrently (reserved until they finish); a replaced file frees its size."""
    cfg = kb.settings.server
    if cfg.upload_quota_bytes is None and cfg.upload_quota_files is None:
        yield
        return
    old = target.stat().st_size if target.is_file() else None
    grow_bytes, grow_files = size - (old or 0), 0 if old is not None else 1
    with _reserved_guard:
        used_bytes, used_files = _usage(root)
        held = _reserved.setdefault(root, [0, 0])
        after_bytes, after_files = used_bytes + held[0] + grow_bytes, used_files + held[1] + grow_files
        for setting, limit, after, unit in (("upload_quota_bytes", cfg.upload_quota_bytes, after_bytes, "bytes"),
                                            ("upload_quota_files", cfg.upload_quota_files, after_files, "files")):
            if limit is not None and after > limit:
                raise UploadQuotaError(
                    f"collection '{collection}' would hold {after} {unit} of uploads with this one; the limit is "
                    f"{limit} (settings.server.{setting}); delete uploads or raise the setting")
        held[0] += grow_bytes
        held[1] += grow_files
    try:
        yield
    finally:
        with _reserved_guard:
            held[0] -= grow_bytes
            held[1] -= grow_files


def remove_uploaded_files(kb: Any, collection: str, source_paths: Iterable[str | None]) -> tuple[list[str], list[str]]:
    """After a delete: remove the collection's uploaded files that no document uses any more (corpus
    files are never touched). Returns (removed, errors), both relative to the upload folder; each
    error is logged with its detail."""
    base = upload_base(kb)
    root = (base / collection).resolve()
    removed: list[str] = []
    errors: list[str] = []
    for source in sorted({s for s in source_paths if s}):
        file = Path(source)
        if not file.is_relative_to(root) or file == root:
            continue
        rel = file.relative_to(base).as_posix()
        with _lock_for(file):  # an upload of the same name publishes under this lock: never unlink its file
            if kb.sources_in_use([source]):
                continue
            try:
                file.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.error("could not remove an uploaded file", exc_info=exc, extra={"file": rel})
                errors.append(f"{rel}: {exc.strerror or type(exc).__name__}")
                continue
            removed.append(rel)
            _prune_empty_dirs(file.parent, root)
    return removed, errors
