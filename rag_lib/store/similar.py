"""SQL lookups for "more like this" and context assembly: stored vectors, chunk positions and text."""

from __future__ import annotations

from typing import Any

import numpy as np

from rag_lib.errors import AmbiguousReferenceError, NotFoundError, did_you_mean
from rag_lib.store.connection import as_array


class SimilarStore:
    """Mixin: needs `self.db` (Connections)."""

    def reference_vectors(self, collection: str, ref: str, space: str) -> tuple[dict[str, Any], np.ndarray]:
        """Resolve `ref` (unit id, chunk id, document path or id) to its document and chunk vectors."""
        lookups = (
            ("unit", "c.unit_id = %s"),
            ("chunk", "c.chunk_id = %s"),
            ("document", "c.path = %s"),
            ("document", "c.doc_id = %s"),
        )
        with self.db.connection() as conn:
            for kind, cond in lookups:
                rows = conn.execute(
                    f"""SELECT c.path, c.doc_id, v.embedding FROM rag_chunks c
                        JOIN rag_chunk_vectors v ON v.chunk_id = c.chunk_id AND v.space = %s
                        WHERE c.collection = %s AND {cond} ORDER BY c.ordinal""",
                    (space, collection, ref),
                ).fetchall()
                if rows and kind == "document" and len({r[0] for r in rows}) > 1:  # an id several documents carry
                    from rag_lib.store.documents import ambiguous_id_message

                    raise AmbiguousReferenceError(ambiguous_id_message(collection, ref, sorted({r[0] for r in rows})))
                if rows:
                    vectors = np.stack([as_array(r[2]) for r in rows])
                    return {"kind": kind, "path": rows[0][0], "doc_id": rows[0][1]}, vectors
        raise NotFoundError(f"nothing named '{ref}' (unit id, chunk id, path or document id) in collection "
                            f"'{collection}'{did_you_mean(self.paths_like(collection, ref.split('#')[0]))}")

    def chunk_positions(self, chunk_ids: list[str]) -> dict[str, tuple[int, int]]:
        """chunk id → (ordinal in its document, char start): reading order for context assembly."""
        if not chunk_ids:
            return {}
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT chunk_id, ordinal, char_start FROM rag_chunks WHERE chunk_id = ANY(%s)", (list(chunk_ids),)
            ).fetchall()
        return {r[0]: (r[1], r[2]) for r in rows}

    def chunk_vectors(self, collection: str, space: str, limit: int | None = None) -> list[tuple[dict[str, Any], np.ndarray]]:
        """(chunk row, vector) of a collection's chunks in the space, in document order (benchmarks, checks)."""
        with self.db.connection() as conn:
            cur = conn.execute(
                """SELECT c.chunk_id, c.path, c.doc_id, c.section, c.text, c.doc_type, c.ticker, c.doc_date, v.embedding
                   FROM rag_chunks c JOIN rag_chunk_vectors v ON v.chunk_id = c.chunk_id AND v.space = %s
                   WHERE c.collection = %s ORDER BY c.path, c.ordinal LIMIT %s""",
                (space, collection, limit),
            )
            cols = [d.name for d in cur.description]
            rows = cur.fetchall()
        out = []
        for r in rows:
            row = dict(zip(cols, r))
            vec = row.pop("embedding")
            out.append((row, as_array(vec)))
        return out
