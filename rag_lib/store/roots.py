"""SQL for the corpus-roots registry (`rag_corpus_roots`): folders ingested or materialized,
each with its collection and a stable label that partition keys start with."""

from __future__ import annotations

import re
from pathlib import Path

from rag_lib.errors import ValidationError
from rag_lib.models import CorpusRoot


def root_label(path: Path, taken: set[str]) -> str:
    """A short unique label for a root: its folder name made key-safe, `-2`, `-3`… on a clash."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", path.name).strip("-.") or "root"
    base = re.sub(r"\.{2,}", ".", base)  # never `...` (Dagster's range delimiter)
    label, n = base, 1
    while label in taken:
        n += 1
        label = f"{base}-{n}"
    return label


def refuse_nested_root(folder: Path, collection: str, roots: list[Path], allow_inside: bool = False) -> None:
    """A `ValidationError` when `folder` lies inside another of `roots` (the collection's; unless
    `allow_inside`) or holds one: each file would be a document twice, under two paths."""
    for root in roots:
        if root == folder:
            continue
        if folder.is_relative_to(root) and not allow_inside:
            raise ValidationError(
                f"{folder} is inside {root}, a corpus root of collection '{collection}': its files are "
                f"documents there already (as '{folder.relative_to(root).as_posix()}/…'); a root of its own "
                "would add each one again under another path. Use that root, or another collection")
        if root.is_relative_to(folder):
            raise ValidationError(
                f"{folder} holds {root}, a corpus root of collection '{collection}': its files are documents "
                f"of that root already; as a root of its own it would add each one again under a longer path. "
                f"Remove that root first (`rag roots remove {root}`, then delete its documents), or use "
                "another collection")


class RootStore:
    """Mixin: needs `self.db` (Connections)."""

    def list_roots(self) -> list[CorpusRoot]:
        """Registered roots in registration order."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT path, collection, name FROM rag_corpus_roots ORDER BY added_at, name").fetchall()
        return [CorpusRoot(Path(p), c, n) for p, c, n in rows]

    def register_root(self, path: Path, collection: str, source: str = "ingest") -> CorpusRoot:
        """Register (path, collection) if new and return it with its label (idempotent); a folder
        inside or holding another root of the collection raises `ValidationError`."""
        return self.claim_root(path, collection, source)[0]

    def claim_root(self, path: Path, collection: str, source: str = "ingest") -> tuple[CorpusRoot, bool]:
        """`register_root`, and whether this call registered it (False: it was registered already)."""
        with self.db.connection() as conn:  # the common case (already registered) takes no lock
            row = conn.execute("SELECT name FROM rag_corpus_roots WHERE path = %s AND collection = %s",
                               (str(path), collection)).fetchone()
        if row:
            return CorpusRoot(path, collection, row[0]), False
        with self.db.connection() as conn, conn.transaction():
            # one writer at a time, so two processes never pick the same label, and the nested-root
            # check sees every root registered before this one (two ingests, a root and its subfolder,
            # both checked before either registered and both went on)
            conn.execute("LOCK TABLE rag_corpus_roots IN SHARE ROW EXCLUSIVE MODE")
            rows = conn.execute("SELECT name, path, collection FROM rag_corpus_roots").fetchall()
            row = next((n for n, p, c in rows if p == str(path) and c == collection), None)
            if row:
                return CorpusRoot(path, collection, row), False
            refuse_nested_root(path, collection, [Path(p) for _, p, c in rows if c == collection])
            name = root_label(path, {n for n, _, _ in rows})
            conn.execute("INSERT INTO rag_corpus_roots (name, path, collection, source) VALUES (%s, %s, %s, %s)",
                         (name, str(path), collection, source))
        return CorpusRoot(path, collection, name), True

    def documents_under(self, root: CorpusRoot) -> int:
        """How many of the root's collection's documents were read from files under its folder."""
        with self.db.connection() as conn:
            return conn.execute("SELECT count(*) FROM rag_documents WHERE collection = %s AND starts_with(source_path, %s)",
                                (root.collection, str(root.path).rstrip("/") + "/")).fetchone()[0]

    def unregister_root(self, path: Path, collection: str | None = None) -> list[CorpusRoot]:
        """Delete the registry rows of `path` (one collection or all); returns what was removed."""
        with self.db.connection() as conn, conn.transaction():
            rows = conn.execute(
                "DELETE FROM rag_corpus_roots WHERE path = %s AND (%s::text IS NULL OR collection = %s)"
                " RETURNING path, collection, name", (str(path), collection, collection)).fetchall()
        return [CorpusRoot(Path(p), c, n) for p, c, n in rows]
