"""SQL for full-text search: query lexemes, term statistics and the weighted lexical ranking."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from rag_lib.models import SearchFilters, SearchHit
from rag_lib.store.vectors import HIT_COLUMNS, _filter_sql, hit_from_row

CONFIGS = {"english": "tsv", "simple": "tsv_simple"}

# Chunks per (collection, config, lexeme) among the chunks `{where}` keeps. unnest(tsvector) gives each
# lexeme of a chunk once, so count(*) is the number of chunks holding it (what `tsv @@ 'lexeme'` counts).
_COUNTS = """SELECT c.collection, 'english' AS config, u.lexeme, count(*) AS n FROM rag_chunks c, unnest(c.tsv) u
               WHERE {where} GROUP BY c.collection, u.lexeme
             UNION ALL
             SELECT c.collection, 'simple', u.lexeme, count(*) FROM rag_chunks c, unnest(c.tsv_simple) u
               WHERE {where} GROUP BY c.collection, u.lexeme"""
_PATH_COUNTS = _COUNTS.format(where="c.collection = %(c)s AND c.path = ANY(%(p)s)")


def lexeme_counts(conn, collection: str, paths: Sequence[str]) -> tuple[list[str], list[str], list[int]]:
    """(configs, lexemes, chunks) of the chunks now stored at `paths`, as three parallel lists: what
    `change_lexeme_frequencies` subtracts once those chunks are replaced or deleted."""
    rows = conn.execute(_PATH_COUNTS, {"c": collection, "p": list(paths)}).fetchall()
    return [r[1] for r in rows], [r[2] for r in rows], [int(r[3]) for r in rows]


def change_lexeme_frequencies(conn, collection: str, paths: Sequence[str],
                              before: tuple[list[str], list[str], list[int]]) -> None:
    """Move rag_lexeme_frequencies from the counts `before` (`lexeme_counts` of these paths before
    they were rewritten) to those of the chunks now at `paths`, in the caller's transaction.

    Concurrent publishers of one collection update the same rows (a common lexeme is in every
    document). Each transaction nets its change per lexeme and writes it in one statement in lexeme
    order, so two publishers lock shared rows in the same order and cannot deadlock; called last in
    the transaction, it holds those row locks only until the commit."""
    row = conn.execute(
        f"""WITH now AS ({_PATH_COUNTS}),
                 delta AS (SELECT config, lexeme, sum(n)::int AS n FROM (
                             SELECT config, lexeme, n FROM now
                             UNION ALL
                             SELECT o.config, o.lexeme, -o.n FROM unnest(%(oc)s::text[], %(ol)s::text[], %(on)s::int[])
                                    AS o(config, lexeme, n)) d
                           GROUP BY config, lexeme HAVING sum(n) <> 0),
                 changed AS (INSERT INTO rag_lexeme_frequencies AS f (collection, config, lexeme, chunks)
                             SELECT %(c)s, config, lexeme, n FROM delta ORDER BY config, lexeme
                             ON CONFLICT (collection, config, lexeme) DO UPDATE SET chunks = f.chunks + EXCLUDED.chunks
                             RETURNING f.config, f.lexeme, f.chunks)
            SELECT array_agg(config), array_agg(lexeme) FROM changed WHERE chunks <= 0""",
        {"c": collection, "p": list(paths), "oc": before[0], "ol": before[1], "on": before[2]},
    ).fetchone()
    if row[0]:  # lexemes no chunk of the collection holds any more (rows already locked by us)
        conn.execute(
            """DELETE FROM rag_lexeme_frequencies f USING unnest(%s::text[], %s::text[]) AS g(config, lexeme)
               WHERE f.collection = %s AND f.config = g.config AND f.lexeme = g.lexeme AND f.chunks <= 0""",
            (row[0], row[1], collection))


def field_weights(search_settings) -> sql.Composable:
    """ts_rank's weights array {D, C, B, A} (text, document type, ticker, section heading; sql/020)
    from the settings, which are relative to the text; ts_rank takes none above 1."""
    raw = [1.0, search_settings.lexical_type_weight, search_settings.lexical_ticker_weight,
           search_settings.lexical_heading_weight]
    top = max(raw)
    return sql.SQL("{}::float4[]").format(sql.Literal("{" + ",".join(f"{0.1 * w / top:.6f}" for w in raw) + "}"))


def tsquery_literal(lexeme: str) -> str:
    """A lexeme as a quoted tsquery operand (already normalised, so no config is applied)."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


