-- History of the retrieval_quality check: one row per run of a configured eval set. `eval_set` keys
-- the set (its files' content, mode, unit, collection), so an edited set starts a new baseline;
-- `accepted` runs (passed) are the baseline the next run is compared with.
CREATE TABLE IF NOT EXISTS rag_eval_runs (
    id bigserial PRIMARY KEY,
    eval_set text NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    ndcg double precision NOT NULL,
    metrics jsonb NOT NULL,
    outcome text NOT NULL,
    accepted boolean NOT NULL
);
CREATE INDEX IF NOT EXISTS rag_eval_runs_set ON rag_eval_runs (eval_set, at DESC);
