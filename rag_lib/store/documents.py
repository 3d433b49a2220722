"""SQL for documents, sections, chunks and skips: publishing is one transaction per document."""

from __future__ import annotations

import difflib
import json
import random
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import psycopg
import psycopg.errors
from psycopg.types.json import Jsonb

from rag_lib.corpus_files import is_jsonl_name
from rag_lib.errors import (AmbiguousReferenceError, DatabaseError, DimensionMismatchError, NotFoundError,
                            did_you_mean, first_line, first_of)
from rag_lib.log import get_logger
from rag_lib.models import Chunk, Document, DocumentGraph, Section, Skipped
from rag_lib.store.connection import copy_rows, like_escape
from rag_lib.store.lexical import change_lexeme_frequencies, lexeme_counts

log = get_logger(__name__)
PUBLISH_ATTEMPTS = 3  # a publish that deadlocks with another ingest's is run again this many times in all
PREVIEW_CHARS = 120  # the start of each chunk's text `show` returns as its `preview`
PATHS_COMPARED = 20_000  # document paths a mistyped path is compared with by spelling (`paths_like`)


def _lock_key(collection: str, path: str) -> str:
    return f"{collection}\x1f{path}"


def _refuse_inactive_space(conn: psycopg.Connection, path: str, space: str) -> None:
    """Raise DimensionMismatchError unless `space` is the active space (or none is yet), for the
    rest of the publishing transaction: it takes the ROW EXCLUSIVE lock on rag_chunks that its
    writes take anyway before reading, and a re-embed's switch needs SHARE on rag_chunks to commit
    (`SpaceStore.switch_active`). So the switch either committed before this read (refused here)
    or waits for this publish, and its coverage check counts these chunks."""
    conn.execute("LOCK TABLE rag_chunks IN ROW EXCLUSIVE MODE")
    active = conn.execute("SELECT space FROM rag_spaces WHERE status = 'active'").fetchone()
    if active is not None and active[0] != space:
        raise DimensionMismatchError(
            f"{path}: this process embeds into {space} but the active space is now {active[0]}; set "
            "embedding.model/dimensions to match and restart (nothing was written)"
        )


