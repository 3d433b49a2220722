"""Watched corpus roots as partition keys, and the change scan behind the corpus sensor.

A partition key is the file's path relative to its root (prefixed with `<collection>/` when
several roots are watched). `...` (Dagster's range delimiter), `|` (its multi-partition
delimiter) and `%` are percent-encoded so every key round-trips."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from rag_lib.config import Settings
from rag_lib.documents import IGNORED_DIRS
from rag_lib.errors import ConfigError, ValidationError
from rag_lib.models import CorpusRoot

FileState = tuple[int, int, str]  # size, mtime_ns, content hash prefix


@dataclass(frozen=True)
class FileTarget:
    """One partition: a file under a root."""

    key: str
    collection: str
    root: Path
    rel: str

    @property
    def path(self) -> Path:
        return self.root / self.rel


def encode_key(text: str) -> str:
    text = text.replace("%", "%25").replace("|", "%7C")
    return re.sub(r"\.{3,}", lambda m: "%2E" * len(m.group(0)), text)


def decode_key(key: str) -> str:
    return unquote(key)


def parse_roots(specs: list[str], default_collection: str) -> list[CorpusRoot]:
    """`path` or `collection=path` strings → roots (absolute paths)."""
    roots = []
    for spec in specs:
        collection, sep, path = spec.partition("=")
        if not sep:
            collection, path = default_collection, spec
        roots.append(CorpusRoot(Path(path).expanduser().resolve(), collection))
    return roots


def configured_roots(settings: Settings) -> list[CorpusRoot]:
    return [CorpusRoot(Path(r.path).expanduser().resolve(), r.collection) for r in settings.pipeline.roots]


class PartitionMap:
    """Maps partition keys to files and back for a fixed list of roots."""

    def __init__(self, roots: list[CorpusRoot]):
        self.roots = roots
        self.multi = len(roots) > 1
        if self.multi and len({r.collection for r in roots}) != len(roots):
            raise ConfigError("with several corpus roots, give each its own collection (keys are <collection>/<path>)")
        self.by_collection = {r.collection: r for r in roots}

    def key(self, root: CorpusRoot, rel: str) -> str:
        return encode_key(f"{root.collection}/{rel}" if self.multi else rel)

    def target(self, key: str) -> FileTarget:
        text = decode_key(key)
        if self.multi:
            collection, _, rel = text.partition("/")
            root = self.by_collection.get(collection)
        else:
            root, rel = (self.roots[0] if self.roots else None), text
        if root is None:
            raise ValidationError(f"partition '{key}' belongs to no configured corpus root")
        return FileTarget(key, root.collection, root.path, rel)

    def target_for_file(self, path: Path) -> FileTarget:
        path = path.resolve()
        for root in self.roots:
            if path.is_relative_to(root.path):
                rel = path.relative_to(root.path).as_posix()
                return FileTarget(self.key(root, rel), root.collection, root.path, rel)
        raise ValidationError(f"{path} is under none of the corpus roots")

    def walk(self) -> dict[str, os.stat_result]:
        """key → stat of every file under every root (sorted by key; VCS/cache folders ignored)."""
        found: dict[str, os.stat_result] = {}
        for root in self.roots:
            if not root.path.is_dir():
                continue
            for dirpath, dirnames, filenames in os.walk(root.path):
                dirnames[:] = sorted(d for d in dirnames if d not in IGNORED_DIRS)
                for name in filenames:
                    full = os.path.join(dirpath, name)
                    try:
                        st = os.stat(full)
                    except OSError:
                        continue  # vanished between listing and stat: next tick sees it gone
                    rel = os.path.relpath(full, root.path).replace(os.sep, "/")
                    found[self.key(root, rel)] = st
        return dict(sorted(found.items()))


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


@dataclass
class ScanResult:
    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    state: dict[str, FileState] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)  # key → hash prefix of new/changed files

    @property
    def empty(self) -> bool:
        return not (self.new or self.changed or self.deleted)


def scan(pmap: PartitionMap, previous: dict[str, FileState]) -> ScanResult:
    """Compare the tree with `previous`: a file is read and hashed only when size or mtime moved,
    and counts as changed only when its hash differs (a touched file is not a change)."""
    result = ScanResult()
    for key, st in pmap.walk().items():
        old = previous.get(key)
        if old is not None and old[0] == st.st_size and old[1] == st.st_mtime_ns:
            result.state[key] = old
            continue
        try:
            digest = _file_hash(pmap.target(key).path)
        except OSError:
            continue
        result.state[key] = (st.st_size, st.st_mtime_ns, digest)
        if old is None:
            result.new.append(key)
            result.hashes[key] = digest
        elif old[2] != digest:
            result.changed.append(key)
            result.hashes[key] = digest
    result.deleted = [k for k in previous if k not in result.state]
    return result


def encode_state(state: dict[str, FileState]) -> str:
    """Compact cursor text: zlib-compressed JSON, base64."""
    raw = json.dumps(state, separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw, 6)).decode()


def decode_state(cursor: str | None) -> dict[str, FileState]:
    if not cursor:
        return {}
    data = json.loads(zlib.decompress(base64.b64decode(cursor)))
    return {k: (int(v[0]), int(v[1]), str(v[2])) for k, v in data.items()}
