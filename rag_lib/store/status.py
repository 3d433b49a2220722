"""SQL for status reports, recorded failures, and what explains a search that found nothing."""

from __future__ import annotations

import dataclasses
from typing import Any

from psycopg import sql

from rag_lib.models import SearchFilters
from rag_lib.store.documents import _dicts
from rag_lib.store.vectors import _filter_sql

# The filters an empty search's explanation tests one at a time (the dates as one range)
FILTER_FIELDS = {"doc_type": ("doc_type",), "ticker": ("ticker",), "dates": ("date_from", "date_to"),
                 "path": ("path",), "section": ("section",), "section_contains": ("section_contains",),
                 "formats": ("formats",), "tags": ("tags",)}


FAILURE_SCOPE = "%(c)s::text IS NULL OR f.collection = %(c)s OR f.collection IS NULL"
# A failure is current unless it was one file's (its collection and partition known) and that file
# fails in no stage any more: fixed and ingested again, or deleted (its stage rows are gone). The
# partition is the file's path (`rag ingest`) or its Dagster key, `<root name>/<path>`.
STILL_FAILING = """f.collection IS NULL OR f.partition IS NULL OR EXISTS (
    SELECT 1 FROM rag_stage_outputs s WHERE s.collection = f.collection
       AND s.payload->>'status' IN ('failed', 'upstream_failed')
       AND (s.path = f.partition OR right(f.partition, length(s.path) + 1) = '/' || s.path))"""

