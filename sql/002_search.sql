-- Lexical ranking: a BM25-like weighted sum of per-term ranks. Each query term is its own tsquery
-- with an IDF weight computed by the library; ts_rank with normalisation 1 (divide by
-- 1 + log(length)) supplies a saturating term frequency. IMMUTABLE + PARALLEL SAFE so the planner
-- may evaluate it in parallel workers.
CREATE OR REPLACE FUNCTION rag_weighted_rank(doc tsvector, terms tsquery[], weights float8[])
RETURNS float8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(sum(u.w * ts_rank(doc, u.t, 1)), 0)
    FROM unnest(terms, weights) AS u(t, w)
    WHERE doc @@ u.t
$$;

-- Date-ordered retrieval (trend questions) and per-collection term statistics scan these.
CREATE INDEX IF NOT EXISTS rag_chunks_collection_date ON rag_chunks (collection, doc_date);
