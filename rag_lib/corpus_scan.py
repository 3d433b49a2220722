"""The file scan behind the corpus sensor (not Dagster-specific): walk a folder, and compare a
tree with the previous scan by size, mtime and content hash. Partition keys and the partition
map live in `pipelines/partitions.py`."""

from __future__ import annotations

import base64
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rag_lib.corpus_files import walk
from rag_lib.models import SourceFile

FileState = tuple[int, int, str]  # size, mtime_ns, content hash prefix


@dataclass(frozen=True)
class FileTarget(SourceFile):
    """One file under a root, named by `key` (its partition key in the pipeline)."""

    key: str


def walk_files(root: Path) -> dict[str, os.stat_result]:
    """POSIX path relative to `root` → stat of every file under it (see `corpus_files.walk`)."""
    return {entry.rel: entry.stat for entry in walk(root)}


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


def scan(files: dict[str, os.stat_result], previous: dict[str, FileState],
         digest: Callable[[str], str]) -> ScanResult:
    """Compare `files` (key → stat) with `previous`: a file is hashed (`digest(key)`:
    bounded and confined, see `corpus_files.file_digest`) only when size or mtime moved, and counts
    as changed only when its hash differs (a touch is no change)."""
    result = ScanResult()
    for key, st in files.items():
        old = previous.get(key)
        if old is not None and old[0] == st.st_size and old[1] == st.st_mtime_ns:
            result.state[key] = old
            continue
        try:
            value = digest(key)[:16]
        except OSError:
            continue
        result.state[key] = (st.st_size, st.st_mtime_ns, value)
        if old is None:
            result.new.append(key)
            result.hashes[key] = value
        elif old[2] != value:
            result.changed.append(key)
            result.hashes[key] = value
    result.deleted = [k for k in previous if k not in result.state]
    return result


def encode_state(state: dict[str, FileState], tick: int = 0) -> str:
    """Compact cursor text (zlib-compressed JSON, base64): the files' states and `tick`, how many
    scans found changes (a file restored to bytes seen before is a new change: see `decode_state`)."""
    raw = json.dumps({"tick": tick, "files": state}, separators=(",", ":")).encode()
    return base64.b64encode(zlib.compress(raw, 6)).decode()


def decode_state(cursor: str | None) -> tuple[dict[str, FileState], int]:
    """(files' states, tick) of a cursor; a cursor written before the tick was kept counts as tick 0."""
    if not cursor:
        return {}, 0
    data = json.loads(zlib.decompress(base64.b64decode(cursor)))
    files, tick = (data["files"], int(data["tick"])) if set(data) == {"tick", "files"} else (data, 0)
    return {k: (int(v[0]), int(v[1]), str(v[2])) for k, v in files.items()}, tick
