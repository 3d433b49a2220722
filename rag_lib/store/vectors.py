"""SQL for embedding spaces, the embedding cache, HNSW indexes and semantic search."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import psycopg
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from psycopg.pq import Format
from psycopg.types.json import Jsonb

from rag_lib.errors import DimensionMismatchError
from rag_lib.models import SearchFilters, SearchHit
from rag_lib.store.connection import as_array, copy_rows, like_escape


def index_name(space: str) -> str:
    return "rag_vec_hnsw_" + hashlib.sha1(space.encode()).hexdigest()[:12]


def _same_name_note(model: str, active_model: str) -> str:
    """Why two spaces of one model name differ: the local model's files (a space of a local model
    other than the installed one is `name@identity`, rag_lib.embedding.identity)."""
    if model.split("@")[0] != active_model.split("@")[0]:
        return ""
    return (f" (both are {model.split('@')[0]}, but the local model's files at embedding.model_path are not the "
            "ones the active space's vectors were made with: its files, not only its name, name a space)")


def vector_sql_type(vector_type: str, dimensions: int) -> sql.Composable:
    """The cast the HNSW index is built on and queries use: `vector(d)` or `halfvec(d)`."""
    if vector_type not in ("vector", "halfvec"):
        raise ValueError(f"search.vector_type must be vector or halfvec, not {vector_type!r}")
    return sql.SQL(f"{vector_type}({int(dimensions)})")


def _filter_sql(filters: SearchFilters, alias: str = "c") -> tuple[sql.Composable, list[Any]]:
    """WHERE fragments for the shared filters; every value is a bound parameter."""
    col = lambda name: sql.SQL(f"{alias}.") + sql.Identifier(name)  # noqa: E731
    parts: list[sql.Composable] = []
    params: list[Any] = []

    def many(value: str | list[str] | None) -> list[str] | None:
        if value is None or value == [] or value == "":
            return None
        return [value] if isinstance(value, str) else list(value)

    if filters.collection:
        parts.append(col("collection") + sql.SQL(" = %s"))
        params.append(filters.collection)
    if (types := many(filters.doc_type)) is not None:
        parts.append(col("doc_type") + sql.SQL(" = ANY(%s)"))
        params.append(types)
    if (tickers := many(filters.ticker)) is not None:
        parts.append(col("ticker") + sql.SQL(" = ANY(%s)"))
        params.append([t.upper() for t in tickers])
    if filters.section:
        parts.append(col("section") + sql.SQL(" = %s"))
        params.append(filters.section)
    if filters.section_contains:
        parts.append(col("section_path") + sql.SQL(" ILIKE %s"))
        params.append("%" + like_escape(filters.section_contains) + "%")
    if filters.path:
        parts.append(col("path") + sql.SQL(" LIKE %s"))
        params.append(like_escape(filters.path) + "%")
    if filters.date_from:
        parts.append(col("doc_date") + sql.SQL(" >= %s"))
        params.append(filters.date_from)
    if filters.date_to:
        parts.append(col("doc_date") + sql.SQL(" <= %s"))
        params.append(filters.date_to)
    if filters.formats:
        parts.append(sql.SQL(
            "EXISTS (SELECT 1 FROM rag_documents d WHERE d.collection = {a}.collection AND d.path = {a}.path"
            " AND d.format = ANY(%s))").format(a=sql.Identifier(alias)))
        params.append(list(filters.formats))
    for key, value in (filters.tags or {}).items():
        # a document matches when its tag equals the value (a list: any of them)
        parts.append(sql.SQL(
            "EXISTS (SELECT 1 FROM rag_documents d WHERE d.collection = {a}.collection AND d.path = {a}.path"
            " AND d.tags @> ANY(%s::jsonb[]))").format(a=sql.Identifier(alias)))
        params.append([Jsonb({key: v}) for v in (value if isinstance(value, list) else [value])])
    if not parts:
        return sql.SQL("TRUE"), params
    return sql.SQL(" AND ").join(parts), params


SCAN_TTL = 5.0  # seconds a filter's exact-or-HNSW decision is reused (a collection grows in steps)
REMEMBERED_MAX = 1024  # per-filter answers kept (scan decisions, searches) before the expired ones are dropped
# `search.ef_search` 0 scales the walk with the index: recall@10 against exact search was 0.975 at
# ef_search 200 on 100k chunks, and at 1M 0.943 at 200, 0.971 at 300 (docs/scale.md): a tenfold
# larger index lost ~0.03 at a fixed ef_search and 100 more won it back.
EF_SEARCH_BASE, EF_SEARCH_BASE_ROWS, EF_SEARCH_PER_TENFOLD = 200, 100_000, 100


def scaled_ef_search(rows: float) -> int:
    """hnsw.ef_search for an HNSW index of `rows` vectors: EF_SEARCH_BASE up to EF_SEARCH_BASE_ROWS,
    then EF_SEARCH_PER_TENFOLD more per tenfold (log-linear between the two measured sizes; beyond
    1M extrapolated, unmeasured), at most 1000 (pgvector's limit)."""
    if rows <= EF_SEARCH_BASE_ROWS:
        return EF_SEARCH_BASE
    return min(1000, round(EF_SEARCH_BASE + EF_SEARCH_PER_TENFOLD * math.log10(rows / EF_SEARCH_BASE_ROWS)))
# An exact ranking scans every vector of the space when it holds at most this many per filtered chunk:
# a distance computed while scanning costs ~0.3 us of the server's CPU per row, a filtered row joined
# to its vector first ~1.5 us (see `_scans_whole_space`).
SPACE_SCAN_RATIO = 4


def _collection_only(filters: SearchFilters) -> bool:
    return bool(filters.collection) and dataclasses.replace(filters, collection=None) == SearchFilters()


HIT_COLUMNS = sql.SQL(
    "c.chunk_id, c.text, c.doc_id, c.path, c.section, c.section_path, c.unit_id, c.doc_type,"
    " c.collection, c.ticker, c.doc_date, c.metadata"
)


class SemanticHits(list):
    """Hits of `semantic_search`; `pool` holds the ids of the query's `pool` nearest chunks (best
    first) when an exact ranking was asked for them, else None; `scan` the (scan, rows) decision the
    filters got (see `_scan_for`; None when `exact` forced it), for a later search with the same
    filters; `cosines` the query's cosine with each chunk asked for by `cosines=` that has a vector."""

    pool: list[str] | None = None
    scan: tuple[str, int | None] | None = None
    cosines: dict[str, float] = {}  # replaced, never mutated: one empty dict shared by every instance


def hit_from_row(row: dict[str, Any], score: float) -> SearchHit:
    return SearchHit(
        chunk_id=row["chunk_id"], score=score, text=row["text"], doc_id=row["doc_id"], path=row["path"],
        section=row["section"], section_path=row["section_path"], unit_id=row["unit_id"],
        doc_type=row["doc_type"], collection=row["collection"], ticker=row["ticker"],
        doc_date=row["doc_date"], metadata=row["metadata"] or {},
    )


def _hits(cur: psycopg.Cursor, cosines: psycopg.Cursor | None = None) -> SemanticHits:
    """SemanticHits from a query's rows (chunk columns, distance, similarity, pool; `asked` and
    `asked_cosines` on the first row, when the query computed the cosines asked for), with the rows
    of `_COSINES` as its `cosines` when given."""
    cols = [d.name for d in cur.description]
    hits = SemanticHits()
    for values in cur.fetchall():
        row = dict(zip(cols, values))
        hit = hit_from_row(row, max(0.0, 1.0 - float(row["distance"])))
        hit.similarity = float(row["similarity"])
        hits.append(hit)
        hits.pool = hits.pool or row["pool"]
        if row.get("asked"):
            hits.cosines = dict(zip(row["asked"], map(float, row["asked_cosines"])))
    if cosines is not None:
        hits.cosines = {**hits.cosines, **{cid: float(sim) for cid, sim in cosines.fetchall()}}
    return hits


# Cosine similarity of a vector to given chunks' stored vectors in a space (`similarities`, and the
# `cosines` a feedback query returns in its own round trip)
_COSINES = ("SELECT chunk_id, 1 - (embedding <=> %s::vector) FROM rag_chunk_vectors"
            " WHERE space = %s AND chunk_id = ANY(%s)")


def text_array(values: Sequence[str]) -> tuple[sql.Composable, Any]:
    """A text[] query parameter for a long list (feedback's ~550 candidate ids): (SQL, argument). Sent
    as one string the server splits: psycopg dumps a list element by element in Python, 0.9 ms of
    CPU for 550 ids against 0.04 ms for the joined string. A list when a value holds the separator
    or is empty (the server would split it away)."""
    if any("," in v or not v for v in values):
        return sql.SQL("%s::text[]"), list(values)
    return sql.SQL("string_to_array(%s, ',')"), ",".join(values)


# What a collection's held vectors are checked against (see `HeldVectors`): every publish and delete
# rewrites or removes the document's row, so its xmin (the writing transaction) changes; the count,
# the xids' sum and a hash of (path, xmin) tell any committed change of the collection's documents.
_GENERATION = ("SELECT count(*) AS documents, coalesce(sum(xmin::text::bigint), 0) AS xids,"
               " coalesce(bit_xor(hashtextextended(path || ':' || xmin::text, 0)), 0) AS digest"
               " FROM rag_documents WHERE collection = %s")


# The same for the chunks some filters leave (a ticker, a document type): publishing or deleting a
# document deletes its chunk rows and inserts new ones, so the filtered rows' xmins tell any committed
# change among them; a new document the filters keep adds rows. Client tags live on the documents
# (set_tags rewrites no chunk), so filters on tags are not held.
_CHUNK_GENERATION = ("SELECT count(*) AS chunks, coalesce(sum(c.xmin::text::bigint), 0) AS xids,"
                     " coalesce(bit_xor(hashtextextended(c.chunk_id || ':' || c.xmin::text, 0)), 0) AS digest"
                     " FROM rag_chunks c WHERE {where}")


def _collection_key(collection: str) -> tuple[str, str]:
    """A whole collection's `HeldScope.key`."""
    return ("collection", collection)


@dataclasses.dataclass(frozen=True)
class HeldScope:
    """What one held copy covers: a whole collection, or the chunks some filters leave."""

    key: tuple[str, str]  # ("collection", name) or ("filters", repr of the filters)
    where: sql.Composable
    params: tuple[Any, ...]

    @classmethod
    def of(cls, filters: SearchFilters, where: sql.Composable, params: list[Any]) -> HeldScope | None:
        """The scope of `filters` (`where`, `params`: their `_filter_sql`); None when they cannot be
        held (client tags)."""
        if filters.tags:
            return None
        if _collection_only(filters):
            return cls(_collection_key(filters.collection), where, tuple(params))
        return cls(("filters", repr(filters)), where, tuple(params))

    def generation(self, conn: psycopg.Connection) -> tuple:
        """The scope's current generation: its collection's documents, or its chunks."""
        if self.key[0] == "collection":
            return tuple(conn.execute(_GENERATION, [self.key[1]]).fetchone())
        return tuple(conn.execute(sql.SQL(_CHUNK_GENERATION).format(where=self.where), self.params).fetchone())


class HeldVectors:
    """One collection's vectors in one space and its chunks' hit rows, held by the process (~12 MB for
    3,325 chunks at 384 dimensions): an exact ranking of the whole collection is a matrix product here
    (~0.5 ms) instead of a scan of every vector in the database (2.5-5 ms of its CPU, twice per hybrid
    search), and its hits need no rows read. Distances as pgvector's `<=>` computes them (float32
    products, the cosine in double, clamped)."""

    def __init__(self, generation: tuple, rows: list[tuple], matrix: np.ndarray):
        """`rows`: each chunk's HIT_COLUMNS values, in the order of `matrix`'s rows."""
        self.generation = generation
        self.checked = time.monotonic()  # when the generation was last found current
        self.rows = rows
        self.ids = [r[0] for r in rows]
        self.paths = [r[3] for r in rows]
        self.position = {cid: i for i, cid in enumerate(self.ids)}
        self.doc_rows: dict[str, list[int]] = {}
        for i, path in enumerate(self.paths):
            self.doc_rows.setdefault(path, []).append(i)
        self.matrix = matrix
        self.squares = np.einsum("ij,ij->i", matrix, matrix).astype(np.float64)

    def hit(self, i: int, distance: float, similarity: float) -> SearchHit:
        """Row `i` as a fresh SearchHit (score and similarity as the database's ranking gives them)."""
        # built directly (a hybrid search builds ~100): through a dict per row it was 7% of a busy
        # server process's GIL samples; each hit gets its own metadata, as when read from the database
        # (chunk metadata is flat: line, part, section title)
        (chunk_id, text, doc_id, path, section, section_path, unit_id, doc_type, collection, ticker, doc_date,
         metadata) = self.rows[i]
        return SearchHit(chunk_id, max(0.0, 1.0 - distance), text, doc_id, path, section, section_path, unit_id,
                         doc_type, collection, ticker, doc_date, dict(metadata or {}), similarity=similarity)

    def distances(self, target: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
        """Cosine distances of `target` to every row, or to the rows at positions `rows`."""
        t = np.asarray(target, dtype=np.float32)
        m, sq = (self.matrix, self.squares) if rows is None else (self.matrix[rows], self.squares[rows])
        with np.errstate(invalid="ignore", divide="ignore"):  # a zero vector: NaN, as in pgvector
            # einsum, not `m @ t`: OpenBLAS ran the product on several threads that spun after it
            # beside the search's own (34 instead of 8 ms of the server's CPU per hybrid search)
            sim = np.einsum("ij,j->i", m, t).astype(np.float64) / np.sqrt(sq * float(np.einsum("i,i->", t, t)))
        return 1.0 - np.clip(sim, -1.0, 1.0)


HELD_COLLECTIONS = 2  # a process holds at most this many times search.exact_max_rows chunks (LRU)
# A held collection's generation is checked again when its last check is older than this: a busy
# process checks a few times a second, not once per search; a search sees other processes' writes
# as one that started this much earlier would.
RECHECK_SECONDS = 0.1


# The chunks of filters other than a collection alone are held from their second search within this
# many seconds: reading them cost 2-4 times one exact ranking in the database (490 chunks: 19-24 ms
# against 5-11; 5,000: 146 ms against 35), and a held copy ranks both passes of a hybrid search in
# ~1 ms. A filter used once stays in the database.
REPEAT_SECONDS = 60.0


class HeldVectorsCache:
    """The store's `HeldVectors` per (scope, space), least recently used dropped first beyond
    HELD_COLLECTIONS x `search.exact_max_rows` vectors; loaded by one thread at a time."""

    def __init__(self) -> None:
        self.entries: OrderedDict[tuple[tuple[str, str], str], HeldVectors] = OrderedDict()  # (scope key, space)
        self.lock = threading.Lock()
        self._asked: dict[tuple[tuple[str, str], str], float] = {}  # filters' scopes: when last searched

    def wanted(self, key: tuple[tuple[str, str], str], first_pass: bool) -> bool:
        """Whether a search of `key` ranks from held rows: a collection's always; other filters' once
        held, or from a first pass within REPEAT_SECONDS of another (see there)."""
        if key[0][0] == "collection" or key in self.entries:
            return True
        if not first_pass:  # feedback follows its own first pass: not a repeat
            return False
        now = time.monotonic()
        last = self._asked.get(key)
        _forget_expired(self._asked, now, REPEAT_SECONDS, stamp=lambda t: t)
        self._asked[key] = now
        return last is not None and now - last < REPEAT_SECONDS

    def get(self, key: tuple[tuple[str, str], str]) -> HeldVectors | None:
        held = self.entries.get(key)
        if held is not None:
            try:
                self.entries.move_to_end(key)
            except KeyError:  # dropped meanwhile by another thread's put (reads take no lock)
                pass
        return held

    def recheck(self) -> None:
        """This process changed documents: every held collection checks its generation at its next
        search (a process reads its own writes at once; other processes' within RECHECK_SECONDS)."""
        with self.lock:
            for held in list(self.entries.values()):  # copied: reads reorder it without the lock
                held.checked = float("-inf")

    def put(self, key: tuple[tuple[str, str], str], held: HeldVectors, max_rows: int) -> None:
        """Hold `held` under `key` (callers hold `lock`)."""
        self.entries[key] = held
        self.entries.move_to_end(key)
        while len(self.entries) > 1 and sum(len(h.ids) for h in list(self.entries.values())) > max_rows:
            self.entries.popitem(last=False)


class _VectorBytes(Loader):
    """A vector column's binary value as bytes (pgvector's format: dimensions and a reserved word as
    two big-endian uint16, then the big-endian float32 values)."""

    format = Format.BINARY

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


def _matrix(values: list[bytes]) -> np.ndarray:
    """The float32 matrix of same-dimension vectors in pgvector's binary format."""
    if not values:
        return np.zeros((0, 0), dtype=np.float32)
    width = len(values[0])
    if any(len(v) != width for v in values):
        raise ValueError("vectors of different dimensions in one space")
    rows = np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), width)
    return rows[:, 4:].copy().view(">f4").astype(np.float32)


