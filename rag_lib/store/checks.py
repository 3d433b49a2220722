"""SQL behind the data-quality checks: staged-vector validity, orphans and duplicates in the
serving table, the chunk frame, and HNSW index validity and recall against exact search."""

from __future__ import annotations

from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from rag_lib.store.connection import as_array
from rag_lib.store.documents import _dicts
from rag_lib.store.vectors import _matrix, _VectorBytes, index_name, vector_sql_type

ID_LIMIT = 50  # offending ids reported per problem (counts are always complete)
EXACT_BATCH = 20_000  # vectors read and ranked at a time by the recall check (~30 MB at 384 dimensions)


def _exact_neighbours(conn: psycopg.Connection, space: str, queries: list[np.ndarray], k: int) -> list[list[str]]:
    """The ids of each query's `k` nearest stored vectors in `space` by cosine distance, exactly: the
    vectors read once in binary, in batches, each batch ranked against every query at once."""
    if not queries:
        return []
    wanted = np.stack(queries).astype(np.float32)
    wanted /= np.linalg.norm(wanted, axis=1, keepdims=True)
    ids: list[str] = []
    best = np.full((0, len(queries)), np.inf)  # per query (column), its k nearest so far: distances
    where = np.empty((0, len(queries)), dtype=np.int64)  # and their positions in `ids`
    with conn.cursor(name="rag_recall_exact", binary=True) as cur:  # server-side: a batch at a time in memory
        cur.adapters.register_loader(conn.adapters.types["vector"].oid, _VectorBytes)
        cur.execute("SELECT chunk_id, embedding FROM rag_chunk_vectors WHERE space = %s", (space,))
        while rows := cur.fetchmany(EXACT_BATCH):
            matrix = _matrix([r[1] for r in rows])
            with np.errstate(divide="ignore", invalid="ignore"):  # a zero vector has no direction: NaN, last
                distance = 1.0 - (matrix @ wanted.T) / np.linalg.norm(matrix, axis=1, keepdims=True)
            positions = np.arange(len(ids), len(ids) + len(rows))
            ids.extend(r[0] for r in rows)
            best = np.vstack([best, np.nan_to_num(distance, nan=np.inf)])
            where = np.vstack([where, np.repeat(positions[:, None], len(queries), axis=1)])
            if len(best) > k:
                keep = np.argpartition(best, k - 1, axis=0)[:k]
                best, where = np.take_along_axis(best, keep, 0), np.take_along_axis(where, keep, 0)
    where = np.take_along_axis(where, np.argsort(best, axis=0, kind="stable"), 0)
    return [[ids[i] for i in where[:, j]] for j in range(len(queries))]