class LexicalStore:
    """Mixin: needs `self.db` (Connections) and `self.settings`."""

    def query_lexemes(self, text: str, config: str = "english") -> list[str]:
        """The distinct lexemes Postgres derives from `text` under `config`, in query order."""
        if config not in CONFIGS:
            raise ValueError(f"unknown text-search config {config}")
        with self.db.reading() as conn:
            rows = conn.execute(
                "SELECT lexeme FROM unnest(to_tsvector(%s::regconfig, %s)) ORDER BY positions[1]",
                (config, text),
            ).fetchall()
        return [r[0] for r in rows]

    def query_terms(self, collection: str | None, english: str, simple: str) -> dict[str, list[tuple[str, int]]]:
        """{config: [(lexeme, chunks)]}: the distinct lexemes Postgres derives from `english` under the
        english configuration and from `simple` under simple, each config's in query order, with the
        number of the collection's chunks holding each (rag_lexeme_frequencies; 0 when none holds it;
        every collection's when `collection` is None). One statement, one round trip: all a lexical
        query's planning reads on each search (ANALYZE's common lexemes: `element_statistics`).
        A config with no lexeme is left out."""
        where = sql.SQL("f.collection = %(c)s AND ") if collection else sql.SQL("")
        query = sql.SQL(
            """SELECT q.config, array_agg(q.lexeme ORDER BY q.first, q.lexeme),
                      array_agg(coalesce(f.n, 0) ORDER BY q.first, q.lexeme)
               FROM (SELECT 'english' AS config, lexeme, positions[1] AS first FROM unnest(to_tsvector('english', %(e)s))
                     UNION ALL
                     SELECT 'simple', lexeme, positions[1] FROM unnest(to_tsvector('simple', %(s)s))) q
               LEFT JOIN LATERAL (SELECT sum(f.chunks) AS n FROM rag_lexeme_frequencies f
                                  WHERE {w} f.config = q.config AND f.lexeme = q.lexeme) f ON true
               GROUP BY q.config""").format(w=where)
        with self.db.reading() as conn:
            rows = conn.execute(query, {"c": collection, "e": english, "s": simple}).fetchall()
        found = {config: list(zip(lexemes, map(int, counts))) for config, lexemes, counts in rows}
        return {config: found[config] for config in CONFIGS if config in found}

    def element_statistics(self) -> tuple[float, dict[str, dict[str, float]]]:
        """(rows ANALYZE counted in rag_chunks, {config: {lexeme: share of the rows holding it}}) for
        the lexemes in ANALYZE's most-common-elements list of each text-search column (a config
        without that list is left out). They change only when ANALYZE (or VACUUM: the row count)
        runs on rag_chunks, which shows in `collection_generation`."""
        with self.db.reading() as conn:
            rows = conn.execute(
                """SELECT s.attname, c.reltuples, s.most_common_elems::text::text[], s.most_common_elem_freqs
                   FROM pg_class c JOIN pg_stats s ON s.schemaname = current_schema()
                        AND s.tablename = 'rag_chunks' AND s.attname = ANY(%s)
                   WHERE c.oid = 'rag_chunks'::regclass""", (list(CONFIGS.values()),)).fetchall()
        config_of = {column: config for config, column in CONFIGS.items()}
        counted = float(rows[0][1]) if rows else 0.0
        # the freqs array ends with 3 summary values: zip drops them
        return counted, {config_of[column]: dict(zip(elems, freqs)) for column, _, elems, freqs in rows
                         if elems and freqs}

    def rebuild_lexeme_frequencies(self) -> int:
        """Recount rag_lexeme_frequencies from every stored chunk (after a bulk load that bypassed
        publishing, or a change to the text-search columns); returns the rows written."""
        with self.db.connection() as conn, conn.transaction():
            conn.execute("LOCK TABLE rag_chunks IN SHARE MODE")  # no publish or delete meanwhile
            conn.execute("DELETE FROM rag_lexeme_frequencies")
            return conn.execute("INSERT INTO rag_lexeme_frequencies (collection, config, lexeme, chunks) "
                                + _COUNTS.format(where="TRUE")).rowcount

    def collection_generation(self, collection: str | None) -> tuple[int, int, str, str]:
        """(documents, chunks, last publish, statistics) of the collection: changes whenever
        documents are published or deleted, and whenever ANALYZE or VACUUM rewrote what
        `element_statistics` reads (the last is a digest of rag_chunks' row estimate and its
        text-search columns' common elements: read with the same snapshot rules as the statistics
        themselves, so a cache keyed on it cannot keep statistics older than its key). The term
        statistics cache key; the chunk count is the collection size for IDF."""
        where = sql.SQL("WHERE collection = %s") if collection else sql.SQL("")
        with self.db.reading() as conn:
            row = conn.execute(
                sql.SQL(
                    "SELECT count(*), coalesce(sum(chunk_count), 0), coalesce(max(ingested_at)::text, ''),"
                    " (SELECT max(c.reltuples)::text || ':' || md5(coalesce(string_agg(s.attname"
                    "   || s.most_common_elems::text || s.most_common_elem_freqs::text, ',' ORDER BY s.attname), ''))"
                    "  FROM pg_class c LEFT JOIN pg_stats s ON s.schemaname = current_schema()"
                    "   AND s.tablename = 'rag_chunks' AND s.attname = ANY(%s)"
                    "  WHERE c.oid = 'rag_chunks'::regclass)"
                    " FROM rag_documents {}"
                ).format(where),
                [list(CONFIGS.values()), *([collection] if collection else [])],
            ).fetchone()
        return int(row[0]), int(row[1]), row[2], row[3]

    def _distinct(self, column: str, collection: str | None) -> set[Any]:
        """The distinct non-null values of `rag_documents.column` in `collection` (None: every collection)."""
        where = sql.SQL("AND collection = %s") if collection else sql.SQL("")
        with self.db.reading() as conn:
            rows = conn.execute(
                sql.SQL("SELECT DISTINCT {c} FROM rag_documents WHERE {c} IS NOT NULL {w}").format(
                    c=sql.Identifier(column), w=where),
                [collection] if collection else [],
            ).fetchall()
        return {r[0] for r in rows}

    def known_tickers(self, collection: str | None) -> set[str]:
        return self._distinct("ticker", collection)

    def document_dates(self, collection: str | None) -> set[dt.date]:
        """The distinct dates of the collection's documents (of every collection when None)."""
        return self._distinct("doc_date", collection)

    def known_doc_types(self, collection: str | None) -> set[str]:
        """The document types `collection` (None: every collection) holds."""
        return {t for t in self._distinct("doc_type", collection) if t}

    def document_names(self, collection: str | None, doc_types: Sequence[str]) -> list[tuple[str, str, str]]:
        """(path, doc_id, doc_type) of the documents of `doc_types` in `collection` (all collections
        when None): the documents a question can name by name and type ("the earnings-momentum strategy")."""
        where = sql.SQL("AND collection = %s") if collection else sql.SQL("")
        with self.db.reading() as conn:
            rows = conn.execute(
                sql.SQL("SELECT path, doc_id, doc_type FROM rag_documents WHERE doc_type = ANY(%s) {}").format(where),
                [list(doc_types), *([collection] if collection else [])],
            ).fetchall()
        return [(r[0], r[1], r[2]) for r in rows]

    def lexical_search(
        self,
        terms: dict[str, Sequence[tuple[str, float]]],
        filters: SearchFilters,
        limit: int,
        websearch: str | None = None,
        match: dict[str, Sequence[str]] | None = None,
        conjunctive: bool = False,
        max_candidates: int | None = None,
    ) -> list[tuple[SearchHit, float]]:
        """Chunks ranked by full text: the IDF-weighted sum of per-term ranks over the `english` and
        `simple` vectors, or (when `websearch` is given) the user's own query syntax, matched strictly.
        `match` (lexemes per config) selects the candidate rows, holding any of them (all of them
        when `conjunctive`); by default every weighted term does. At most `max_candidates` rows are
        scored, so a term found in most chunks costs the same as a rare one."""
        where, params = _filter_sql(filters)
        weights = field_weights(self.settings.search)
        if websearch is not None:
            match = sql.SQL("(c.tsv @@ websearch_to_tsquery('english', %s) OR c.tsv_simple @@ websearch_to_tsquery('simple', %s))")
            score = sql.SQL(
                "ts_rank_cd({w}, c.tsv, websearch_to_tsquery('english', %s), 1)"
                " + ts_rank_cd({w}, c.tsv_simple, websearch_to_tsquery('simple', %s), 1)"
            ).format(w=weights)
            score_params: list[Any] = [websearch, websearch]
            match_params: list[Any] = [websearch, websearch]
        else:
            matches, scores = [], []
            score_params, match_params = [], []
            for config, column in CONFIGS.items():
                pairs = [(lex, w) for lex, w in terms.get(config, ()) if w > 0]
                if not pairs:
                    continue
                col = sql.SQL("c.") + sql.Identifier(column)
                selecting = [lex for lex, _ in pairs] if match is None else list(match.get(config, ()))
                if selecting:
                    matches.append(col + sql.SQL(" @@ %s::tsquery"))
                    match_params.append((" & " if conjunctive else " | ").join(tsquery_literal(lex) for lex in selecting))
                # BM25-like: IDF-weighted sum of per-term ranks (ts_rank normalisation 1 saturates tf
                # and divides by 1 + log(length); the field weights scale a term found in the heading,
                # ticker or type); inline, as a SQL function call per row costs more.
                for lex, weight in pairs:
                    scores.append(sql.SQL("{} * ts_rank({}, {}, %s::tsquery, 1)").format(
                        sql.Literal(round(weight, 6)), weights, col))
                    score_params.append(tsquery_literal(lex))
            if not matches:
                return []
            match = sql.SQL("(") + sql.SQL(" OR ").join(matches) + sql.SQL(")")
            score = sql.SQL(" + ").join(scores)
        # candidates first (capped), then scored: the cap bounds the rows read and ranked per query
        query = sql.SQL(
            "SELECT {cols}, {score} AS lex_score FROM (SELECT * FROM rag_chunks c WHERE {where} AND {match}"
            " LIMIT %s) c ORDER BY lex_score DESC, c.chunk_id LIMIT %s"
        ).format(cols=HIT_COLUMNS, score=score, where=where, match=match)
        with self.db.reading() as conn:
            cur = conn.execute(query, [*score_params, *params, *match_params, max_candidates, limit])
            cols = [d.name for d in cur.description]
            rows = [dict(zip(cols, r)) for r in cur.fetchall()]
        return [(hit_from_row(r, 0.0), float(r["lex_score"])) for r in rows]

    def chunk_texts(self, collection: str) -> list[dict[str, Any]]:
        """Every chunk of a collection with its unit, document, section and the text the full-text
        columns index (`embed_text`): for comparing our scoring with a reference BM25."""
        with self.db.connection() as conn:
            cur = conn.execute(
                "SELECT c.chunk_id, c.unit_id, c.doc_id, c.path, c.section, c.ticker, c.text, c.embed_text,"
                " d.title FROM rag_chunks c LEFT JOIN rag_documents d USING (collection, path)"
                " WHERE c.collection = %s ORDER BY c.chunk_id", (collection,))
            cols = [d.name for d in cur.description]
            return [dict(zip(cols, r)) for r in cur.fetchall()]
