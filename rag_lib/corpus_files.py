"""The one way to list and read corpus files: a walk of a root, and bounded, confined reads.

Every caller (`rag ingest`, the library, the Dagster sensor, `rag materialize`, the reconcile and
re-embed runs, `rag validate`, graph extraction) goes through here, so one rule holds everywhere:

- a file is read only if, after following links, it is a regular file inside its (resolved) root:
  a link out of the root (`outside_root`), to a FIFO, device or socket (`not_regular_file`) or
  back to itself (`link_loop`) is refused without being opened for reading. The check is repeated on the opened descriptor
  (`O_NONBLOCK`, so opening a FIFO never waits for a writer; `fstat`), so a file swapped for a
  link or a pipe after the walk is refused too;
- the size comes from `fstat` before any byte is read, and a read never takes more than its limit
  (`max_file_bytes`; `limits.max_jsonl_bytes` for a JSONL corpus): a file over it is `too_large`
  and costs no memory, a file that grows while read is cut off at the limit and refused;
- a path under its root longer than `MAX_PATH_BYTES` is `path_too_long`: it can name neither a
  Dagster partition nor a document (PostgreSQL cannot index keys that long), so it is skipped
  (recorded under a shortened path) before it becomes a key.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shlex
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rag_lib.errors import DocumentError
from rag_lib.models import Skipped

IGNORED_DIRS = {".git", "__pycache__", ".rag", "node_modules", ".venv"}
# Bytes of a file's path under its root. A Dagster partition key (root label + path) and our
# (collection, path) keys live in btree indexes, whose rows PostgreSQL caps near 2,700 bytes.
MAX_PATH_BYTES = 1024
BLOCK = 1 << 20  # read and hash in 1 MiB blocks
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def is_jsonl_name(name: str | os.PathLike[str]) -> bool:
    """Whether a file name is a JSONL corpus's: `.jsonl` in any case, as the loader reads it (its
    records are documents at `<file>#<_id>`)."""
    return Path(name).suffix.lower() == ".jsonl"


class FileRefused(DocumentError):
    """A corpus file that is not read: `reason` is the skip reason recorded for it; `setting` the
    limit it is over (`max_file_bytes`), if any."""

    code = "file_refused"

    def __init__(self, reason: str, detail: str, path: str | None = None, setting: str | None = None):
        self.detail = detail  # the skip detail (without the path, which the skip record carries)
        self.setting = setting
        super().__init__(reason, detail, path)


@dataclass(frozen=True)
class WalkEntry:
    """One non-directory entry under a root: `rel` (POSIX) names it; `stat` follows links."""

    root: Path
    rel: str
    stat: os.stat_result

    @property
    def path(self) -> Path:
        return self.root / self.rel


def display_path(rel: str) -> str:
    """A path short enough to record and show: a long one keeps its head and a hash of the whole."""
    if len(rel.encode()) <= MAX_PATH_BYTES:
        return rel
    return f"{rel[:120]}…[sha256 {hashlib.sha256(rel.encode()).hexdigest()[:16]}]"


def path_refusal(collection: str, rel: str) -> Skipped | None:
    """The `path_too_long` skip for a path under a root that cannot key a row, or None."""
    try:
        check_rel_path(rel)
    except FileRefused as exc:
        return Skipped(collection, exc.path or rel, exc.reason, exc.detail)
    return None


def check_rel_path(rel: str) -> None:
    """Raise `FileRefused` for a path under a root that cannot be a key: too long, or not valid UTF-8
    (a name in another encoding: PostgreSQL cannot store it, and every row of the file is keyed by it)."""
    try:
        size = len(rel.encode("utf-8"))
    except UnicodeEncodeError:
        try:  # the name's own bytes (surrogateescape), with U+FFFD for those that are not UTF-8
            shown = rel.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:  # a surrogate no byte stands for
            shown = rel.encode("utf-8", "replace").decode("utf-8")
        raise FileRefused("bad_file_name", "the file's name is not valid UTF-8 (shown with \ufffd for the bytes that "
                          "are not); rename it", display_path(shown)) from None
    if size > MAX_PATH_BYTES:
        raise FileRefused("path_too_long", f"path under the root is {size} bytes, over the {MAX_PATH_BYTES}-byte "
                          "limit; move the file to a shorter path", display_path(rel))


def walk(root: Path) -> list[WalkEntry]:
    """Every non-directory entry under `root`, sorted by path (VCS/cache folders ignored, links to
    folders not followed, unreadable folders left out: what `os.walk` lists). Entries are listed,
    not opened: reading them goes through `read_file` or `file_digest`, which refuse what is not a
    regular file inside the root (a link loop: `link_loop`), and whoever keys them checks
    `check_rel_path`. A dangling link is as good as gone and is left out. Paths under the root are built as they are found (the corpus
    sensor walks every root every tick: `os.walk` and `relpath` took half of an idle tick)."""
    entries: list[WalkEntry] = []
    folders = [("", os.fspath(root))]  # (path under the root with its trailing "/", path)
    while folders:
        prefix, folder = folders.pop()
        try:
            listing = os.scandir(folder)
        except OSError:
            continue
        with listing:
            for entry in listing:
                try:
                    is_dir = entry.is_dir()  # a link to a folder is a folder here, and not entered
                except OSError:
                    is_dir = False
                if is_dir:
                    if entry.name not in IGNORED_DIRS and not entry.is_symlink():
                        folders.append((f"{prefix}{entry.name}/", entry.path))
                    continue
                try:
                    st = os.stat(entry.path)
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        continue  # a dangling link, or gone between listing and stat: the next scan sees it
                    try:  # a link loop is listed (the link's own stat), so reading it records why it is skipped
                        st = os.lstat(entry.path)
                    except OSError:
                        continue
                entries.append(WalkEntry(root, prefix + entry.name, st))
    entries.sort(key=lambda e: e.rel)
    return entries


def file_gone(path: str | os.PathLike | None) -> bool:
    """Whether a file is known to be gone: no entry at its path, or a component of the path is no
    longer a folder. A path that cannot be checked (an unreadable folder, a link loop, a stale mount)
    is not gone: a walk leaves such files out, and deleting their documents would lose data that is
    still there."""
    if path is None:
        return True
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except OSError:
        return False
    return False


def empty_folder_warning(folder: Path, collection: str, documents: int) -> str:
    """The one line saying why the documents of a folder that lists no files at all are kept (prune,
    the corpus sensor), and the command that deletes them on purpose."""
    return (f"kept {documents} document(s) of {folder} (collection '{collection}'): the folder lists no files at "
            f"all, as an unmounted disk or mount point leaves it; if its files were deleted on purpose, delete "
            f"their documents with: rag ingest {shlex.quote(str(folder))} --collection {shlex.quote(collection)} "
            "--prune-empty")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _real(path: str, folders: dict[str, str] | None) -> str:
    """`os.path.realpath(path)`; with `folders` (a cache for one scan), each folder is resolved
    once and a file's own name costs one `lstat` (resolved in full when it is a link)."""
    if folders is None:
        return os.path.realpath(path)
    folder, name = os.path.split(path)
    full = os.path.join(_real_folder(folder, folders), name)
    return os.path.realpath(full) if os.path.islink(full) else full