# A skipped file's last good documents stay live (a skip never deletes): held by a raw_documents row
# that skipped the file's current bytes (malformed, over a limit; a JSONL file: every record), by a
# chunks row of those bytes that skipped the whole file, or, for one document, by such a row's
# `skipped` entry (over limits.max_chunks_per_document while its file's other documents publish).
# A document belongs to its file as `file_of` says: `<file>.jsonl#<_id>` is in `<file>.jsonl`.
HELD_FILES = """
WITH files AS (
    SELECT r.collection, r.path, r.payload->>'status' AS raw_status, r.payload->>'skip_reason' AS raw_reason,
           r.payload->'meta'->>'skip_detail' AS raw_detail, c.payload AS chunks
      FROM rag_stage_outputs r
      LEFT JOIN rag_stage_outputs c ON c.collection = r.collection AND c.path = r.path AND c.stage = %(chunks)s
           AND c.content_hash IS NOT DISTINCT FROM r.content_hash
     WHERE r.stage = %(raw)s AND (%(c)s::text IS NULL OR r.collection = %(c)s)
       AND (r.payload->>'status' = 'skipped' OR c.payload->>'status' = 'skipped'
            OR jsonb_array_length(coalesce(c.payload->'skipped', '[]')) > 0)
), held AS (
    SELECT collection, path, coalesce(raw_reason, chunks->>'skip_reason') AS reason,
           coalesce(raw_detail, chunks->>'skip_detail', '') AS detail, NULL::text AS doc
      FROM files WHERE raw_status = 'skipped' OR chunks->>'status' = 'skipped'
    UNION ALL
    SELECT f.collection, f.path, s->>'reason', coalesce(s->>'detail', ''), s->>'path'
      FROM files f CROSS JOIN LATERAL jsonb_array_elements(f.chunks->'skipped') s
     WHERE f.raw_status = 'ok' AND f.chunks->>'status' = 'ok'
), served AS (
    SELECT collection, path, CASE WHEN strpos(lower(path), '.jsonl#') > 0
                                  THEN left(path, strpos(lower(path), '.jsonl#') + 5) ELSE path END AS file
      FROM rag_documents WHERE %(c)s::text IS NULL OR collection = %(c)s
)
SELECT h.collection, h.path, h.reason, h.detail, count(*) AS documents,
       (array_agg(d.path ORDER BY d.path))[1:%(shown)s::int] AS examples, coalesce(h.doc, h.path) AS target
  FROM held h JOIN served d ON d.collection = h.collection AND d.file = h.path AND (h.doc IS NULL OR d.path = h.doc)
 GROUP BY h.collection, h.path, h.reason, h.detail, h.doc
 ORDER BY h.collection, h.path, h.doc"""


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
                f"SELECT source, run_id, partition, message, failed_at, collection FROM rag_failures f"
                f" WHERE ({FAILURE_SCOPE}) AND ({STILL_FAILING}) ORDER BY failed_at DESC LIMIT 10", params))
            fixed = conn.execute(
                f"SELECT count(*) FROM rag_failures f WHERE ({FAILURE_SCOPE}) AND NOT ({STILL_FAILING})",
                params).fetchone()[0]
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
            "failures_fixed": fixed,
            "cache_entries": cache,
            "embedding_usage": self.usage_summary() if hasattr(self, "usage_summary") else None,
        }

    def held_files(self, collection: str | None, raw_stage: str, chunks_stage: str,
                   shown: int = 5) -> list[dict[str, Any]]:
        """Files whose newest content was skipped while documents of an earlier version of theirs are
        still served: collection, path (the file), reason, detail, documents (how many are served),
        examples (the first `shown` of their paths), target (what `rag delete` takes: the file, or the
        one document the chunks stage skipped). See HELD_FILES."""
        with self.db.connection() as conn:
            return _dicts(conn.execute(HELD_FILES, {"c": collection, "raw": raw_stage, "chunks": chunks_stage,
                                                    "shown": shown}))

    def chunk_total(self, collection: str) -> int:
        """Chunks of the collection's documents (what `status_counts` reports as `chunks`), in one
        query: for reporting how many chunks a search ran over."""
        with self.db.reading() as conn:
            row = conn.execute("SELECT coalesce(sum(chunk_count), 0) FROM rag_documents WHERE collection = %s",
                               (collection,)).fetchone()
        return int(row[0])

    def ping(self) -> bool:
        """One round trip to the database."""
        with self.db.connection() as conn:
            return conn.execute("SELECT 1").fetchone()[0] == 1

    def record_failure(self, source: str, message: str, run_id: str | None = None, partition: str | None = None,
                       collection: str | None = None) -> None:
        """A failure for `rag status` (of `collection` when it is one file's; None: a whole run's)."""
        with self.db.connection() as conn:
            conn.execute(
                "INSERT INTO rag_failures (source, run_id, partition, message, collection) VALUES (%s,%s,%s,%s,%s)",
                (source, run_id, partition, message, collection),
            )

    def empty_search_facts(self, filters: SearchFilters) -> dict[str, Any]:
        """What explains a search of `filters` that found nothing: the documents of its collection
        and of every collection; which of its filters (FILTER_FIELDS) alone match no chunk of the
        collection; and, for those, what the collection holds instead: its document types (with
        counts), tickers, dated range, or path prefixes as deep as the path filter. Read only when a
        search is empty, and only what its note names."""
        collection = filters.collection
        alone = {name: dataclasses.replace(SearchFilters(collection=collection),
                                           **{f: getattr(filters, f) for f in fields})
                 for name, fields in FILTER_FIELDS.items() if any(getattr(filters, f) for f in fields)}
        depth = len([p for p in (filters.path or "").split("/") if p])
        with self.db.connection() as conn:
            collections = _dicts(conn.execute(
                "SELECT collection, count(*) AS documents FROM rag_documents GROUP BY 1 ORDER BY 1"))
            documents = next((c["documents"] for c in collections if c["collection"] == collection), 0)
            matched: dict[str, bool] = {}
            if alone and documents:  # an empty collection's note names no filter
                parts, params = [], []
                for flt in alone.values():
                    where, args = _filter_sql(flt)
                    parts.append(sql.SQL("EXISTS (SELECT 1 FROM rag_chunks c WHERE {})").format(where))
                    params.extend(args)
                row = conn.execute(sql.SQL("SELECT ") + sql.SQL(", ").join(parts), params).fetchone()
                matched = dict(zip(alone, row))
            unmatched = [name for name, found in matched.items() if not found]
            types = dict(conn.execute(
                "SELECT doc_type, count(*) FROM rag_documents WHERE collection = %s GROUP BY 1 ORDER BY 1",
                (collection,)).fetchall()) if "doc_type" in unmatched else {}
            tickers = [r[0] for r in conn.execute(
                "SELECT DISTINCT ticker FROM rag_documents WHERE collection = %s AND ticker IS NOT NULL ORDER BY 1",
                (collection,))] if "ticker" in unmatched else []
            dated = conn.execute("SELECT min(doc_date), max(doc_date) FROM rag_documents WHERE collection = %s",
                                 (collection,)).fetchone() if "dates" in unmatched else (None, None)
            prefixes = [r[0] for r in conn.execute(
                "SELECT DISTINCT array_to_string((string_to_array(path, '/'))[1:%s], '/') FROM rag_documents"
                " WHERE collection = %s ORDER BY 1", (depth, collection))] if "path" in unmatched and depth else []
        return {"collection": collection, "documents": documents, "collections": collections,
                "unmatched": unmatched, "filters": list(alone),
                "doc_types": types, "tickers": tickers, "dated": (dated[0], dated[1]), "path_prefixes": prefixes}
