"""Whole-schema operations: drop and recreate every table (`rag reset`), and index statistics."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from rag_lib.store.connection import apply_migrations
from rag_lib.store.documents import _dicts


class SchemaStore:
    """Mixin: needs `self.db` (Connections), `self.settings` and `self.held_vectors`."""

    def recreate_schema(self) -> list[str]:
        """Drop every `rag_*` table and re-apply the migrations; returns the migrations applied."""
        with self.db.connection() as conn:
            conn.autocommit = True
            try:
                tables = [r[0] for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE 'rag\\_%'")]
                with conn.transaction():
                    for name in tables:
                        conn.execute(sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(name)))
                applied = apply_migrations(conn)
            finally:
                conn.autocommit = False
        self.held_vectors.recheck()
        return applied

    def index_stats(self) -> dict[str, Any]:
        """Sizes (MB) of the serving tables and their indexes, and each HNSW index's parameters."""
        with self.db.connection() as conn:
            total = conn.execute(
                """SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0), coalesce(sum(pg_indexes_size(c.oid)), 0)
                   FROM pg_class c WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
                     AND c.relname LIKE 'rag\\_%'""").fetchone()
            hnsw = _dicts(conn.execute(
                """SELECT i.relname AS index, pg_relation_size(i.oid) AS size_bytes, i.reloptions AS options,
                          b.m, b.ef_construction, b.rows_indexed, b.build_seconds, b.built_at, b.space
                   FROM pg_class i JOIN pg_am am ON am.oid = i.relam
                   LEFT JOIN LATERAL (SELECT * FROM rag_index_builds r WHERE r.index_name = i.relname
                                      ORDER BY r.id DESC LIMIT 1) b ON true
                   WHERE am.amname = 'hnsw' AND i.relnamespace = current_schema()::regnamespace ORDER BY 1"""))
            vectors = conn.execute("SELECT count(*) FROM rag_chunk_vectors").fetchone()[0]
            active = conn.execute("SELECT space FROM rag_spaces WHERE status = 'active'").fetchone()
        ef_search = self.ef_search(active[0]) if active else self.settings.search.ef_search or None
        return {
            "index_size_mb": round(float(total[1]) / 2**20, 3),
            "total_size_mb": round(float(total[0]) / 2**20, 3),
            "vector_rows": vectors,
            "hnsw": [{"index": h["index"], "space": h["space"], "size_mb": round(float(h["size_bytes"]) / 2**20, 3),
                      "m": h["m"], "ef_construction": h["ef_construction"], "rows_indexed": h["rows_indexed"],
                      "build_seconds": h["build_seconds"],
                      "built_at": h["built_at"].isoformat() if h["built_at"] else None} for h in hnsw],
            # what searches of the active space use (search.ef_search 0: scaled with its index)
            "ef_search": ef_search,
        }

    def documents_with_fingerprint(self, fingerprint: str) -> list[dict[str, Any]]:
        """(collection, path, source_path) of documents published under `fingerprint`."""
        with self.db.connection() as conn:
            return _dicts(conn.execute(
                "SELECT collection, path, source_path FROM rag_documents WHERE fingerprint = %s ORDER BY 1, 2",
                (fingerprint,)))
