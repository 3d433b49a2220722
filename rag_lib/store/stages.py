"""SQL for the orchestrated pipeline's per-file state: each stage's stored output per file
(`rag_stage_outputs`), staged vectors (`rag_stage_vectors`), and index maintenance. Reads and writes
take many files at once: a run touches thousands of files, one query per stage, not per file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_lib.errors import DatabaseError, first_line, first_of
from rag_lib.log import get_logger
from rag_lib.store.connection import as_array, copy_rows, like_escape
from rag_lib.store.documents import _dicts
from rag_lib.store.vectors import index_name

log = get_logger(__name__)

# What searches read: their statistics decide the plans (refresh_statistics, maintain_indexes).
SERVING_TABLES = ("rag_documents", "rag_sections", "rag_chunks", "rag_chunk_vectors", "rag_graph_nodes",
                  "rag_graph_edges", "rag_graph_aliases")


FileIdent = tuple[str, str]  # (collection, path relative to its root)


class StageStore:
    """Mixin: needs `self.db` (Connections)."""

    def load_stage_outputs(self, stages: Sequence[str], files: Sequence[FileIdent],
                           heads: Sequence[str] = ()) -> dict[tuple[str, str, str], Any]:
        """(collection, path, stage) → stored payload, for the given stages of the given files. For
        the stages in `heads`, the payload without its `documents` (the section or chunk texts:
        most of its bytes, and not needed to tell whether a file is current)."""
        if not files or not stages:
            return {}
        with self.db.connection() as conn:
            rows = conn.execute(
                """SELECT o.collection, o.path, o.stage,
                          CASE WHEN o.stage = ANY(%s) THEN o.payload - 'documents' ELSE o.payload END
                   FROM rag_stage_outputs o
                   JOIN unnest(%s::text[], %s::text[]) AS f(collection, path) USING (collection, path)
                   WHERE o.stage = ANY(%s)""",
                (list(heads), [c for c, _ in files], [p for _, p in files], list(stages)),
            ).fetchall()
        return {(c, p, st): payload for c, p, st, payload in rows}

    def save_stage_outputs(self, rows: Sequence[tuple[str, str, str, Any, str | None]]) -> None:
        """Store many files' stage outputs: rows of (collection, path, stage, payload, content hash)."""
        if not rows:
            return
        # Rows in one order: concurrent runs over the same files lock them in the same order and
        # cannot deadlock.
        rows = sorted(rows, key=lambda r: (r[0], r[1], r[2]))
        with self.db.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO rag_stage_outputs (collection, path, stage, content_hash, payload)
                   VALUES (%s,%s,%s,%s,%s)
                   ON CONFLICT (collection, path, stage) DO UPDATE SET content_hash = EXCLUDED.content_hash,
                     payload = EXCLUDED.payload, updated_at = now()""",
                [(c, p, st, digest, Jsonb(payload)) for c, p, st, payload, digest in rows],
            )

    def load_stage(self, collection: str, path: str, stage: str) -> Any | None:
        """One stage's stored output for one file (None: never materialized)."""
        return self.load_stage_outputs([stage], [(collection, path)]).get((collection, path, stage))

    def save_staged_vectors(
        self, files: Sequence[tuple[str, str, Sequence[tuple[str, str]], np.ndarray]], model: str, dimensions: int,
    ) -> None:
        """Replace the staged vectors of many files in one transaction: (collection, path,
        [(chunk_id, content_hash)], vectors in that order) each. A database error is a
        `DatabaseError` naming the files, in one line (its detail goes to the debug log)."""
        if not files:
            return
        files = sorted(files, key=lambda f: (f[0], f[1]))
        try:
            self._stage_vectors(files, model, dimensions)
        except psycopg.Error as exc:
            log.debug("staging the vectors of %d files failed", len(files), exc_info=True)
            raise DatabaseError(f"{_files_named([f[1] for f in files])}: staging the vectors failed "
                                f"({type(exc).__name__}: {first_line(exc, 2000)}); nothing was staged and the "
                                "previous version stays live") from exc

    def _stage_vectors(self, files: Sequence[tuple[str, str, Sequence[tuple[str, str]], np.ndarray]], model: str,
                       dimensions: int) -> None:
        with self.db.connection() as conn, conn.transaction(), conn.cursor() as cur:
            # Two runs staging the same file would both delete nothing the other has not committed
            # and then collide on the primary key: one stager per file at a time (locks taken in
            # sorted order, released at commit).
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(k, 0)) FROM unnest(%s::text[]) AS k",
                        ([f"stage\x1f{f[0]}\x1f{f[1]}" for f in files],))
            cur.execute(
                """DELETE FROM rag_stage_vectors v USING unnest(%s::text[], %s::text[]) AS f(collection, path)
                   WHERE v.collection = f.collection AND v.path = f.path""",
                ([f[0] for f in files], [f[1] for f in files]),
            )
            copy_rows(cur, "rag_stage_vectors (collection, path, chunk_id, content_hash, model, dimensions, embedding)",
                      ["text", "text", "text", "text", "text", "integer", "vector"],
                      ((collection, path, chunk_id, digest, model, dimensions, vec)
                       for collection, path, rows, vectors in files for (chunk_id, digest), vec in zip(rows, vectors)))

    def load_staged_vectors(self, files: Sequence[FileIdent], model: str,
                            dimensions: int) -> dict[FileIdent, dict[str, np.ndarray]]:
        """(collection, path) → chunk_id → staged vector, for many files: only the vectors `model` at
        `dimensions` staged (another model's, staged under other settings, are never published)."""
        out: dict[FileIdent, dict[str, np.ndarray]] = {f: {} for f in files}
        if not files:
            return out
        with self.db.connection() as conn:
            rows = conn.execute(
                """SELECT v.collection, v.path, v.chunk_id, v.embedding FROM rag_stage_vectors v
                   JOIN unnest(%s::text[], %s::text[]) AS f(collection, path) USING (collection, path)
                   WHERE v.model = %s AND v.dimensions = %s""",
                ([c for c, _ in files], [p for _, p in files], model, dimensions),
            ).fetchall()
        for c, p, cid, v in rows:
            out.setdefault((c, p), {})[cid] = as_array(v)
        return out

    def stage_index(self, stage: str) -> dict[tuple[str, str], tuple[str | None, str | None, str | None]]:
        """(collection, path) → (content hash, status, fingerprint) of every file's output of one stage."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT collection, path, content_hash, payload->>'status', payload->>'fingerprint'"
                " FROM rag_stage_outputs WHERE stage = %s",
                (stage,),
            ).fetchall()
        return {(c, p): (h, s, f) for c, p, h, s, f in rows}

    def skip_judgements(self, stages: Sequence[str]) -> dict[tuple[str, str, str], dict[str, Any] | None]:
        """(collection, path, stage) → the limits an output of `stages` was judged under (its
        `judged`), for the outputs judged under some limit, and None for those with skips stored
        before outputs recorded them."""
        with self.db.connection() as conn:
            rows = conn.execute(
                """SELECT collection, path, stage, payload->'judged' FROM rag_stage_outputs
                    WHERE stage = ANY(%s) AND CASE WHEN payload ? 'judged' THEN payload->'judged' <> '{}'::jsonb
                          ELSE payload->>'status' = 'skipped'
                               OR jsonb_array_length(coalesce(payload->'skipped', '[]')) > 0 END""",
                (list(stages),)).fetchall()
        return {(c, p, st): judged for c, p, st, judged in rows}

    def failed_outputs(self, collection: str | None = None) -> list[dict[str, Any]]:
        """Files whose latest output of a stage failed (not `upstream_failed`: the stage before is the
        cause): collection, path, stage, error, when; a file that fails again keeps one row per stage."""
        with self.db.connection() as conn:
            return _dicts(conn.execute(
                "SELECT collection, path, stage, payload->>'error' AS error, updated_at FROM rag_stage_outputs"
                " WHERE payload->>'status' = 'failed' AND (%(c)s::text IS NULL OR collection = %(c)s)"
                " ORDER BY collection, path, stage", {"c": collection}))

    def metadata_warnings(self, collection: str | None = None) -> list[dict[str, Any]]:
        """Per document, the metadata it was ingested without (`Document.warnings`, kept in its file's
        raw_documents output): collection, path, warning."""
        with self.db.connection() as conn:
            return _dicts(conn.execute(
                """SELECT o.collection, d->>'path' AS path, w AS warning FROM rag_stage_outputs o
                   CROSS JOIN LATERAL jsonb_array_elements(coalesce(o.payload->'documents', '[]')) d
                   CROSS JOIN LATERAL jsonb_array_elements_text(coalesce(d->'warnings', '[]')) w
                   WHERE o.stage = 'raw_documents' AND (%(c)s::text IS NULL OR o.collection = %(c)s)
                   ORDER BY 1, 2""", {"c": collection}))

    def forget_file(self, collection: str, path: str, document_paths: Sequence[str]) -> list[str]:
        """Delete everything a file produced: its documents' rows, stage rows, staged vectors, skips."""
        deleted: list[str] = []
        for doc_path in dict.fromkeys([*document_paths, path]):
            deleted.extend(self.delete_document(collection, doc_path))
        with self.db.connection() as conn, conn.transaction():
            conn.execute("DELETE FROM rag_stage_outputs WHERE collection = %s AND path = %s", (collection, path))
            conn.execute("DELETE FROM rag_stage_vectors WHERE collection = %s AND path = %s", (collection, path))
            _clear_skips(conn, collection, path)
        return sorted(set(deleted))

    def clear_skips(self, collection: str, path: str) -> None:
        """Forget why a file (and its JSONL records) was skipped: it is being read again."""
        with self.db.connection() as conn:
            _clear_skips(conn, collection, path)

    def refresh_statistics(self, force: bool = False, tables: Sequence[str] = SERVING_TABLES) -> list[str]:
        """ANALYZE those of `tables` that hold rows but no statistics yet, or changed by
        autovacuum's own measure (50 rows + 10%) since their last (all of them with `force`); the
        tables analyzed, by name. After a bulk load its searches are planned on real statistics at once, not
        after autovacuum's next round: without them the graph list's query ran as a 5 s nested loop
        over 151 documents. (The change counters may lag a second or so; the first check does not.)"""
        with self.db.connection() as conn:
            conn.autocommit = True
            try:
                stale = [r[0] for r in conn.execute(
                    """SELECT t.relname FROM pg_stat_user_tables t JOIN pg_class c ON c.oid = t.relid
                        WHERE t.relname = ANY(%s) AND t.schemaname = current_schema()
                          AND (%s OR t.n_mod_since_analyze >= 50 + 0.1 * greatest(c.reltuples, 0)
                               OR (pg_relation_size(t.relid) > 0 AND NOT EXISTS (
                                   SELECT 1 FROM pg_stats s WHERE s.schemaname = t.schemaname
                                      AND s.tablename = t.relname)))
                        ORDER BY t.relname""", (list(tables), force))]
                for table in stale:
                    conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(table)))
            finally:
                conn.autocommit = False
        return stale

    def maintain_indexes(self, space: str | None) -> dict[str, Any]:
        """Weekly maintenance: REINDEX the space's HNSW index concurrently, then ANALYZE the tables."""
        done: dict[str, Any] = {"reindexed": None}
        with self.db.connection() as conn:
            conn.autocommit = True
            try:
                if space:
                    name = index_name(space)
                    if conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is not None:
                        conn.execute(sql.SQL("REINDEX INDEX CONCURRENTLY {}").format(sql.Identifier(name)))
                        done["reindexed"] = name
            finally:
                conn.autocommit = False
        done["analyzed"] = self.refresh_statistics(force=True, tables=(*SERVING_TABLES, "rag_embedding_cache"))
        return done


def _clear_skips(conn, collection: str, path: str) -> None:
    conn.execute("DELETE FROM rag_skipped WHERE collection = %s AND (path = %s OR path LIKE %s)",
                 (collection, path, like_escape(path) + ":%"))


def _files_named(paths: Sequence[str]) -> str:
    """A file's path, or "3 files (a.md, b.md, c.md)" for several."""
    return paths[0] if len(paths) == 1 else f"{len(paths)} files ({first_of(list(paths), 3)})"