class DocumentStore:
    """Mixin: needs `self.db` (Connections) and `self.held_vectors` (told of every change)."""

    def document_states(self, collection: str) -> dict[str, tuple[str, str]]:
        """path → (content hash, fingerprint) of every live document in a collection."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT path, content_hash, fingerprint FROM rag_documents WHERE collection = %s", (collection,)
            ).fetchall()
        return {path: (digest, fp) for path, digest, fp in rows}

    def publish_document(
        self,
        doc: Document,
        sections: Sequence[Section],
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
        space: str,
        dimensions: int,
        fingerprint: str,
        graph: DocumentGraph | None = None,
    ) -> None:
        """Replace a document's rows atomically: readers see the old version or the new, never half.
        Its graph edges are replaced in the same transaction (`graph=None`: the document has none).
        DimensionMismatchError, and nothing written, when another space than `space` is active."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors for {doc.path}")
        if len(chunks) and vectors.shape[1] != dimensions:
            raise DimensionMismatchError(
                f"{doc.path}: vectors have {vectors.shape[1]} dimensions, space {space} has {dimensions}; "
                "nothing was written"
            )
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            try:
                self._publish(doc, sections, chunks, vectors, space, dimensions, fingerprint, graph)
                self.held_vectors.recheck()
                return
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                # two ingests of one collection write the same graph nodes and lexeme counts in
                # different orders; the transaction rolled back whole, so it is simply run again
                if attempt == PUBLISH_ATTEMPTS:
                    raise DatabaseError(f"{doc.path}: publishing failed {attempt} times on a conflict with another "
                                        f"ingest ({type(exc).__name__}); the previous version stays live, run it "
                                        "again") from exc
                log.info("publishing %s met another ingest (%s); trying again", doc.path, type(exc).__name__)
                time.sleep(random.uniform(0.05, 0.3) * attempt)
            except psycopg.Error as exc:
                log.debug("publishing %s failed", doc.path, exc_info=True)  # the DETAIL / CONTEXT lines
                raise DatabaseError(f"{doc.path}: publishing failed ({exc.__class__.__name__}: {first_line(exc, 2000)}); "
                                    "the previous version stays live") from exc

    def _publish(self, doc, sections, chunks, vectors, space, dimensions, fingerprint, graph=None) -> None:
        with self.db.connection() as conn, conn.transaction():
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_lock_key(doc.collection, doc.path),)
            )
            _refuse_inactive_space(conn, doc.path, space)
            old_nodes = self._graph_keys(conn, doc.collection, [doc.path])
            old_lexemes = lexeme_counts(conn, doc.collection, [doc.path])
            # Client tags are not in the file: the new version keeps the old one's.
            kept = conn.execute(
                "DELETE FROM rag_documents WHERE collection = %s AND path = %s RETURNING tags",
                (doc.collection, doc.path),
            ).fetchone()
            conn.execute(
                """INSERT INTO rag_documents (collection, path, doc_id, doc_type, title, ticker, doc_date, version,
                       format, content_hash, fingerprint, source_path, size_bytes, metadata, section_count,
                       chunk_count, token_count, tags)
                   VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)""",
                (
                    doc.collection, doc.path, doc.doc_id, doc.doc_type, doc.title, doc.ticker, doc.doc_date,
                    doc.version, doc.format, doc.content_hash, fingerprint, doc.source_path, doc.size_bytes,
                    Jsonb(doc.metadata), len(sections), len(chunks), sum(c.token_count for c in chunks),
                    Jsonb(kept[0] if kept else {}),
                ),
            )
            with conn.cursor() as cur:
                with cur.copy(
                    "COPY rag_sections (collection, path, name, ordinal, title, text, token_count, is_empty)"
                    " FROM STDIN"
                ) as copy:
                    for s in sections:
                        copy.write_row(
                            (doc.collection, doc.path, s.name, s.ordinal, s.title, s.text,
                             s.token_count, s.is_empty)
                        )
                with cur.copy(
                    "COPY rag_chunks (chunk_id, collection, path, doc_id, doc_type, ticker, doc_date, section,"
                    " section_path, unit_id, ordinal, text, embed_text, token_count, content_hash, doc_hash,"
                    " char_start, char_end, metadata) FROM STDIN"
                ) as copy:
                    for c in chunks:
                        copy.write_row(
                            (c.chunk_id, c.collection, c.path, c.doc_id, c.doc_type, c.ticker, c.doc_date,
                             c.section, c.section_path, c.unit_id, c.ordinal, c.text, c.embed_text,
                             c.token_count, c.content_hash, doc.content_hash, c.char_start, c.char_end,
                             json.dumps(c.metadata))
                        )
                copy_rows(cur, "rag_chunk_vectors (chunk_id, space, dimensions, embedding)",
                          ["text", "text", "integer", "vector"],
                          ((c.chunk_id, space, dimensions, vec) for c, vec in zip(chunks, vectors)))
            if graph is not None:
                self._graph_write(conn, doc, graph)
            self._graph_drop_orphans(conn, doc.collection, old_nodes)
            conn.execute("DELETE FROM rag_skipped WHERE collection = %s AND path = %s", (doc.collection, doc.path))
            change_lexeme_frequencies(conn, doc.collection, [doc.path], old_lexemes)  # last: see its docstring

    def set_tags(self, collection: str, path: str, tags: dict[str, Any]) -> int:
        """Replace the client tags of a document (a JSONL file: of each of its records); returns how
        many documents were tagged."""
        pattern = like_escape(path) + "#%"
        with self.db.connection() as conn:
            cur = conn.execute(
                "UPDATE rag_documents SET tags = %s WHERE collection = %s AND (path = %s OR path LIKE %s)",
                (Jsonb(tags), collection, path, pattern),
            )
        self.held_vectors.recheck()
        return cur.rowcount

    def document_summaries(self, collection: str, paths: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Type, title, ticker, date (ISO) and id of the documents at `paths`, by path."""
        if not paths:
            return {}
        with self.db.connection() as conn:
            rows = _dicts(conn.execute(
                "SELECT path, doc_type, title, ticker, doc_date, doc_id FROM rag_documents WHERE collection = %s"
                " AND path = ANY(%s)", (collection, list(paths))))
        return {r["path"]: {**r, "doc_date": r["doc_date"].isoformat() if r["doc_date"] else None} for r in rows}

    def tags_of(self, collection: str, paths: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Client tags by document path (documents without tags are left out)."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT path, tags FROM rag_documents WHERE collection = %s AND path = ANY(%s) AND tags <> '{}'",
                (collection, list(paths)),
            ).fetchall()
        return {path: tags for path, tags in rows}

    def record_skip(self, skipped: Skipped) -> None:
        """Remember why an input was skipped; the live version of the document (if any) stays."""
        with self.db.connection() as conn:
            conn.execute(
                """INSERT INTO rag_skipped (collection, path, reason, detail, content_hash)
                   VALUES (%s,%s,%s,%s,%s)
                   ON CONFLICT (collection, path) DO UPDATE SET reason = EXCLUDED.reason,
                     detail = EXCLUDED.detail, content_hash = EXCLUDED.content_hash, seen_at = now()""",
                (skipped.collection, skipped.path, skipped.reason, skipped.detail, skipped.content_hash),
            )

    def list_skipped(self, collection: str | None = None) -> list[dict[str, Any]]:
        with self.db.connection() as conn:
            cur = conn.execute(
                "SELECT collection, path, reason, detail, seen_at FROM rag_skipped"
                " WHERE %(c)s::text IS NULL OR collection = %(c)s ORDER BY collection, path",
                {"c": collection},
            )
            return _dicts(cur)

    def delete_document(self, collection: str, ref: str) -> list[str]:
        """Delete a document by path or doc id (all its sections, chunks, vectors, stage rows)."""
        with self.db.connection() as conn, conn.transaction():
            paths = self._resolve_ref(conn, collection, ref, records=True)
            for path in paths:
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (_lock_key(collection, path),))
            old_nodes = self._graph_keys(conn, collection, paths)
            old_lexemes = lexeme_counts(conn, collection, paths)
            conn.execute(
                "DELETE FROM rag_documents WHERE collection = %s AND path = ANY(%s)", (collection, paths)
            )
            self._graph_drop_orphans(conn, collection, old_nodes)
            conn.execute(
                "DELETE FROM rag_stage_outputs WHERE collection = %s AND path = ANY(%s)", (collection, paths)
            )
            skipped = conn.execute(
                "DELETE FROM rag_skipped WHERE collection = %s AND path = %s RETURNING path", (collection, ref)
            ).fetchall()
            if paths:
                change_lexeme_frequencies(conn, collection, paths, old_lexemes)  # last: see its docstring
        self.held_vectors.recheck()
        return paths or [r[0] for r in skipped]

    @staticmethod
    def _resolve_ref(conn, collection: str, ref: str, records: bool = False) -> list[str]:
        """Paths a reference names: the document at that path, else the documents with that id (a JSONL
        record's id never shadows a real path), else, with `records`, every record of a JSONL file."""
        queries = ["SELECT path FROM rag_documents WHERE collection = %s AND path = %s",
                   "SELECT path FROM rag_documents WHERE collection = %s AND doc_id = %s ORDER BY path"]
        if records:
            queries.append("SELECT path FROM rag_documents WHERE collection = %s AND starts_with(path, %s || '#')"
                           " ORDER BY path")
        for n, sql in enumerate(queries):
            paths = [r[0] for r in conn.execute(sql, (collection, ref)).fetchall()]
            if n == 1 and len(paths) > 1:
                raise AmbiguousReferenceError(ambiguous_id_message(collection, ref, paths))
            if paths:
                return paths
        return []

    def collections_holding(self, ref: str, limit: int = 5) -> list[str]:
        """The collections with a document at path `ref` or with id `ref`."""
        with self.db.connection() as conn:
            return [r[0] for r in conn.execute(
                "SELECT DISTINCT collection FROM rag_documents WHERE path = %s OR doc_id = %s ORDER BY 1 LIMIT %s",
                (ref, ref, limit))]

    def not_found_hint(self, collection: str, ref: str) -> str:
        """What to say after "no document REF in COLLECTION": the collections that have it, else the
        paths of this one spelled closest."""
        elsewhere = [c for c in self.collections_holding(ref) if c != collection]
        if elsewhere:
            return f"; it is in collection {' and '.join(repr(c) for c in elsewhere)}: name that collection"
        return did_you_mean(self.paths_like(collection, ref))

    def paths_like(self, collection: str, ref: str, limit: int = 3) -> list[str]:
        """Document paths close to `ref`, for a "did you mean": those holding its file name (any case),
        shortest first, else the closest by spelling among the collection's first PATHS_COMPARED."""
        name = ref.rstrip("/").rsplit("/", 1)[-1]
        with self.db.connection() as conn:
            holding = [r[0] for r in conn.execute(
                "SELECT path FROM rag_documents WHERE collection = %s AND path ILIKE %s"
                " ORDER BY length(path), path LIMIT %s", (collection, "%" + like_escape(name) + "%", limit))] \
                if name else []
            if holding:
                return holding
            paths = [r[0] for r in conn.execute("SELECT path FROM rag_documents WHERE collection = %s LIMIT %s",
                                                (collection, PATHS_COMPARED))]
        return difflib.get_close_matches(ref, paths, n=limit, cutoff=0.8)

    def documents_with_id(self, collection: str, doc_id: str) -> list[str]:
        """Paths of the documents of a collection that carry `doc_id`."""
        with self.db.connection() as conn:
            return [r[0] for r in conn.execute(
                "SELECT path FROM rag_documents WHERE collection = %s AND doc_id = %s ORDER BY path",
                (collection, doc_id)).fetchall()]

    def ref_sources(self, collection: str, ref: str) -> dict[str, str | None]:
        """path → source file of the documents `ref` names (as `delete_document` resolves it)."""
        with self.db.connection() as conn:
            paths = self._resolve_ref(conn, collection, ref, records=True)
            rows = conn.execute("SELECT path, source_path FROM rag_documents WHERE collection = %s AND path = ANY(%s)",
                                (collection, paths)).fetchall()
        return dict(rows)

    def sources_in_use(self, source_paths: Sequence[str]) -> set[str]:
        """Which of these source files still back a document (of any collection)."""
        with self.db.connection() as conn:
            rows = conn.execute("SELECT DISTINCT source_path FROM rag_documents WHERE source_path = ANY(%s)",
                                (list(source_paths),)).fetchall()
        return {r[0] for r in rows}

    def list_documents(self, collection: str | None, limit: int = 1000, offset: int = 0) -> list[dict[str, Any]]:
        with self.db.connection() as conn:
            cur = conn.execute(
                """SELECT collection, path, doc_id, doc_type, ticker, doc_date, title, section_count,
                          chunk_count, token_count, ingested_at, content_hash
                   FROM rag_documents WHERE %(c)s::text IS NULL OR collection = %(c)s
                   ORDER BY collection, path LIMIT %(l)s OFFSET %(o)s""",
                {"c": collection, "l": limit, "o": offset},
            )
            return _dicts(cur)

    def get_document(self, collection: str, ref: str) -> dict[str, Any]:
        """A document with its sections (empty ones included) and chunk summaries."""
        with self.db.connection() as conn:
            paths = self._resolve_ref(conn, collection, ref)
            found = _dicts(conn.execute("SELECT * FROM rag_documents WHERE collection = %s AND path = %s",
                                        (collection, paths[0]))) if paths else []
            if not found:
                raise NotFoundError(f"no document '{ref}' in collection '{collection}'"
                                    f"{self.not_found_hint(collection, ref)}; see `rag list`")
            doc = found[0]
            doc["sections"] = _dicts(conn.execute(
                "SELECT name, title, ordinal, token_count, is_empty FROM rag_sections"
                " WHERE collection = %s AND path = %s ORDER BY ordinal", (collection, doc["path"])))
            doc["chunks"] = _dicts(conn.execute(
                "SELECT chunk_id, section, section_path, ordinal, token_count, char_start, char_end,"
                " left(text, %s) AS preview FROM rag_chunks WHERE collection = %s AND path = %s ORDER BY ordinal",
                (PREVIEW_CHARS, collection, doc["path"])))
        return doc

    def move_document_sources(self, collection: str, moves: dict[str, str]) -> None:
        """Record that the documents at these paths are now read from another file (their folder
        moved): path → the new source file."""
        with self.db.connection() as conn, conn.cursor() as cur:
            cur.executemany("UPDATE rag_documents SET source_path = %s WHERE collection = %s AND path = %s",
                            [(source, collection, path) for path, source in moves.items()])

    def document_sources_of(self, collection: str, files: Sequence[str]) -> dict[str, str | None]:
        """path → the file it was read from, of the documents at these paths (a JSONL file's: its records)."""
        records = [like_escape(f) + "#%" for f in files if is_jsonl_name(f)]
        with self.db.connection() as conn:
            return dict(conn.execute(
                "SELECT path, source_path FROM rag_documents WHERE collection = %s AND (path = ANY(%s) OR path LIKE ANY(%s))",
                (collection, list(files), records)).fetchall())

    def document_sources_under(self, collection: str, folders: Sequence[str], files: Sequence[str]) -> dict[str, str | None]:
        """path → the file it was read from, of the documents under these folders ("" is the whole
        collection) and at these files (a JSONL file's: its records), all relative to the root."""
        if "" in folders:
            with self.db.connection() as conn:
                return dict(conn.execute("SELECT path, source_path FROM rag_documents WHERE collection = %s",
                                         (collection,)).fetchall())
        # `~>=~` and `~<~` compare bytes (text_pattern_ops), so the paths under a folder (or a JSONL
        # file's records) are one range, which the rag_documents_path_prefix index (sql/024) finds
        # under any collation; no LIKE, so `%` and `_` in a name are plain characters.
        folders, files = [f for f in folders if _storable(f)], [f for f in files if _storable(f)]
        ranges = [_prefix_range(f + "/") for f in folders] + [_prefix_range(f + "#") for f in files]
        with self.db.connection() as conn:
            return dict(conn.execute(
                """SELECT path, source_path FROM rag_documents WHERE collection = %(c)s AND path = ANY(%(files)s)
                   UNION
                   SELECT d.path, d.source_path FROM unnest(%(low)s::text[], %(high)s::text[]) AS r(low, high)
                   JOIN rag_documents d ON d.collection = %(c)s AND d.path ~>=~ r.low AND d.path ~<~ r.high""",
                {"c": collection, "files": list(files), "low": [lo for lo, _ in ranges],
                 "high": [hi for _, hi in ranges]}).fetchall())



def ambiguous_id_message(collection: str, doc_id: str, paths: Sequence[str]) -> str:
    shown = first_of([f"'{p}'" for p in paths], 3)
    return (f"id '{doc_id}' names {len(paths)} documents in collection '{collection}' ({shown}); "
            "use the document's path instead")


def _storable(path: str) -> bool:
    """Whether a path can be sent to PostgreSQL: one that is not UTF-8 (a file or folder named in
    another encoding) cannot, and no document has it or is under it (`check_rel_path` refuses it)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _prefix_range(prefix: str) -> tuple[str, str]:
    """(low, high): the strings that start with `prefix` are those from low up to, not including,
    high in byte order (`prefix` ends in an ASCII character, here "/" or "#", which high increments)."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _dicts(cur) -> list[dict[str, Any]]:
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]