class CheckStore:
    """Mixin: needs `self.db` (Connections) and `self.settings`."""

    def bad_staged_vectors(self, model: str, dimensions: int, paths: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        """Staged vectors with the wrong model or dimension, NaN norm or all zeros (optionally only `paths`)."""
        scope = "TRUE"
        params: dict[str, Any] = {"m": model, "d": dimensions}
        if paths is not None:
            scope = "(collection, path) IN (SELECT * FROM unnest(%(cs)s::text[], %(ps)s::text[]))"
            params.update(cs=[c for c, _ in paths], ps=[p for _, p in paths])
        with self.db.connection() as conn:
            total = conn.execute(f"SELECT count(*) FROM rag_stage_vectors WHERE {scope}", params).fetchone()[0]
            rows = _dicts(conn.execute(
                f"""SELECT collection, path, chunk_id, model, dimensions, vector_dims(embedding) AS actual_dims,
                           CASE WHEN model <> %(m)s THEN 'wrong_model'
                                WHEN dimensions <> %(d)s OR vector_dims(embedding) <> %(d)s THEN 'wrong_dimension'
                                WHEN vector_norm(embedding) = 'NaN'::float8 THEN 'not_finite'
                                WHEN vector_norm(embedding) = 0 THEN 'zero_vector' END AS problem
                    FROM rag_stage_vectors WHERE {scope} AND (model <> %(m)s OR dimensions <> %(d)s
                      OR vector_dims(embedding) <> %(d)s OR vector_norm(embedding) = 'NaN'::float8
                      OR vector_norm(embedding) = 0)
                    ORDER BY collection, path, chunk_id""", params))
        return {"checked": total, "bad": rows}

    def serving_orphans(self, space: str) -> dict[str, Any]:
        """Chunks without a vector in `space`, vectors without a chunk, chunks whose document
        hash is gone, documents with no chunks although they count some; and duplicate chunks.
        Each table is read once and nothing is sorted in the database (ids are sorted here): at
        100k chunks, sorted in SQL, the stale-hash join walked the chunk index (0.3 s of the check's
        1 s) and the duplicates' sort spilled to disk."""
        queries = {
            "chunks_without_vector": """SELECT c.chunk_id, c.collection || ':' || c.path FROM rag_chunks c WHERE NOT EXISTS
                (SELECT 1 FROM rag_chunk_vectors v WHERE v.chunk_id = c.chunk_id AND v.space = %(s)s)""",
            "vectors_without_chunk": """SELECT v.chunk_id FROM rag_chunk_vectors v WHERE NOT EXISTS
                (SELECT 1 FROM rag_chunks c WHERE c.chunk_id = v.chunk_id)""",
            # one pass for both: a chunk whose document row is gone, or holds another version
            "chunks_off_document": """SELECT c.chunk_id, d.path IS NULL, c.collection || ':' || c.path FROM rag_chunks c
                LEFT JOIN rag_documents d USING (collection, path)
                WHERE d.path IS NULL OR c.doc_hash <> d.content_hash""",
            "duplicate_chunks": """SELECT min(chunk_id) || ' x' || count(*) FROM rag_chunks
                GROUP BY collection, path, section, content_hash HAVING count(*) > 1""",
        }
        found: dict[str, list[str]] = {}
        documents: dict[str, set[str]] = {}  # the documents (collection:path) the chunks belong to
        with self.db.connection() as conn, conn.transaction():
            conn.execute("SET LOCAL work_mem = '64MB'")  # the duplicates' grouping in memory, not on disk
            for name, query in queries.items():
                rows = conn.execute(query, {"s": space}).fetchall()
                if name == "chunks_off_document":
                    found["chunks_with_stale_hash"] = [r[0] for r in rows if not r[1]]
                    found["chunks_without_document"] = [r[0] for r in rows if r[1]]
                    documents["chunks_with_stale_hash"] = {r[2] for r in rows if not r[1]}
                    documents["chunks_without_document"] = {r[2] for r in rows if r[1]}
                else:
                    found[name] = [r[0] for r in rows]
                    if name == "chunks_without_vector":
                        documents[name] = {r[1] for r in rows}
            chunks, vectors = conn.execute(
                "SELECT (SELECT count(*) FROM rag_chunks),"
                " (SELECT count(*) FROM rag_chunk_vectors WHERE space = %s)", (space,)).fetchone()
        out: dict[str, Any] = {name: {"count": len(ids), "ids": sorted(ids)[:ID_LIMIT],
                                      **({"documents": sorted(documents[name])[:ID_LIMIT]} if name in documents else {})}
                               for name, ids in found.items()}
        out["chunks"], out["vectors"] = chunks, vectors
        return out

    def documents_under_other_fingerprint(self, fingerprint: str, collection: str | None = None) -> dict[str, Any]:
        """Documents published under another pipeline fingerprint than `fingerprint` (other chunking,
        model, loader or sections mapping): their count and the first `collection:path`s."""
        with self.db.connection() as conn:
            rows = conn.execute(
                "SELECT collection || ':' || path FROM rag_documents WHERE fingerprint IS DISTINCT FROM %(f)s"
                " AND (%(c)s::text IS NULL OR collection = %(c)s)", {"f": fingerprint, "c": collection}).fetchall()
        paths = sorted(r[0] for r in rows)
        return {"count": len(paths), "ids": paths[:ID_LIMIT]}

    def document_sources(self, collection: str | None = None) -> list[dict[str, Any]]:
        """(collection, path, source_path) of every live document (of `collection`), to find those
        whose file is gone."""
        with self.db.connection() as conn:
            return _dicts(conn.execute("SELECT collection, path, source_path FROM rag_documents"
                                       " WHERE %(c)s::text IS NULL OR collection = %(c)s ORDER BY 1, 2", {"c": collection}))

    def chunk_frame_rows(self) -> list[dict[str, Any]]:
        """One row per chunk of the `chunks` stage outputs (before publishing): what the chunk-size
        suite validates, its id, tokens and characters. Not its text: a frame of every chunk's text
        is gigabytes at a million chunks, read and validated on every run that includes `chunks`."""
        with self.db.connection() as conn:
            return _dicts(conn.execute(
                """SELECT c->>'chunk_id' AS chunk_id, (c->>'token_count')::int AS token_count,
                          length(c->>'text') AS text_chars
                   FROM rag_stage_outputs o, jsonb_array_elements(o.payload->'documents') d,
                        jsonb_array_elements(d->'chunks') c
                   WHERE o.stage = 'chunks' AND o.payload->>'status' = 'ok' ORDER BY 1"""))

    def hnsw_index_state(self, space: str) -> dict[str, Any]:
        """Whether the space's HNSW index exists and is valid/ready, with its size and last build."""
        name = index_name(space)
        with self.db.connection() as conn:
            row = conn.execute(
                """SELECT i.indisvalid, i.indisready, pg_relation_size(i.indexrelid)
                   FROM pg_index i WHERE i.indexrelid = to_regclass(%s)""", (name,)).fetchone()
            build = _dicts(conn.execute(
                "SELECT m, ef_construction, rows_indexed, build_seconds, built_at FROM rag_index_builds"
                " WHERE index_name = %s ORDER BY id DESC LIMIT 1", (name,)))
            # the index holds every vector of its space (rows added since its build went in one by one)
            rows = conn.execute("SELECT count(*) FROM rag_chunk_vectors WHERE space = %s", (space,)).fetchone()[0]
        return {
            "index": name,
            "exists": row is not None,
            "valid": bool(row and row[0] and row[1]),
            "size_bytes": int(row[2]) if row else 0,
            "rows": int(rows) if row else 0,
            "last_build": build[0] if build else None,
        }

    def measure_recall(self, space: str, dimensions: int, sample: int, k: int, ef_search: int) -> dict[str, Any]:
        """recall@k of the HNSW index against exact search, using `sample` stored vectors as queries,
        in one snapshot. The exact neighbours come from one read of the space's vectors, ranked in
        the process: the database ranked every vector once per query (100k chunks: 4.3 s a check)."""
        vec = vector_sql_type(self.settings.search.vector_type, dimensions)
        knn = sql.SQL(
            "SELECT chunk_id FROM rag_chunk_vectors WHERE space = {s} ORDER BY embedding::{t} <=> %s::{t} LIMIT {k}"
        ).format(s=sql.Literal(space), t=vec, k=sql.Literal(k))
        with self.db.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")  # the walks and the read agree
            queries = [as_array(r[0]) for r in conn.execute(
                "SELECT embedding FROM rag_chunk_vectors WHERE space = %s ORDER BY md5(chunk_id) LIMIT %s",
                (space, sample)).fetchall()]
            conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ef_search)))
            approx = [[r[0] for r in conn.execute(knn, (q,)).fetchall()] for q in queries]
            exact = _exact_neighbours(conn, space, queries, k)
        found = sum(len(set(a) & set(e)) for a, e in zip(approx, exact))
        wanted = sum(len(e) for e in exact)
        recall = found / wanted if wanted else 1.0
        return {"recall": recall, "sample": len(queries), "k": k, "ef_search": ef_search}

    def record_recall(self, space: str, recall: float, ef_search: int) -> None:
        """Store measured recall on the index's latest build row."""
        with self.db.connection() as conn:
            conn.execute(
                """UPDATE rag_index_builds SET recall_at_10 = %s, ef_search = %s
                   WHERE id = (SELECT max(id) FROM rag_index_builds WHERE index_name = %s)""",
                (recall, ef_search, index_name(space)),
            )