def _forget_expired(entries: dict, now: float, ttl: float, stamp: Callable[[Any], float]) -> None:
    """Drop the entries whose `stamp` is `ttl` seconds old or more, once `entries` holds REMEMBERED_MAX
    (many distinct filters). Iterates a copy: other threads may add entries meanwhile."""
    if len(entries) >= REMEMBERED_MAX:
        for key, value in list(entries.items()):
            if now - stamp(value) >= ttl:
                entries.pop(key, None)


def _nearest(distances: np.ndarray, k: int) -> np.ndarray:
    """Positions of the `k` smallest distances, nearest first."""
    if k < len(distances):
        part = np.argpartition(distances, k)[:k]
        return part[np.argsort(distances[part], kind="stable")]
    return np.argsort(distances, kind="stable")


def nearest_sql(distance: sql.Composable, target_args: list[Any], space: str, where: sql.Composable,
                params: list[Any], limit: int, whole: bool, moved: bool) -> tuple[sql.Composable, list[Any]]:
    """The ranking: (chunk_id, distance) of the `limit` nearest chunks the filter `where` keeps, and
    its arguments. `whole` (an exact ranking over most of the space, see `_scans_whole_space`): each
    distance is computed as the vector is read (OFFSET 0 keeps it below the join), then the filter's
    rows are kept, so no vector is hashed; otherwise the filtered rows are joined to their vectors
    (index lookups, or the HNSW walk for a non-exact `distance`). `moved`: the target is the CTE
    `moved`, which may be empty."""
    guard = sql.SQL(" AND (SELECT m FROM moved) IS NOT NULL") if moved else sql.SQL("")
    if whole:
        query = sql.SQL(
            "SELECT d.chunk_id, d.distance FROM (SELECT v.chunk_id, {dist} AS distance"
            " FROM rag_chunk_vectors v WHERE v.space = {space} OFFSET 0) d JOIN rag_chunks c USING (chunk_id)"
            " WHERE {where}{guard} ORDER BY d.distance LIMIT %s")
        args = [*target_args, *params, limit]
    else:
        query = sql.SQL(
            "SELECT v.chunk_id, {dist} AS distance FROM rag_chunk_vectors v JOIN rag_chunks c USING (chunk_id)"
            " WHERE v.space = {space} AND {where}{guard} ORDER BY {dist} LIMIT %s")
        args = [*target_args, *params, *target_args, limit]
    return query.format(dist=distance, space=sql.Literal(space), where=where, guard=guard), args


