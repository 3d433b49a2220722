"""SQL for the knowledge graph: writing a document's edges inside its publish transaction, removing
nodes left without edges, bounded walks (recursive CTEs) and the data-quality queries."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from rag_lib.errors import LimitExceededError, QueryTimeoutError
from rag_lib.models import Document, DocumentGraph, GraphNode
from rag_lib.store.connection import like_escape

MAX_FANOUT = 100  # edges followed out of one node per step: hubs (a ticker in 1000 docs) stay cheap
MAX_ROWS = 1000  # edges one walk may return (an agent or a screen reads no more)

# Edges reached within `depth` steps of `start`, either direction, never revisiting a node on a trail;
# at most `fanout` edges out of one node per step and `rows` edges in all.
_WALK_SQL = """
WITH RECURSIVE walk(node, depth, trail, id, src, predicate, dst, path, section, role) AS (
    SELECT %(start)s::text, 0, ARRAY[%(start)s::text], NULL::bigint,
           NULL::text, NULL::text, NULL::text, NULL::text, NULL::text, NULL::text
  UNION ALL
    SELECT nxt.other, w.depth + 1, w.trail || nxt.other, nxt.id,
           nxt.src, nxt.predicate, nxt.dst, nxt.path, nxt.section, nxt.role
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT e.id, e.dst AS other, e.src, e.predicate, e.dst, e.path, e.section, e.role
            FROM rag_graph_edges e
            WHERE e.collection = %(c)s AND e.src = w.node
              AND (%(preds)s::text[] IS NULL OR e.predicate = ANY(%(preds)s))
              AND NOT (e.predicate = ANY(%(excl)s))
            UNION ALL
            SELECT e.id, e.src, e.src, e.predicate, e.dst, e.path, e.section, e.role
            FROM rag_graph_edges e
            WHERE e.collection = %(c)s AND e.dst = w.node
              AND (%(preds)s::text[] IS NULL OR e.predicate = ANY(%(preds)s))
              AND NOT (e.predicate = ANY(%(excl)s))
        ) s LIMIT %(fanout)s
    ) nxt
    WHERE w.depth < %(depth)s AND NOT nxt.other = ANY(w.trail)
),
-- the edge's columns ride along the walk (read with the index lookups) rather than being fetched
-- again by id afterwards: that second lookup was three quarters of a hub walk's buffer reads
capped AS (SELECT * FROM walk WHERE id IS NOT NULL LIMIT %(rows)s)
SELECT src, predicate, dst, path, section, role, depth FROM (
    SELECT DISTINCT ON (id) src, predicate, dst, path, section, role, depth FROM capped ORDER BY id, depth) first_reach
