"""SQL for status reports and recorded failures."""

from __future__ import annotations

from typing import Any

from rag_lib.store.documents import _dicts


class StatusStore:
    """Mixin: needs `self.db` (Connections)."""

    def status_counts(self, collection: str | None = None) -> dict[str, Any]:
        params = {"c": collection}
        scope = "(%(c)s::text IS NULL OR collection = %(c)s)"
        with self.db.connection() as conn:
            docs = conn.execute(
                f"SELECT count(*), coalesce(sum(chunk_count),0), coalesce(sum(token_count),0), max(ingested_at)"
                f" FROM rag_documents WHERE {scope}", params).fetchone()
            by_type = dict(conn.execute(
                f"SELECT doc_type, count(*) FROM rag_documents WHERE {scope} GROUP BY 1 ORDER BY 1", params).fetchall())
            collections = _dicts(conn.execute(
                "SELECT collection, count(*) AS documents, sum(chunk_count) AS chunks FROM rag_documents"
                " GROUP BY 1 ORDER BY 1"))
            vectors = _dicts(conn.execute(
                """SELECT v.space, s.status, count(*) AS vectors FROM rag_chunk_vectors v
                    JOIN rag_spaces s USING (space) JOIN rag_chunks c USING (chunk_id)
                    WHERE (%(c)s::text IS NULL OR c.collection = %(c)s) GROUP BY 1, 2 ORDER BY 1""", params))
            skipped = _dicts(conn.execute(
                f"SELECT path, reason, detail FROM rag_skipped WHERE {scope} ORDER BY path", params))
            failures = _dicts(conn.execute(
                "SELECT source, run_id, partition, message, failed_at FROM rag_failures"
                " ORDER BY failed_at DESC LIMIT 10"))
            cache = conn.execute("SELECT count(*) FROM rag_embedding_cache").fetchone()[0]
        return {
            "documents": docs[0],
            "chunks": int(docs[1]),
            "tokens": int(docs[2]),
            "last_ingest": docs[3].isoformat() if docs[3] else None,
            "by_type": by_type,
            "collections": collections,
            "vectors": vectors,
            "skipped": skipped,
            "failures": failures,
            "cache_entries": cache,
            "embedding_usage": self.usage_summary() if hasattr(self, "usage_summary") else None,
        }

    def ping(self) -> bool:
        """One round trip to the database."""
        with self.db.connection() as conn:
            return conn.execute("SELECT 1").fetchone()[0] == 1

    def record_failure(self, source: str, message: str, run_id: str | None = None, partition: str | None = None) -> None:
        with self.db.connection() as conn:
            conn.execute(
                "INSERT INTO rag_failures (source, run_id, partition, message) VALUES (%s,%s,%s,%s)",
                (source, run_id, partition, message),
            )