def _real_folder(folder: str, folders: dict[str, str]) -> str:
    real = folders.get(folder)
    if real is None:
        real = folders[folder] = os.path.realpath(folder)
    return real


def _opened_path(fd: int) -> str | None:
    """Where an open descriptor's file is, as the kernel resolved it (Linux), else None."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return None


def _open(path: Path, root: Path | None, folders: dict[str, str] | None = None) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file `path` resolves to (inside `root` when given) and its stat.
    Raises `FileRefused` for a link out of the root or a non-regular file, `OSError` if it cannot
    be opened (e.g. gone). `folders`: see `Digests`."""
    real = _real(os.fspath(path), folders)
    real_root = None if root is None else (os.path.realpath(root) if folders is None
                                           else _real_folder(os.fspath(root), folders))
    if real_root is not None and not _inside(real, real_root):
        raise _outside_root()
    try:
        st = os.stat(real)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_loop(path) from None
        raise
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused("not_regular_file", _not_regular(st.st_mode))
    # O_NOFOLLOW: `real` has no links left, so a link here was swapped in after the check above.
    fd = os.open(real, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # swapped for a FIFO/device between stat and open
            raise FileRefused("not_regular_file", _not_regular(st.st_mode))
        if folders is not None and real_root is not None:
            # a folder resolved earlier in the scan may have become a link since: where the
            # kernel opened the file decides
            opened = _opened_path(fd)
            if opened is not None and not _inside(opened, real_root):
                raise _outside_root()
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _outside_root() -> FileRefused:
    return FileRefused("outside_root", "a link to a file outside the corpus root (only files inside the root "
                       "are read); copy the file into the root instead")


def _link_loop(path: Path) -> FileRefused:
    try:
        target = f" → {os.readlink(path)}"
    except OSError:
        target = ""
    return FileRefused("link_loop", f"a symbolic link ({Path(path).name}{target}) that leads back to itself (a link "
                       "loop), so it names no file; point it at a file, or remove it")


def _not_regular(mode: int) -> str:
    return f"{_kind(mode)}, not a regular file (only regular files are read)"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "a special file"


def _too_large(size: int, limit: int, setting: str) -> FileRefused:
    return FileRefused("too_large", f"{size} bytes is over the {limit}-byte limit ({setting})", setting=setting)


def _blocks(fd: int, st: os.stat_result, limit: int, setting: str) -> Iterator[bytes]:
    """The file's bytes in blocks, refusing (before reading) a file over `limit` and (while
    reading) one that grew past it."""
    if st.st_size > limit:
        raise _too_large(st.st_size, limit, setting)
    total = 0
    while True:
        block = os.read(fd, min(BLOCK, limit + 1 - total))
        if not block:
            return
        total += len(block)
        if total > limit:
            raise _too_large(total, limit, setting)
        yield block


def read_file(path: Path, root: Path | None, limit: int, setting: str = "max_file_bytes") -> bytes:
    """The bytes of a regular file inside `root`, read only if its size is within `limit`
    (`setting` names the limit in the refusal). Raises `FileRefused` or `OSError`."""
    fd, st = _open(path, root)
    try:
        return b"".join(_blocks(fd, st, limit, setting))
    finally:
        os.close(fd)


def read_text(path: Path, root: Path | None, limit: int) -> str:
    """`read_file` decoded as UTF-8 (a leading BOM dropped)."""
    return read_file(path, root, limit).decode("utf-8-sig")


def refused_digest(reason: str, path: Path | None) -> str:
    """The identity of a file that is not read: its reason and the size and mtime of the entry
    itself (a link's own, not its target's: /proc/self/... differs per process), so replacing or
    re-pointing it looks like a change, as new bytes would."""
    try:
        st = os.lstat(path) if path is not None else None
    except OSError:
        st = None
    size, mtime = (st.st_size, st.st_mtime_ns) if st is not None else (-1, -1)
    return hashlib.sha256(f"refused\0{reason}\0{size}\0{mtime}".encode()).hexdigest()


def file_digest(path: Path, root: Path | None, limit: int, setting: str = "max_file_bytes",
                folders: dict[str, str] | None = None) -> str:
    """SHA-256 of a file's bytes, hashed in blocks (what decides whether a file changed); for a
    file that is not read (a link out of the root, a FIFO, over `limit`), `refused_digest`. The
    digest equals what `load`-ing the same file records. Raises `OSError` if it cannot be opened.
    `folders`: see `Digests`."""
    try:
        fd, st = _open(path, root, folders)
    except FileRefused as exc:
        return refused_digest(exc.reason, path)
    try:
        digest = hashlib.sha256()
        for block in _blocks(fd, st, limit, setting):
            digest.update(block)
        return digest.hexdigest()
    except FileRefused as exc:
        return refused_digest(exc.reason, path)
    finally:
        os.close(fd)


@dataclass(frozen=True)
class ReadLimits:
    """Byte limits of a read: `max_file_bytes`, and `max_jsonl_bytes` for a JSONL corpus (many
    documents in one file, each record held to `max_file_bytes`)."""

    max_file_bytes: int
    max_jsonl_bytes: int

    @classmethod
    def of(cls, settings) -> ReadLimits:
        """The limits of a `rag_lib.config.Settings`."""
        return cls(settings.max_file_bytes, settings.limits.max_jsonl_bytes)

    def for_path(self, path: Path | str) -> tuple[int, str]:
        """(byte limit, the setting that holds it) for a file."""
        if is_jsonl_name(path):
            return self.max_jsonl_bytes, "limits.max_jsonl_bytes"
        return self.max_file_bytes, "max_file_bytes"

    def read(self, path: Path, root: Path | None) -> bytes:
        return read_file(path, root, *self.for_path(path))

    def digest(self, path: Path, root: Path | None) -> str:
        return file_digest(path, root, *self.for_path(path))


class Digests:
    """`ReadLimits.digest` for the many files of one scan (the corpus sensor's first tick hashes
    every file): each root and folder is resolved once instead of once per file (`os.path.realpath`
    of the file and of its root took 60% of the hashing). A folder that becomes a link during the
    scan cannot lead a read out of the root: the opened descriptor's own path is checked too. Use
    one per scan: the next one resolves again."""

    def __init__(self, limits: ReadLimits):
        self.limits = limits
        self._folders: dict[str, str] = {}

    def __call__(self, path: Path, root: Path | None) -> str:
        return file_digest(path, root, *self.limits.for_path(path), folders=self._folders)