ORDER BY depth, predicate, src, dst
"""

# One breadth-first step of a path search: the edges (either direction) of the frontier's nodes, at
# most `fanout` per node (hubs stay cheap) and `rows` in all (the caller's remaining budget + 1).
_PATH_STEP_SQL = """
SELECT f.node, s.id, s.other FROM unnest(%(frontier)s::text[]) AS f(node)
CROSS JOIN LATERAL (
    SELECT * FROM (
        SELECT e.id, e.dst AS other FROM rag_graph_edges e
        WHERE e.collection = %(c)s AND e.src = f.node AND NOT (e.predicate = ANY(%(excl)s))
        UNION ALL
        SELECT e.id, e.src FROM rag_graph_edges e
        WHERE e.collection = %(c)s AND e.dst = f.node AND NOT (e.predicate = ANY(%(excl)s))
    ) s LIMIT %(fanout)s
) s
LIMIT %(rows)s
"""


class GraphStore:
    """Mixin: needs `self.db` (Connections) and `self.settings`. `_graph_*` helpers run on the caller's connection."""

    # ---- writing (inside DocumentStore's transactions) -----------------------------------

    @staticmethod
    def _graph_keys(conn: psycopg.Connection, collection: str, paths: Sequence[str]) -> list[str]:
        rows = conn.execute(
            "SELECT src, dst FROM rag_graph_edges WHERE collection = %s AND path = ANY(%s)", (collection, list(paths))
        ).fetchall()
        return sorted({k for row in rows for k in row})

    @staticmethod
    def _graph_write(conn: psycopg.Connection, doc: Document, graph: DocumentGraph) -> None:
        """Insert the document's nodes (kept if present; a typed kind replaces `entity`), edges and
        aliases. One node per real thing: a name that another document declared to be a ticker or a
        document (a company name, a trade id) is written as that node, and nodes this document's
        aliases now identify are merged into their ticker or document node."""
        if graph.collection != doc.collection or graph.path != doc.path:
            raise ValueError(f"graph of {graph.collection}/{graph.path} published with document {doc.path}")
        c = doc.collection
        canon = GraphStore._canonical(conn, c, doc.path, [n.key for n in graph.nodes if _mergeable(n.key)])
        nodes = {n.key: n for n in graph.nodes if n.key not in canon}
        for key in set(canon.values()) - set(nodes):
            nodes[key] = GraphNode(key, "ticker" if key.startswith("ticker:") else "doc", key.split(":", 1)[1])
        edges = {(canon.get(e.src, e.src), e.predicate, canon.get(e.dst, e.dst)): e for e in graph.edges}
        aliases = {(a.alias, canon.get(a.key, a.key)): a.spelling for a in graph.aliases}
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO rag_graph_nodes (collection, key, kind, label) VALUES (%s, %s, %s, %s)
                   ON CONFLICT (collection, key) DO UPDATE SET kind = EXCLUDED.kind
                   WHERE rag_graph_nodes.kind = 'entity' AND EXCLUDED.kind <> 'entity'""",
                [(c, n.key, n.kind, n.label) for n in nodes.values()],
            )
            cur.executemany(
                """INSERT INTO rag_graph_edges (collection, path, section, src, predicate, dst, role, doc_hash)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
                [(c, doc.path, e.section, src, pred, dst, e.role, doc.content_hash)
                 for (src, pred, dst), e in edges.items() if src != dst],
            )
            cur.executemany(
                "INSERT INTO rag_graph_aliases (collection, path, alias, key, spelling) VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT DO NOTHING", [(c, doc.path, a, k, sp) for (a, k), sp in aliases.items()])
        GraphStore._merge_into(conn, c, {a: k for (a, k) in aliases if _mergeable(a) and not _mergeable(k)
                                         and a != k})

    @staticmethod
    def _canonical(conn: psycopg.Connection, collection: str, path: str, keys: Sequence[str]) -> dict[str, str]:
        """Entity keys other documents declared to name a ticker or a document → that node's key
        (a ticker wins over a document; then the first by key, so the choice is stable)."""
        if not keys:
            return {}
        rows = conn.execute(
            """SELECT DISTINCT ON (alias) alias, key FROM rag_graph_aliases
               WHERE collection = %s AND alias = ANY(%s) AND path <> %s
                 AND (key LIKE 'ticker:%%' OR key LIKE 'doc:%%')
               ORDER BY alias, key NOT LIKE 'ticker:%%', key""", (collection, list(keys), path)).fetchall()
        return {a: k for a, k in rows if a != k}

    @staticmethod
    def _merge_into(conn: psycopg.Connection, collection: str, names: dict[str, str]) -> None:
        """Point other documents' edges at entity node `alias` to `key` instead, and drop the entity
        node (the name was written before the document saying what it names)."""
        if not names:
            return
        found = [r[0] for r in conn.execute(
            "SELECT key FROM rag_graph_nodes WHERE collection = %s AND key = ANY(%s)",
            (collection, list(names))).fetchall()]
        for alias in found:
            params = {"c": collection, "a": alias, "k": names[alias]}
            for end, other in (("src", "dst"), ("dst", "src")):
                conn.execute(  # edges that would become duplicates (or loops) go first
                    f"""DELETE FROM rag_graph_edges e WHERE e.collection = %(c)s AND e.{end} = %(a)s
                        AND (e.{other} = %(k)s OR EXISTS (SELECT 1 FROM rag_graph_edges x
                             WHERE x.collection = e.collection AND x.path = e.path AND x.{end} = %(k)s
                               AND x.predicate = e.predicate AND x.{other} = e.{other}))""", params)
                conn.execute(f"UPDATE rag_graph_edges SET {end} = %(k)s WHERE collection = %(c)s AND {end} = %(a)s",
                             params)
            conn.execute("UPDATE rag_graph_aliases SET key = %(k)s WHERE collection = %(c)s AND key = %(a)s", params)
            conn.execute("DELETE FROM rag_graph_nodes WHERE collection = %(c)s AND key = %(a)s", params)

    @staticmethod
    def _graph_drop_orphans(conn: psycopg.Connection, collection: str, keys: Iterable[str]) -> int:
        """Delete those of `keys` no edge references any more."""
        keys = list(keys)
        if not keys:
            return 0
        return conn.execute(
            """DELETE FROM rag_graph_nodes n WHERE n.collection = %(c)s AND n.key = ANY(%(k)s)
                 AND NOT EXISTS (SELECT 1 FROM rag_graph_edges e WHERE e.collection = n.collection AND e.src = n.key)
                 AND NOT EXISTS (SELECT 1 FROM rag_graph_edges e WHERE e.collection = n.collection AND e.dst = n.key)""",
            {"c": collection, "k": keys},
        ).rowcount

    # ---- reading -------------------------------------------------------------------------

    def graph_nodes(self, collection: str, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Nodes by key, each with `aliases`: the other spellings documents give it."""
        with self.db.connection() as conn:
            rows = conn.execute(
                """SELECT n.key, n.kind, n.label, coalesce((
                       SELECT array_agg(DISTINCT a.spelling ORDER BY a.spelling) FROM rag_graph_aliases a
                       WHERE a.collection = n.collection AND a.key = n.key AND a.spelling <> n.label), '{}')
                   FROM rag_graph_nodes n WHERE n.collection = %s AND n.key = ANY(%s)""",
                (collection, list(keys)),
            ).fetchall()
        return {k: {"key": k, "kind": kind, "label": label, "aliases": list(aliases)}
                for k, kind, label, aliases in rows}

    def graph_predicates(self, collection: str) -> list[str]:
        """The predicates the collection's edges use, sorted."""
        with self.db.connection() as conn:
            return [r[0] for r in conn.execute(
                "SELECT DISTINCT predicate FROM rag_graph_edges WHERE collection = %s ORDER BY 1", (collection,))]

    def graph_labels_like(self, collection: str, text: str, limit: int = 3) -> list[str]:
        """Up to `limit` node labels containing `text` (any case), shortest first: suggestions when
        nothing is named `text`."""
        with self.db.connection() as conn:
            return [r[0] for r in conn.execute(
                "SELECT label FROM rag_graph_nodes WHERE collection = %s AND label ILIKE %s"
                " GROUP BY label ORDER BY length(label), label LIMIT %s",
                (collection, "%" + like_escape(text) + "%", limit))]

    def graph_find_node(self, collection: str, candidates: Sequence[str],
                        alias: str | None = None) -> dict[str, Any] | None:
        """The first of `candidates` (keys, in preference order) that exists, else the node `alias`
        (a normalised spelling) names (a ticker first), else a node whose label matches."""
        with self.db.connection() as conn:
            row = conn.execute(
                """SELECT key FROM rag_graph_nodes
                   WHERE collection = %s AND key = ANY(%s) ORDER BY array_position(%s, key) LIMIT 1""",
                (collection, list(candidates), list(candidates)),
            ).fetchone()
            if row is None and alias:
                row = conn.execute(
                    """SELECT a.key FROM rag_graph_aliases a JOIN rag_graph_nodes n
                         ON n.collection = a.collection AND n.key = a.key
                       WHERE a.collection = %s AND a.alias = %s
                       GROUP BY a.key ORDER BY a.key NOT LIKE 'ticker:%%', count(*) DESC, a.key LIMIT 1""",
                    (collection, alias)).fetchone()
            if row is None and candidates:
                row = conn.execute(
                    "SELECT key FROM rag_graph_nodes WHERE collection = %s AND lower(label) = lower(%s)"
                    " ORDER BY key LIMIT 1", (collection, candidates[-1]),
                ).fetchone()
        return self.graph_nodes(collection, [row[0]])[row[0]] if row else None

    def graph_walk(
        self,
        collection: str,
        start: str,
        depth: int,
        predicates: Sequence[str] | None = None,
        exclude: Sequence[str] = (),
        max_rows: int = MAX_ROWS,
        fanout: int = MAX_FANOUT,
    ) -> list[dict[str, Any]]:
        """Edges reached from `start` within `depth` steps (either direction), each with the depth at
        which it was first reached; cycle-safe (a walk never revisits a node) and capped."""
        return _dicts(self._graph_statement(
            _WALK_SQL, self._walk_params(collection, start, depth, predicates, exclude, max_rows, fanout)))

    def graph_walk_plan(self, collection: str, start: str, depth: int) -> list[str]:
        """EXPLAIN (ANALYZE, BUFFERS) of `graph_walk` (benchmarks, tuning)."""
        with self.db.connection() as conn:
            rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + _WALK_SQL,
                                self._walk_params(collection, start, depth, None, (), MAX_ROWS, MAX_FANOUT)).fetchall()
        return [r[0] for r in rows]

    @staticmethod
    def _walk_params(collection, start, depth, predicates, exclude, max_rows, fanout) -> dict[str, Any]:
        return {"start": start, "c": collection, "preds": list(predicates) if predicates else None,
                "excl": list(exclude), "depth": depth, "fanout": fanout, "rows": max_rows}

    def graph_path(self, collection: str, a: str, b: str, max_depth: int = 4,
                   exclude: Sequence[str] = (), fanout: int = 50) -> list[dict[str, Any]]:
        """Edges of a shortest path from `a` to `b` (either direction per edge), [] if none within `max_depth`.

        Breadth-first, one query per step, each node visited once: the work grows with the edges
        examined, not with the number of trails (a recursive CTE keeping a trail per row enumerated
        every simple path: 14 s on a 52-node complete graph). At most `graph.max_path_rows` edges in
        all (LimitExceededError beyond) and `graph.query_timeout_ms` per query (QueryTimeoutError)."""
        if a == b:
            return []
        max_rows = self.settings.graph.max_path_rows
        reached: dict[str, tuple[str, int]] = {}  # node -> (the node it was reached from, the edge)
        frontier, examined = [a], 0
        with self._graph_connection() as conn:
            for _ in range(max_depth):
                rows = conn.execute(_PATH_STEP_SQL, {"frontier": frontier, "c": collection, "fanout": fanout,
                                                     "excl": list(exclude), "rows": max_rows - examined + 1}).fetchall()
                examined += len(rows)
                if examined > max_rows:
                    raise LimitExceededError(
                        f"the path search from '{a}' to '{b}' needs more than graph.max_path_rows={max_rows} edges "
                        "(RAG_GRAPH__MAX_PATH_ROWS); ask for nodes closer together or raise the setting")
                nxt = []
                for node, edge_id, other in rows:
                    if other != a and other not in reached:
                        reached[other] = (node, edge_id)
                        nxt.append(other)
                if b in reached or not nxt:
                    break
                frontier = nxt
            if b not in reached:
                return []
            ids, node = [], b
            while node != a:
                node, edge_id = reached[node]
                ids.append(edge_id)
            ids.reverse()
            cur = conn.execute(
                "SELECT id, src, predicate, dst, path, section, role FROM rag_graph_edges WHERE id = ANY(%s)", (ids,)
            )
            by_id = {r["id"]: r for r in _dicts(cur)}
        out = []
        for i in ids:
            r = by_id[i]
            r.pop("id")
            out.append(r)
        return out

    @contextmanager
    def _graph_connection(self) -> Iterator[psycopg.Connection]:
        """A connection whose queries stop after `graph.query_timeout_ms` (SET LOCAL: this transaction only)."""
        timeout = self.settings.graph.query_timeout_ms
        try:
            with self.db.connection() as conn, conn.transaction():
                conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{timeout}ms",))
                yield conn
        except psycopg.errors.QueryCanceled as exc:
            raise _timed_out(timeout) from exc

    def _graph_statement(self, query: str, params: dict[str, Any]) -> psycopg.Cursor:
        """One graph statement under `graph.query_timeout_ms`, sent with its setting in one round trip
        (a transaction around them took four: a search's graph list waited ~0.35 ms on them)."""
        timeout = self.settings.graph.query_timeout_ms
        try:
            with self.db.pipelined() as conn:
                conn.execute("SELECT set_config('statement_timeout', %s, true)", (f"{timeout}ms",))
                cur = conn.execute(query, params)
        except psycopg.errors.QueryCanceled as exc:
            raise _timed_out(timeout) from exc
        return cur

    def graph_related_paths(self, collection: str, paths: Sequence[str], exclude: Sequence[str],
                            limit: int = 50) -> list[tuple[str, int]]:
        """Documents linked to, or sharing a graph node with, `paths`, with how many connections each
        has. Raises QueryTimeoutError after `graph.query_timeout_ms`."""
        keys = [f"doc:{p}" for p in paths]
        rows = self._graph_statement(  # bounded like every graph query: a search waits on it
            """WITH seed AS (SELECT unnest(%(k)s::text[]) AS key),
               direct AS (
                   SELECT e.dst AS other FROM rag_graph_edges e JOIN seed ON e.src = seed.key
                    WHERE e.collection = %(c)s AND e.predicate = 'links_to'
                   UNION ALL
                   SELECT e.src FROM rag_graph_edges e JOIN seed ON e.dst = seed.key
                    WHERE e.collection = %(c)s AND e.predicate = 'links_to'),
               shared AS (
                   SELECT e2.src AS other FROM rag_graph_edges e1 JOIN seed ON e1.src = seed.key
                   JOIN rag_graph_edges e2 ON e2.collection = e1.collection AND e2.dst = e1.dst
                    AND e2.src LIKE 'doc:%%' AND e2.src <> e1.src
                    WHERE e1.collection = %(c)s AND NOT (e1.predicate = ANY(%(x)s))
                      AND NOT (e2.predicate = ANY(%(x)s)) AND e1.predicate <> 'links_to'),
               -- a direct link counts twice a shared entity; counted once, before the
               -- documents are looked up (a plan that joined first, on a table without
               -- statistics, recomputed the shared entities per document: seconds)
               counted AS MATERIALIZED (
                   SELECT other, count(*) AS n FROM (
                       SELECT other FROM direct UNION ALL SELECT other FROM direct
                       UNION ALL SELECT other FROM shared) x
                   WHERE other LIKE 'doc:%%' AND NOT (other = ANY(%(k)s))
                   GROUP BY other)
               SELECT substr(other, 5) AS path, n FROM counted
               WHERE EXISTS (SELECT 1 FROM rag_documents d WHERE d.collection = %(c)s AND d.path = substr(other, 5))
               ORDER BY n DESC, other LIMIT %(l)s""",
            {"k": keys, "c": collection, "x": list(exclude), "l": limit},
        ).fetchall()
        return [(p, int(n)) for p, n in rows]

    # ---- checks and export ---------------------------------------------------------------

    def graph_counts(self, collection: str | None = None) -> dict[str, Any]:
        with self.db.connection() as conn:
            kinds = conn.execute(
                "SELECT kind, count(*) FROM rag_graph_nodes WHERE %(c)s::text IS NULL OR collection = %(c)s"
                " GROUP BY kind ORDER BY kind", {"c": collection}).fetchall()
            preds = conn.execute(
                "SELECT predicate, count(*) FROM rag_graph_edges WHERE %(c)s::text IS NULL OR collection = %(c)s"
                " GROUP BY predicate ORDER BY predicate", {"c": collection}).fetchall()
        return {"nodes": {k: int(n) for k, n in kinds}, "edges": {p: int(n) for p, n in preds}}

    def graph_orphan_nodes(self, collection: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        with self.db.connection() as conn:
            cur = conn.execute(
                """SELECT n.collection, n.key, n.kind FROM rag_graph_nodes n
                   WHERE (%(c)s::text IS NULL OR n.collection = %(c)s)
                     AND NOT EXISTS (SELECT 1 FROM rag_graph_edges e WHERE e.collection = n.collection AND e.src = n.key)
                     AND NOT EXISTS (SELECT 1 FROM rag_graph_edges e WHERE e.collection = n.collection AND e.dst = n.key)
                   ORDER BY 1, 2 LIMIT %(l)s""", {"c": collection, "l": limit})
            return _dicts(cur)

    def graph_stale_edges(self, collection: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Edges written from another version of their document than the one now live."""
        with self.db.connection() as conn:
            cur = conn.execute(
                """SELECT e.collection, e.path, e.src, e.predicate, e.dst FROM rag_graph_edges e
                   JOIN rag_documents d ON d.collection = e.collection AND d.path = e.path
                   WHERE (%(c)s::text IS NULL OR e.collection = %(c)s) AND e.doc_hash <> d.content_hash
                   ORDER BY 1, 2 LIMIT %(l)s""", {"c": collection, "l": limit})
            return _dicts(cur)

    def graph_duplicate_nodes(self, collection: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Groups of nodes that look like one thing: the same name once case, punctuation and a plural
        `s` are ignored (`DataCenter Revenue` / `data-center-revenue`, an entity `nvda` beside the
        ticker NVDA), or an entity whose name a document declared to be a ticker or document."""
        with self.db.connection() as conn:
            cur = conn.execute(
                r"""WITH n AS (
                       SELECT collection, key, kind, regexp_replace(lower(CASE WHEN key LIKE 'ticker:%%'
                              THEN substr(key, 8) ELSE key END), '[^a-z0-9]', '', 'g') AS compact
                       FROM rag_graph_nodes
                       WHERE (%(c)s::text IS NULL OR collection = %(c)s) AND kind NOT IN ('doc', 'date', 'doc_type')),
                   named AS (
                       SELECT collection, CASE WHEN length(compact) > 4 THEN regexp_replace(compact, 's$', '')
                              ELSE compact END AS name, key, kind FROM n WHERE compact <> ''),
                   same_name AS (
                       SELECT collection, array_agg(key ORDER BY key) AS keys, array_agg(kind ORDER BY key) AS kinds,
                              'same name ignoring case, punctuation and plural' AS reason
                       FROM named GROUP BY collection, name HAVING count(*) > 1),
                   unmerged AS (
                       SELECT DISTINCT n.collection, ARRAY[a.key, n.key] AS keys, ARRAY['?', n.kind] AS kinds,
                              'named as ' || a.key || ' by ' || a.path AS reason
                       FROM rag_graph_nodes n JOIN rag_graph_aliases a
                         ON a.collection = n.collection AND a.alias = n.key AND a.key <> n.key
                       WHERE (%(c)s::text IS NULL OR n.collection = %(c)s)
                         AND (a.key LIKE 'ticker:%%' OR a.key LIKE 'doc:%%'))
                   SELECT * FROM same_name UNION ALL SELECT * FROM unmerged
                   ORDER BY collection, keys LIMIT %(l)s""", {"c": collection, "l": limit})
            return _dicts(cur)

    def graph_dangling_links(self, collection: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        """`_links` whose target is not a live document."""
        with self.db.connection() as conn:
            cur = conn.execute(
                """SELECT e.collection, e.path, e.role, substr(e.dst, 5) AS target FROM rag_graph_edges e
                   WHERE (%(c)s::text IS NULL OR e.collection = %(c)s) AND e.predicate = 'links_to'
                     AND e.dst LIKE 'doc:%%'
                     AND NOT EXISTS (SELECT 1 FROM rag_documents d
                                     WHERE d.collection = e.collection AND 'doc:' || d.path = e.dst)
                   ORDER BY 1, 2, 4 LIMIT %(l)s""", {"c": collection, "l": limit})
            return _dicts(cur)

    def graph_sample(self, collection: str | None = None, limit: int = 10) -> list[dict[str, Any]]:
        with self.db.connection() as conn:
            cur = conn.execute(
                """SELECT src, predicate, dst, path, section FROM rag_graph_edges
                   WHERE (%(c)s::text IS NULL OR collection = %(c)s) AND section = '_graph'
                     AND predicate <> 'has_entity'
                   ORDER BY path, id LIMIT %(l)s""", {"c": collection, "l": limit})
            return _dicts(cur)

    def graph_file_reports(self, collection: str, paths: Sequence[str], sample: int = 5) -> dict[str, dict[str, Any]]:
        """Per document path: its nodes by kind, edges by predicate, dangling `_links` and a few
        triples (its `_graph` ones first), for many documents in four queries."""
        paths = list(paths)
        out: dict[str, dict[str, Any]] = {p: {"nodes_by_kind": {}, "edges_by_predicate": {}, "dangling": [],
                                               "sample": []} for p in paths}
        if not paths:
            return out
        params = {"c": collection, "p": paths, "n": sample}
        with self.db.connection() as conn:
            for path, pred, n in conn.execute(
                    """SELECT path, predicate, count(*) FROM rag_graph_edges WHERE collection = %(c)s
                       AND path = ANY(%(p)s) GROUP BY 1, 2 ORDER BY 1, 2""", params).fetchall():
                out[path]["edges_by_predicate"][pred] = int(n)
            for path, kind, n in conn.execute(
                    """SELECT x.path, n.kind, count(DISTINCT n.key) FROM (
                           SELECT path, src AS key FROM rag_graph_edges WHERE collection = %(c)s AND path = ANY(%(p)s)
                           UNION SELECT path, dst FROM rag_graph_edges WHERE collection = %(c)s AND path = ANY(%(p)s)) x
                       JOIN rag_graph_nodes n ON n.collection = %(c)s AND n.key = x.key
                       GROUP BY 1, 2 ORDER BY 1, 2""", params).fetchall():
                out[path]["nodes_by_kind"][kind] = int(n)
            for path, role, target in conn.execute(
                    """SELECT e.path, e.role, substr(e.dst, 5) FROM rag_graph_edges e
                       WHERE e.collection = %(c)s AND e.path = ANY(%(p)s) AND e.predicate = 'links_to'
                         AND e.dst LIKE 'doc:%%'
                         AND NOT EXISTS (SELECT 1 FROM rag_documents d
                                         WHERE d.collection = e.collection AND d.path = substr(e.dst, 5))
                       ORDER BY 1, 3""", params).fetchall():
                out[path]["dangling"].append({"role": role, "target": target})
            cur = conn.execute(
                """SELECT path, src, predicate, dst, section FROM (
                       SELECT path, src, predicate, dst, section, row_number() OVER (
                           PARTITION BY path ORDER BY section <> '_graph', id) AS r
                       FROM rag_graph_edges WHERE collection = %(c)s AND path = ANY(%(p)s)
                         AND predicate NOT IN ('has_entity', 'has_type', 'dated')) s
                   WHERE r <= %(n)s ORDER BY path, r""", params)
            for row in _dicts(cur):
                out[row.pop("path")]["sample"].append(row)
        return out

    def graph_export_rows(self, collection: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(nodes, edges) of a collection, for export."""
        with self.db.connection() as conn:
            nodes = _dicts(conn.execute(
                "SELECT key, kind, label FROM rag_graph_nodes WHERE collection = %s ORDER BY key", (collection,)))
            edges = _dicts(conn.execute(
                "SELECT src, predicate, dst, path, section, role FROM rag_graph_edges WHERE collection = %s"
                " ORDER BY id", (collection,)))
        return nodes, edges


def _timed_out(timeout: int) -> QueryTimeoutError:
    return QueryTimeoutError(f"the graph query took longer than graph.query_timeout_ms={timeout} "
                             "(RAG_GRAPH__QUERY_TIMEOUT_MS); ask for a smaller depth or raise the setting")


def _mergeable(key: str) -> bool:
    """Entity keys (names from `_graph`) may turn out to name a ticker or a document; those may not."""
    return not key.startswith(("doc:", "ticker:", "date:", "doc_type:"))


def _dicts(cur) -> list[dict[str, Any]]:
    cols = [d.name for d in cur.description]
    return [dict(zip(cols, row)) for row in cur.fetchall()]
