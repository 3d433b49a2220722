"""SQL for the orchestrated pipeline's per-file state: staged vectors, a file's stage rows, and
index maintenance. Stage payloads themselves live in `rag_stage_outputs` (see status.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from psycopg import sql

from rag_lib.store.vectors import index_name


class StageStore:
    """Mixin: needs `self.db` (Connections)."""

    def save_stage_vectors(
        self, collection: str, path: str, rows: Sequence[tuple[str, str]], vectors: np.ndarray,
        model: str, dimensions: int,
    ) -> None:
        """Replace a file's staged vectors; `rows` are (chunk_id, content_hash) in vector order."""
        with self.db.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("DELETE FROM rag_stage_vectors WHERE collection = %s AND path = %s", (collection, path))
            with cur.copy(
                "COPY rag_stage_vectors (collection, path, chunk_id, content_hash, model, dimensions, embedding)"
                " FROM STDIN"
            ) as copy:
                for (chunk_id, digest), vec in zip(rows, vectors):
                    copy.write_row((collection, path, chunk_id, digest, model, dimensions, vec))

    def load_stage_vectors(self, collection: str, path: str) -> dict[str, np.ndarray]:
        """chunk_id → staged vector of one file."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT chunk_id, embedding FROM rag_stage_vectors WHERE collection = %s AND path = %s",
                (collection, path),
            ).fetchall()
        return {cid: np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v, dtype=np.float32) for cid, v in rows}

    def stage_index(self, stage: str) -> dict[tuple[str, str], tuple[str | None, str | None, str | None]]:
        """(collection, path) → (content hash, status, fingerprint) of every file's output of one stage."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT collection, path, content_hash, payload->>'status', payload->>'fingerprint'"
                " FROM rag_stage_outputs WHERE stage = %s",
                (stage,),
            ).fetchall()
        return {(c, p): (h, s, f) for c, p, h, s, f in rows}

    def forget_file(self, collection: str, path: str, document_paths: Sequence[str]) -> list[str]:
        """Delete everything a file produced: its documents' rows, stage rows, staged vectors, skips."""
        deleted: list[str] = []
        for doc_path in dict.fromkeys([*document_paths, path]):
            deleted.extend(self.delete_document(collection, doc_path))
        with self.db.connection() as conn, conn.transaction():
            conn.execute("DELETE FROM rag_stage_outputs WHERE collection = %s AND path = %s", (collection, path))
            conn.execute("DELETE FROM rag_stage_vectors WHERE collection = %s AND path = %s", (collection, path))
            conn.execute(
                "DELETE FROM rag_skipped WHERE collection = %s AND (path = %s OR path LIKE %s)",
                (collection, path, path.replace("%", r"\%").replace("_", r"\_") + ":%"),
            )
        return sorted(set(deleted))

    def maintain_indexes(self, space: str | None) -> dict[str, Any]:
        """Weekly maintenance: REINDEX the space's HNSW index concurrently, then ANALYZE the tables."""
        done: dict[str, Any] = {"reindexed": None, "analyzed": []}
        with self.db.connection() as conn:
            conn.autocommit = True
            try:
                if space:
                    name = index_name(space)
                    if conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is not None:
                        conn.execute(sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(sql.Identifier(name)))
                        done["reindexed"] = name
                for table in ("rag_documents", "rag_chunks", "rag_chunk_vectors", "rag_embedding_cache"):
                    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
                    done["analyzed"].append(table)
            finally:
                conn.autocommit = False
        return done
