"""SQL for ticker profiles (entity linking): the corpus facts a profile is built from, and the
stored profile vectors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rag_lib.store.connection import as_array

# Node kinds that say what a company is or does (not how one trades it).
PROFILE_KINDS = ("sector", "industry", "theme", "catalyst", "metric", "customer", "event", "product", "segment",
                 "research")
MAX_SECTIONS = 300  # sections per ticker read for its distinctive words (newest documents first)


class ProfileStore:
    """Mixin: needs `self.db` (Connections)."""

    def ticker_profile_facts(self, collection: str, company_sections: Sequence[str],
                             skip_sections: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
        """Per ticker some document is about: its documents (`paths`, `sources` = path:hash), names
        (graph aliases other than the symbol), graph neighbours by kind, company-section texts, and
        section texts for its distinctive words (sections named in `skip_sections` left out)."""
        out: dict[str, dict[str, Any]] = {}
        with self.db.connection() as conn:
            for ticker, path, digest in conn.execute(
                    "SELECT ticker, path, content_hash FROM rag_documents WHERE collection = %s AND ticker IS NOT NULL"
                    " ORDER BY ticker, path", (collection,)).fetchall():
                f = out.setdefault(ticker, {"paths": [], "sources": [], "names": [], "neighbours": {},
                                            "company": [], "texts": []})
                f["paths"].append(path)
                f["sources"].append(f"{path}:{digest}")
            if not out:
                return out
            for key, spelling in conn.execute(
                    """SELECT key, spelling FROM rag_graph_aliases WHERE collection = %s AND key = ANY(%s)
                       GROUP BY key, spelling ORDER BY key, length(spelling) DESC, spelling""",
                    (collection, [f"ticker:{t}" for t in out])).fetchall():
                ticker = key[7:]
                if spelling.strip().lstrip("$").upper() != ticker:
                    out[ticker]["names"].append(spelling)
            for ticker, kind, label in conn.execute(
                    """WITH t AS (SELECT ticker, 'doc:' || path AS dkey FROM rag_documents
                                  WHERE collection = %(c)s AND ticker IS NOT NULL),
                       x AS (SELECT substr(e.src, 8) AS ticker, e.dst AS other FROM rag_graph_edges e
                             WHERE e.collection = %(c)s AND e.src LIKE 'ticker:%%'
                             UNION ALL
                             SELECT substr(e.dst, 8), e.src FROM rag_graph_edges e
                             WHERE e.collection = %(c)s AND e.dst LIKE 'ticker:%%'
                             UNION ALL
                             SELECT t.ticker, e.dst FROM t JOIN rag_graph_edges e
                               ON e.collection = %(c)s AND e.src = t.dkey AND e.predicate = 'has_entity')
                       SELECT x.ticker, n.kind, n.label FROM x JOIN rag_graph_nodes n
                         ON n.collection = %(c)s AND n.key = x.other
                       WHERE n.kind = ANY(%(k)s) AND x.ticker = ANY(%(t)s)
                       GROUP BY 1, 2, 3 ORDER BY 1, 2, count(*) DESC, 3""",
                    {"c": collection, "k": list(PROFILE_KINDS), "t": list(out)}).fetchall():
                out[ticker]["neighbours"].setdefault(kind, []).append(label)
            for ticker, name, text in conn.execute(
                    """SELECT ticker, name, text FROM (
                           SELECT d.ticker, s.name, s.text, row_number() OVER (
                               PARTITION BY d.ticker ORDER BY d.doc_date DESC NULLS LAST, d.path, s.ordinal) AS r
                           FROM rag_sections s JOIN rag_documents d ON d.collection = s.collection AND d.path = s.path
                           WHERE s.collection = %s AND d.ticker IS NOT NULL AND NOT s.is_empty
                             AND s.name <> ALL(%s)) x
                       WHERE r <= %s ORDER BY ticker, r""", (collection, list(skip_sections), MAX_SECTIONS)).fetchall():
                f = out[ticker]
                f["texts"].append(text)
                if name in company_sections and text not in f["company"] and len(f["company"]) < 3:
                    f["company"].append(text)
        return out

    def profile_collections(self, space: str) -> list[str]:
        """The collections holding ticker profiles in `space`."""
        with self.db.connection() as conn:
            rows = conn.execute("SELECT DISTINCT collection FROM rag_ticker_profiles WHERE space = %s ORDER BY 1",
                                (space,)).fetchall()
        return [c for (c,) in rows]

    def ticker_profile_hashes(self, collection: str, space: str) -> dict[str, str]:
        with self.db.connection() as conn:
            rows = conn.execute("SELECT ticker, source_hash FROM rag_ticker_profiles WHERE collection = %s"
                                " AND space = %s", (collection, space)).fetchall()
        return dict(rows)

    def chunk_vector_sample(self, collection: str, space: str, n: int, skip_sections: Sequence[str] = ()) -> np.ndarray:
        """About `n` of the collection's chunk vectors in `space` (a stable pseudo-random sample), as
        rows; chunks of sections named in `skip_sections` left out."""
        with self.db.connection() as conn:
            rows = conn.execute(
                """SELECT v.embedding FROM rag_chunk_vectors v JOIN rag_chunks c ON c.chunk_id = v.chunk_id
                   WHERE c.collection = %s AND v.space = %s AND c.section <> ALL(%s)
                   ORDER BY md5(c.chunk_id) LIMIT %s""",
                (collection, space, list(skip_sections), n)).fetchall()
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([as_array(v) for (v,) in rows])

    def write_ticker_profiles(self, collection: str, space: str, dimensions: int,
                              rows: Sequence[tuple[str, str, str, list[str], np.ndarray]],
                              keep: Sequence[str], hubness: dict[str, float]) -> list[str]:
        """Upsert `rows` (ticker, text, source hash, source paths, vector), set every kept profile's
        `hubness`, and delete the profiles of tickers not in `keep`; returns the tickers removed. One
        transaction."""
        with self.db.connection() as conn, conn.transaction():
            with conn.cursor() as cur:
                cur.executemany(
                    """INSERT INTO rag_ticker_profiles (collection, ticker, space, dimensions, text, source_hash,
                                                        sources, embedding)
                       VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                       ON CONFLICT (collection, ticker, space) DO UPDATE SET text = EXCLUDED.text,
                           source_hash = EXCLUDED.source_hash, sources = EXCLUDED.sources,
                           embedding = EXCLUDED.embedding, dimensions = EXCLUDED.dimensions, updated_at = now()""",
                    [(collection, t, space, dimensions, text, h, paths, vec) for t, text, h, paths, vec in rows])
                cur.executemany(
                    "UPDATE rag_ticker_profiles SET hubness = %s WHERE collection = %s AND ticker = %s AND space = %s",
                    [(float(v), collection, t, space) for t, v in hubness.items()])
            removed = conn.execute(
                "DELETE FROM rag_ticker_profiles WHERE collection = %s AND NOT (ticker = ANY(%s)) RETURNING ticker",
                (collection, list(keep))).fetchall()
        return sorted(r[0] for r in removed)

    def ticker_profiles(self, collection: str) -> list[dict[str, Any]]:
        """Stored profiles (text, space, sources, when), for people and tests."""
        with self.db.connection() as conn:
            cur = conn.execute(
                "SELECT ticker, space, text, source_hash, sources, updated_at FROM rag_ticker_profiles"
                " WHERE collection = %s ORDER BY ticker, space", (collection,))
            cols = [d.name for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]

    def ticker_profile_vectors(self, collection: str | None, space: str) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(tickers, unit-length vectors as rows, hubness) of `collection`'s profiles in `space`."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT ticker, embedding, hubness FROM rag_ticker_profiles WHERE space = %s"
                " AND (%s::text IS NULL OR collection = %s) ORDER BY ticker", (space, collection, collection)).fetchall()
        if not rows:
            return [], np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.float32)
        matrix = np.stack([as_array(v) for _, v, _ in rows])
        matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        return [t for t, _, _ in rows], matrix, np.array([h for _, _, h in rows], dtype=np.float32)