class VectorStore:
    """Mixin: needs `self.db` (Connections) and `self.settings`."""

    # ---- spaces --------------------------------------------------------------------------

    def active_space(self) -> dict[str, Any] | None:
        with self.db.reading() as conn:
            row = conn.execute(
                "SELECT space, model, dimensions, provider FROM rag_spaces WHERE status = 'active'"
            ).fetchone()
        return dict(zip(("space", "model", "dimensions", "provider"), row)) if row else None

    def ensure_space(self, space: str, model: str, dimensions: int, provider: str, chunker: str | None = None) -> None:
        """Register the configured space; the first one becomes active. A configured space that
        differs from the active one is a fatal error: mixing spaces would corrupt search. `chunker`
        (`rag_lib.tokens.chunker_key` of the provider's tokenizer) is recorded as the space's."""
        with self.db.connection() as conn, conn.transaction():
            conn.execute("LOCK TABLE rag_spaces IN SHARE ROW EXCLUSIVE MODE")
            active = conn.execute(
                "SELECT space, dimensions, provider, model, chunker FROM rag_spaces WHERE status = 'active'").fetchone()
            if active is None:
                conn.execute(
                    """INSERT INTO rag_spaces (space, model, dimensions, provider, status, activated_at, chunker)
                       VALUES (%s,%s,%s,%s,'active', now(), %s)
                       ON CONFLICT (space) DO UPDATE SET status = 'active', activated_at = now(),
                         chunker = coalesce(EXCLUDED.chunker, rag_spaces.chunker)""",
                    (space, model, dimensions, provider, chunker),
                )
            elif active[0] == space and chunker and active[4] != chunker:
                conn.execute("UPDATE rag_spaces SET chunker = %s WHERE space = %s", (chunker, space))
            elif active[0] != space:
                raise DimensionMismatchError(
                    f"the configured embedding space {space} differs from the stored active space {active[0]}"
                    f"{_same_name_note(model, active[3])}; "
                    f"run `rag reembed --to {space}` to re-embed into it while search keeps serving {active[0]}, "
                    f"or configure the active space's provider: embedding.provider {active[2]}, model {active[3]}, "
                    f"dimensions {active[1]} (and its base_url for a remote provider; `rag reembed --status` lists "
                    "the spaces)"
                )

    # ---- cache ---------------------------------------------------------------------------

    def cache_get(self, hashes: Sequence[str], model: str, dimensions: int) -> dict[str, np.ndarray]:
        if not hashes:
            return {}
        with self.db.connection() as conn:
            rows = conn.execute(
                """UPDATE rag_embedding_cache SET last_used_at = now()
                   WHERE content_hash = ANY(%s) AND model = %s AND dimensions = %s
                   RETURNING content_hash, embedding""",
                (list(set(hashes)), model, dimensions),
            ).fetchall()
        return {h: as_array(v) for h, v in rows}

    def cache_put(self, items: dict[str, np.ndarray], model: str, dimensions: int) -> None:
        if not items:
            return
        with self.db.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute(
                "CREATE TEMP TABLE IF NOT EXISTS _cache_in (content_hash text, embedding vector) ON COMMIT DELETE ROWS"
            )
            copy_rows(cur, "_cache_in (content_hash, embedding)", ["text", "vector"], items.items())
            cur.execute(
                """INSERT INTO rag_embedding_cache (content_hash, model, dimensions, embedding)
                   SELECT content_hash, %s, %s, embedding FROM _cache_in
                   ON CONFLICT DO NOTHING""",
                (model, dimensions),
            )

    # ---- HNSW ----------------------------------------------------------------------------

    def ensure_hnsw_index(self, space: str, dimensions: int, rebuild: bool = False) -> dict[str, Any]:
        """Create the space's partial HNSW index if missing (or rebuild it); record the build."""
        name = index_name(space)
        s = self.settings.search
        started = time.perf_counter()
        opclass = f"{s.vector_type}_cosine_ops"
        with self.db.connection() as conn:
            conn.autocommit = True
            try:
                built = conn.execute("SELECT pg_get_indexdef(to_regclass(%s))", (name,)).fetchone()[0]
                if built is not None and not rebuild:
                    if f" {opclass}" in built:
                        return {"index": name, "created": False}
                    rebuild = True  # search.vector_type changed: queries cast to the other type now
                if built is not None:
                    # Dropped on its own: searches go on (unindexed) while the new one builds.
                    conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(name)))
                with conn.transaction():
                    # One builder per space: concurrent runs finishing together wait here and find
                    # it built. A transaction lock, not a session one: PgBouncer's transaction
                    # pooling may hand the session to someone else between statements.
                    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"hnsw\x1f{space}",))
                    # Read pg_class itself: to_regclass would answer from this session's catalog cache,
                    # which an advisory lock does not refresh, and miss the index another builder just
                    # committed (CREATE INDEX then failed with DuplicateTable).
                    if conn.execute("SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = %s"
                                    " AND relnamespace = current_schema()::regnamespace)", (name,)).fetchone()[0]:
                        return {"index": name, "created": False}
                    # Parallel workers (up to the server's max_parallel_maintenance_workers) from 1 MB
                    # of vectors (~600 chunks), not only from the default 8 MB: an ingest builds the
                    # index after its last document, when nothing else needs the cores (the shared
                    # corpus's 3,325 chunks: 5.2 -> 3.2 s on 2 busy cores).
                    conn.execute("SET LOCAL min_parallel_table_scan_size = '1MB'")
                    conn.execute(
                        sql.SQL(
                            "CREATE INDEX {} ON rag_chunk_vectors USING hnsw ((embedding::{}) {})"
                            " WITH (m = {}, ef_construction = {}) WHERE space = {}"
                        ).format(
                            sql.Identifier(name), vector_sql_type(s.vector_type, dimensions), sql.Identifier(opclass),
                            sql.Literal(s.hnsw_m),
                            sql.Literal(s.hnsw_ef_construction), sql.Literal(space),
                        )
                    )
                    rows = conn.execute("SELECT count(*) FROM rag_chunk_vectors WHERE space = %s",
                                        (space,)).fetchone()[0]
                    seconds = time.perf_counter() - started
                    conn.execute(
                        """INSERT INTO rag_index_builds (space, index_name, m, ef_construction, rows_indexed, build_seconds)
                           VALUES (%s,%s,%s,%s,%s,%s)""",
                        (space, name, s.hnsw_m, s.hnsw_ef_construction, rows, seconds),
                    )
            finally:
                conn.autocommit = False
        return {"index": name, "created": True, "rows": rows, "seconds": seconds}

    def drop_hnsw_index(self, space: str) -> bool:
        """Drop the space's HNSW index (before a bulk load: one build afterwards beats 100k inserts)."""
        name = index_name(space)
        with self.db.connection() as conn:
            if conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None:
                return False
            conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
            return True

    # ---- semantic search -----------------------------------------------------------------

    def ef_search(self, space: str) -> int:
        """The hnsw.ef_search of searches in `space`: `search.ef_search`, or when that is 0 scaled with
        the rows of the space's HNSW index (`scaled_ef_search`), from the index's row estimate in
        pg_class (set by its build, kept by VACUUM and ANALYZE), read at most once per SCAN_TTL."""
        fixed = self.settings.search.ef_search
        if fixed:
            return fixed
        key = ("ef_search", space)
        now = time.monotonic()
        hit = self.scan_decisions.get(key)
        if hit is None or now - hit[0] >= SCAN_TTL:
            with self.db.reading() as conn:
                row = conn.execute("SELECT reltuples FROM pg_class WHERE oid = to_regclass(%s)",
                                   (index_name(space),)).fetchone()
                rows = float(row[0]) if row else 0.0  # no index: nothing walks it
                if rows < 0:  # never counted (-1): count the space's vectors
                    rows = conn.execute("SELECT count(*) FROM rag_chunk_vectors WHERE space = %s",
                                        (space,)).fetchone()[0]
            hit = self.scan_decisions[key] = (now, rows)
        return scaled_ef_search(hit[1])

    def semantic_scan(self, filters: SearchFilters) -> str:
        """'exact' when the filters leave at most `search.exact_max_rows` chunks, else 'hnsw'."""
        with self.db.connection() as conn:
            return self._scan_for(conn, *_filter_sql(filters))[0]

    def _scan_for(self, conn: psycopg.Connection, where: sql.Composable, params: list[Any],
                  filters: SearchFilters | None = None) -> tuple[str, int | None]:
        """The scan, and the chunks the filters leave when it is 'exact' (None: more, or unknown)."""
        if not params:
            return "hnsw", None
        # Decided once per SCAN_TTL for the same filters (a collection alone: every KnowledgeBase
        # search; an analyst's or agent's ticker over several questions): counting the filtered rows
        # is a round trip and up to exact_max_rows index entries per search otherwise.
        cap = self.settings.search.exact_max_rows
        key = ("scan", cap, repr(filters)) if filters is not None else None
        now = time.monotonic()
        if key is not None and (hit := self.scan_decisions.get(key)) and now - hit[0] < SCAN_TTL:
            return hit[1]
        # counted up to cap + 1: an index-only scan for the usual filters, well under a millisecond
        query = sql.SQL("SELECT count(*) FROM (SELECT 1 FROM rag_chunks c WHERE {} LIMIT %s) s").format(where)
        rows = conn.execute(query, [*params, cap + 1]).fetchone()[0]
        decision = ("exact", rows) if rows <= cap else ("hnsw", None)
        if key is not None:
            _forget_expired(self.scan_decisions, now, SCAN_TTL, stamp=lambda v: v[0])
            self.scan_decisions[key] = (now, decision)
        return decision

    def _scans_whole_space(self, conn: psycopg.Connection, space: str, rows: int) -> bool:
        """Whether an exact ranking of `rows` filtered chunks computes the distance of
        every vector of `space` instead of joining the filtered rows to their vectors first: when the
        space holds at most SPACE_SCAN_RATIO vectors per filtered row. Joined first, PostgreSQL hashed
        the vectors (5 MB for 3,325 chunks, copied into fresh memory on every query) and computed
        the distances from the hash table: 5.9 ms of the server's CPU against 2.5 ms (benchmark
        collection, a collection-only filter). The space's size is counted up to what matters, once
        per SCAN_TTL."""
        limit = SPACE_SCAN_RATIO * self.settings.search.exact_max_rows + 1
        key = ("space", space, limit)
        now = time.monotonic()
        hit = self.scan_decisions.get(key)
        if hit is None or now - hit[0] >= SCAN_TTL:
            size = conn.execute("SELECT count(*) FROM (SELECT 1 FROM rag_chunk_vectors WHERE space = %s LIMIT %s) s",
                                (space, limit)).fetchone()[0]
            hit = self.scan_decisions[key] = (now, size)
        return hit[1] <= SPACE_SCAN_RATIO * rows

    def semantic_search(
        self,
        vector: np.ndarray,
        space: str,
        dimensions: int,
        filters: SearchFilters,
        limit: int,
        min_similarity: float = 0.0,
        exact: bool = False,
        toward: Sequence[str] = (),
        weight: float = 0.0,
        pool: int = 0,
        among: Sequence[str] | None = None,
        scan: tuple[str, int | None] | None = None,
        cosines: Sequence[str] = (),
    ) -> SemanticHits:
        """Nearest chunks by cosine similarity (score = max(0, cos)). HNSW with iterative scans, except
        when `exact` or when the filters leave at most `search.exact_max_rows` chunks: those are
        ranked exactly, which finds what a graph walk from the query misses, and sooner. An exact
        ranking with `pool` also returns the ids of the `pool` nearest chunks (`.pool`), at almost
        no cost: it has scored every row already.

        With `toward` (chunk ids) and `weight`, pseudo-relevance feedback: the ranking is by the
        query's vector plus `weight` times the mean stored vector of those chunks (a Rocchio step),
        which the database computes in the same round trip (the vectors never travel); `similarity`
        and `min_similarity` stay the cosine with the query itself. Nothing when none of them has a
        vector in the space. With `among` as well, only those chunks and the chunks of the
        documents holding `toward` (the filters still apply) are ranked, exactly: a first pass's
        pool re-scored instead of every filtered row ranked again.

        `scan`: the decision an earlier search with the same filters got (its hits' `.scan`), so the
        filtered rows are not counted again (feedback's query follows the first pass's within the
        same search). `cosines` (chunk ids): with `toward`, the query's cosine with each of them is
        read in the same round trip (`.cosines`; the full-text hits' similarity, looked up otherwise
        once the search is done)."""
        where, params = _filter_sql(filters)
        s = self.settings.search
        moved = bool(toward) and weight > 0
        scan, rows = scan if scan is not None else (None, None)
        scope = HeldScope.of(filters, where, params) if s.rank_in_process and params else None
        if scope is not None and self.held_vectors.wanted((scope.key, space), first_pass=not moved):
            with self.db.reading() as conn:
                if scan is None:
                    scan, rows = self._scan_for(conn, where, params, filters)
                if scan == "exact":
                    hits = self._held_search(conn, vector, space, scope, limit, min_similarity,
                                             toward if moved else (), weight,
                                             pool if not moved and 2 * pool <= rows else 0, among)  # as below
                    if hits is not None:
                        hits.scan = (scan, rows)
                        return hits
        if moved and among is not None:
            hits = self._feedback_among(vector, space, where, params, limit, min_similarity, toward, weight, among,
                                        cosines)
            hits.scan = (scan, rows) if scan is not None else None
            return hits
        decided = None if exact else scan
        whole = False
        if exact or scan != "hnsw":  # a graph walk decided earlier needs nothing more here
            with self.db.reading() as conn:
                if not exact:
                    if scan is None:  # not decided above nor before
                        scan, rows = self._scan_for(conn, where, params, filters)
                    decided, exact = scan, scan == "exact"
                # no filter: every vector is ranked anyway; `exact=True` with filters: counted here
                counted = rows if rows is not None or not (exact and params) else self._scan_for(conn, where, params)[1]
                whole = exact and (not params or (counted is not None and self._scans_whole_space(conn, space, counted)))
        # a pool of more than half the rows would save its re-scoring little over ranking them all
        pool = pool if exact and not moved and (rows is None or 2 * pool <= rows) else 0
        with self.db.pipelined() as conn:
            # pipelined: the settings and the query go to the server in one round trip, as one transaction.
            # The ranking carries only ids and distances; the chunks' text and metadata are read for the
            # rows kept: an exact ranking carried them for every row it sorted (3,325 here), which
            # was over half of the query's time (EXPLAIN ANALYZE 35 -> 12 ms on the shared corpus)
            local = {"jit": "off"}  # compiling costs more than it saves on these queries
            # cosine distance ignores length: query/weight + mean ranks like query + weight x mean
            target = sql.SQL("(SELECT m FROM moved)") if moved else sql.SQL("%s::vector")
            if exact:
                # The untyped expression matches no HNSW index (they are on embedding::vector(d)), so
                # the planner ranks the filtered rows exactly and can still use the filter indexes.
                distance = sql.SQL("v.embedding <=> {}").format(target)
            else:
                t = vector_sql_type(s.vector_type, dimensions)
                distance = sql.SQL("v.embedding::{t} <=> {x}::{t}").format(t=t, x=target)
                ef = s.feedback_ef_search if moved and s.feedback_ef_search else self.ef_search(space)
                local.update({"hnsw.ef_search": str(max(ef, limit)), "hnsw.iterative_scan": "relaxed_order",
                              "hnsw.max_scan_tuples": str(s.max_scan_tuples)})
            conn.execute("SELECT " + ", ".join(["set_config(%s, %s, true)"] * len(local)),
                         [v for pair in local.items() for v in pair])
            if not moved:
                # with a pool, the ranking keeps its `pool` nearest ids; the first row carries them
                nearest, nearest_args = nearest_sql(distance, [vector], space, where, params, max(limit, pool), whole,
                                                    moved=False)
                query = sql.SQL(
                    "WITH nearest AS MATERIALIZED ({nearest}),"
                    " head AS (SELECT * FROM nearest ORDER BY distance LIMIT %s)"
                    " SELECT {cols}, n.distance, 1 - n.distance AS similarity,"
                    "  CASE WHEN %s AND row_number() OVER (ORDER BY n.distance) = 1"
                    "  THEN (SELECT array_agg(chunk_id ORDER BY distance) FROM nearest) END AS pool"
                    " FROM head n JOIN rag_chunks c USING (chunk_id)"
                    " WHERE 1 - n.distance >= %s ORDER BY n.distance"
                ).format(cols=HIT_COLUMNS, nearest=nearest)
                args = [*nearest_args, limit, pool > 0, min_similarity]
            else:
                nearest, nearest_args = nearest_sql(distance, [], space, where, params, limit, whole, moved=True)
                # the query's own cosine only for the rows kept (not for every row an exact ranking sorts)
                query = sql.SQL(
                    "WITH moved AS MATERIALIZED (SELECT %s::vector + avg(embedding) AS m FROM rag_chunk_vectors"
                    "  WHERE space = {space} AND chunk_id = ANY(%s)),"
                    " nearest AS MATERIALIZED ({nearest}),"
                    " scored AS (SELECT n.*, 1 - (v.embedding <=> %s::vector) AS similarity FROM nearest n"
                    "  JOIN rag_chunk_vectors v ON v.space = {space} AND v.chunk_id = n.chunk_id)"
                    " SELECT {cols}, s.distance, s.similarity, NULL AS pool FROM scored s JOIN rag_chunks c USING (chunk_id)"
                    " WHERE %s <= 0 OR s.similarity >= %s ORDER BY s.distance"
                ).format(cols=HIT_COLUMNS, nearest=nearest, space=sql.Literal(space))
                args = [np.asarray(vector, dtype=np.float32) / weight, list(toward), *nearest_args, vector,
                        min_similarity, min_similarity]
            cur = conn.execute(query, args)
            # pipelined too: no round trip of its own
            known = conn.execute(_COSINES, [vector, space, list(cosines)]) if moved and cosines else None
        # no row (none as similar as min_similarity asks): no pool, and a feedback step ranks afresh
        hits = _hits(cur, known)
        hits.scan = (decided, rows) if decided is not None else None
        return hits

    # ---- exact rankings in the process ---------------------------------------------------

    def _held(self, conn: psycopg.Connection, scope: HeldScope, space: str, stale: tuple | None = None) -> HeldVectors:
        """The scope's held vectors in `space`, read again when missing or when their generation is
        `stale` (a search found the documents changed). Read in one snapshot with their generation."""
        cache = self.held_vectors
        key = (scope.key, space)
        held = cache.get(key)  # without the lock: a search of held rows does not wait for another's read
        if held is not None and (stale is None or held.generation != stale):
            return held
        with cache.lock:  # concurrent searches wait for one read instead of each reading it all
            held = cache.get(key)
            if held is not None and (stale is None or held.generation != stale):
                return held
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                generation = scope.generation(conn)
                with conn.cursor(binary=True) as cur:  # binary: numpy arrays without parsing text
                    # each vector as its bytes, made one matrix below: pgvector's loader builds a
                    # Vector per row (7 us; 36 of the 78 ms reading 4,840 chunks)
                    cur.adapters.register_loader(conn.adapters.types["vector"].oid, _VectorBytes)
                    rows = cur.execute(sql.SQL(
                        "SELECT {cols}, v.embedding FROM rag_chunk_vectors v JOIN rag_chunks c USING (chunk_id)"
                        " WHERE v.space = %s AND {where}").format(cols=HIT_COLUMNS, where=scope.where),
                        (space, *scope.params)).fetchall()
            # in chunk order, sorted here: the server sorted the wide rows on disk (+20 ms for 4,840)
            rows.sort(key=lambda r: r[0])
            held = HeldVectors(generation, [r[:-1] for r in rows], _matrix([r[-1] for r in rows]))
            cache.put(key, held, HELD_COLLECTIONS * self.settings.search.exact_max_rows)
            return held

    def _held_search(self, conn: psycopg.Connection, vector: np.ndarray, space: str, scope: HeldScope, limit: int,
                     min_similarity: float, toward: Sequence[str], weight: float, pool: int,
                     among: Sequence[str] | None) -> SemanticHits | None:
        """`semantic_search` over a scope (a whole collection, or the chunks some filters leave), ranked
        exactly in the process (see `HeldVectors`): the same hits, scores, similarities and pool as
        the database's ranking, from the held rows. The scope's generation is checked first (at most
        every RECHECK_SECONDS): when its documents changed since the rows were read, they are read
        again. None when they keep changing (the caller ranks in the database)."""
        held = self._held(conn, scope, space)
        for _ in range(3):
            if time.monotonic() - held.checked < RECHECK_SECONDS:
                break
            checked = time.monotonic()
            if scope.generation(conn) == held.generation:
                held.checked = checked
                break
            held = self._held(conn, scope, space, stale=held.generation)
        else:
            return None
        order, distance, similarity, nearest = self._held_rank(held, vector, limit, toward, weight, pool, among)
        kept = [i for i in order if min_similarity <= 0 or similarity[i] >= min_similarity] \
            if toward else [i for i in order if 1 - distance[i] >= min_similarity]
        hits = SemanticHits(held.hit(i, float(distance[i]), float(similarity[i])) for i in kept)
        if hits and pool > 0:
            hits.pool = [held.ids[i] for i in nearest]
        return hits

    @staticmethod
    def _held_rank(held: HeldVectors, vector: np.ndarray, limit: int, toward: Sequence[str], weight: float,
                   pool: int, among: Sequence[str] | None) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray]:
        """(positions of the `limit` nearest rows, distances, cosines with the query, positions of the
        `pool` nearest) as `semantic_search` ranks them in the database; `toward`: by the moved vector,
        among `among` and the chunks of the documents holding `toward` when given (`_feedback_among`)."""
        n = len(held.ids)
        if n == 0:
            return [], np.empty(0), np.empty(0), np.empty(0, dtype=np.int64)
        if not toward:
            distance = held.distances(vector)
            nearest = _nearest(distance, min(max(limit, pool), n))
            return list(nearest[:limit]), distance, 1.0 - distance, nearest
        seeds = list(dict.fromkeys(held.position[c] for c in toward if c in held.position))
        if not seeds:  # no vector for any of them: nothing (the first pass stands)
            return [], np.empty(0), np.empty(0), np.empty(0, dtype=np.int64)
        # as the database: query / weight + the mean stored vector (a float32 vector)
        moved = np.asarray(vector, dtype=np.float32) / np.float32(weight) \
            + held.matrix[seeds].mean(axis=0, dtype=np.float64).astype(np.float32)
        if among is None:
            rows = np.arange(n)
        else:  # the pool and full-text hits, and the chunks of the documents holding `toward`, bounded
            docs = [i for c in toward if c in held.position for i in held.doc_rows[held.paths[held.position[c]]]]
            picked = dict.fromkeys(held.position[c] for c in among if c in held.position)
            picked.update(dict.fromkeys(docs[:max(limit, len(among))]))
            rows = np.fromiter(picked, dtype=np.int64, count=len(picked))
        distance = np.full(n, np.nan)
        distance[rows] = held.distances(moved, rows)
        order = rows[_nearest(distance[rows], min(limit, len(rows)))]
        similarity = np.full(n, np.nan)
        similarity[order] = 1.0 - held.distances(vector, order)
        return list(order), distance, similarity, order

    def _feedback_among(self, vector: np.ndarray, space: str, where: sql.Composable, params: list[Any], limit: int,
                        min_similarity: float, toward: Sequence[str], weight: float,
                        among: Sequence[str], cosines: Sequence[str] = ()) -> SemanticHits:
        """Feedback's ranking (see `semantic_search`) of `among` and of the chunks of the documents
        holding `toward`, exactly: a few hundred rows, not every filtered row again; with the query's
        `cosines` to those chunks."""
        among_sql, among_arg = text_array(among)
        asked_sql, asked_arg = text_array(cosines) if cosines else (sql.SQL("%s::text[]"), [])
        candidates = set(among)
        elsewhere = [c for c in cosines if c not in candidates]  # read apart (search asks for none)
        with self.db.pipelined() as conn:
            conn.execute("SELECT set_config('jit', 'off', true)")  # as in semantic_search
            # Each candidate's vector is read once (looked up by key: joined, the planner read every
            # vector of a small space and hashed the matches, 5-10 ms, not 1) for both its distance to
            # the moved vector and its cosine with the query; the cosines asked for of candidates (the
            # full-text hits are) ride on the first row: no second statement reading those vectors
            # again (feedback 4.3 -> 3.9 ms p50 at 100k). The documents' chunks are bounded like the
            # pool: a long guide has hundreds.
            query = sql.SQL(
                "WITH moved AS MATERIALIZED (SELECT %s::vector + avg(embedding) AS m FROM rag_chunk_vectors"
                "  WHERE space = {space} AND chunk_id = ANY(%s)),"
                " candidates AS (SELECT unnest({among}) AS chunk_id UNION (SELECT d.chunk_id FROM rag_chunks t"
                "  JOIN rag_chunks d ON d.collection = t.collection AND d.path = t.path WHERE t.chunk_id = ANY(%s)"
                "  LIMIT %s)),"
                " fetched AS MATERIALIZED (SELECT a.chunk_id, (SELECT v.embedding FROM rag_chunk_vectors v"
                "  WHERE v.space = {space} AND v.chunk_id = a.chunk_id) AS e FROM candidates a"
                "  WHERE (SELECT m FROM moved) IS NOT NULL),"
                " scored AS MATERIALIZED (SELECT chunk_id, e <=> (SELECT m FROM moved) AS distance,"
                "  1 - (e <=> %s::vector) AS similarity FROM fetched WHERE e IS NOT NULL),"
                " nearest AS (SELECT {cols}, s.distance, s.similarity FROM scored s JOIN rag_chunks c USING (chunk_id)"
                "  WHERE {where} ORDER BY s.distance LIMIT %s),"
                " asked AS (SELECT array_agg(chunk_id) AS ids, array_agg(similarity) AS cosines FROM scored"
                "  WHERE chunk_id = ANY({asked}))"
                " SELECT n.*, NULL AS pool,"
                "  CASE WHEN row_number() OVER w = 1 THEN a.ids END AS asked,"
                "  CASE WHEN row_number() OVER w = 1 THEN a.cosines END AS asked_cosines"
                " FROM nearest n, asked a WHERE %s <= 0 OR n.similarity >= %s"
                " WINDOW w AS (ORDER BY n.distance) ORDER BY n.distance"
            ).format(cols=HIT_COLUMNS, space=sql.Literal(space), where=where, among=among_sql, asked=asked_sql)
            cur = conn.execute(query, [np.asarray(vector, dtype=np.float32) / weight, list(toward), among_arg,
                                       list(toward), max(limit, len(among)), vector, *params, limit,
                                       asked_arg, min_similarity, min_similarity])
            known = conn.execute(_COSINES, [vector, space, elsewhere]) if elsewhere else None
        return _hits(cur, known)

    def held_similarities(self, vector: np.ndarray, space: str, collection: str,
                          chunk_ids: Sequence[str]) -> dict[str, float]:
        """Cosine similarity of `vector` to each of `chunk_ids` that this process holds the vector of
        (`HeldVectors`, as a search of the whole collection left them), without a query; chunks not
        held are left out."""
        held = self.held_vectors.entries.get((_collection_key(collection), space))  # no LRU touch: a read beside searches
        rows = [held.position[c] for c in chunk_ids if c in held.position] if held is not None else []
        if not rows:
            return {}
        distances = held.distances(vector, np.asarray(rows))
        return {held.ids[r]: float(max(0.0, 1.0 - d)) for r, d in zip(rows, distances)}

    def similarities(self, vector: np.ndarray, space: str, chunk_ids: Sequence[str]) -> dict[str, float]:
        """Cosine similarity of `vector` to each chunk's stored vector in `space` (chunks found by
        full text, or by another query, get the same measure as semantic hits)."""
        if not chunk_ids:
            return {}
        with self.db.reading() as conn:
            rows = conn.execute(_COSINES, [vector, space, list(chunk_ids)]).fetchall()
        return {cid: float(sim) for cid, sim in rows}
