"""SQL for the corpus-roots registry (`rag_corpus_roots`): folders ingested or materialized,
each with its collection and a stable label that partition keys start with."""

from __future__ import annotations

import re
from pathlib import Path

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


class RootStore:
    """Mixin: needs `self.db` (Connections)."""

    def list_roots(self) -> list[CorpusRoot]:
        """Registered roots in registration order."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT path, collection, name FROM rag_corpus_roots ORDER BY added_at, name").fetchall()
        return [CorpusRoot(Path(p), c, n) for p, c, n in rows]

    def register_root(self, path: Path, collection: str, source: str = "ingest") -> CorpusRoot:
        """Register (path, collection) if new and return it with its label (idempotent)."""
        with self.db.connection() as conn:  # the common case (already registered) takes no lock
            row = conn.execute("SELECT name FROM rag_corpus_roots WHERE path = %s AND collection = %s",
                               (str(path), collection)).fetchone()
        if row:
            return CorpusRoot(path, collection, row[0])
        with self.db.connection() as conn, conn.transaction():
            # one writer at a time, so two processes never pick the same label
            conn.execute("LOCK TABLE rag_corpus_roots IN SHARE ROW EXCLUSIVE MODE")
            row = conn.execute("SELECT name FROM rag_corpus_roots WHERE path = %s AND collection = %s",
                               (str(path), collection)).fetchone()
            if row:
                return CorpusRoot(path, collection, row[0])
            taken = {r[0] for r in conn.execute("SELECT name FROM rag_corpus_roots").fetchall()}
            name = root_label(path, taken)
            conn.execute("INSERT INTO rag_corpus_roots (name, path, collection, source) VALUES (%s, %s, %s, %s)",
                         (name, str(path), collection, source))
        return CorpusRoot(path, collection, name)

    def unregister_root(self, path: Path, collection: str | None = None) -> list[CorpusRoot]:
        """Delete the registry rows of `path` (one collection or all); returns what was removed."""
        with self.db.connection() as conn, conn.transaction():
            rows = conn.execute(
                "DELETE FROM rag_corpus_roots WHERE path = %s AND (%s::text IS NULL OR collection = %s)"
                " RETURNING path, collection, name", (str(path), collection, collection)).fetchall()
        return [CorpusRoot(Path(p), c, n) for p, c, n in rows]
