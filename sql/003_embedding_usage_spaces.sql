-- Embedding accounting per run and provider (tokens, requests, retries, estimated cost), and the
-- bookkeeping re-embeds need to switch spaces and roll back.
CREATE TABLE rag_embedding_runs (
    run_id        text        PRIMARY KEY,
    kind          text        NOT NULL,              -- ingest | reembed | api | dagster ...
    space         text,
    cache_hits    bigint      NOT NULL DEFAULT 0,
    cache_misses  bigint      NOT NULL DEFAULT 0,
    started_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rag_embedding_runs_started ON rag_embedding_runs (started_at DESC);

CREATE TABLE rag_embedding_usage (
    run_id            text             NOT NULL REFERENCES rag_embedding_runs (run_id) ON DELETE CASCADE,
    provider          text             NOT NULL,
    model             text             NOT NULL,
    dimensions        integer          NOT NULL,
    requests          bigint           NOT NULL DEFAULT 0,
    retries           bigint           NOT NULL DEFAULT 0,
    failures          bigint           NOT NULL DEFAULT 0,
    inputs            bigint           NOT NULL DEFAULT 0,
    tokens            bigint           NOT NULL DEFAULT 0,
    tokens_estimated  boolean          NOT NULL DEFAULT false,  -- server did not report its count
    cost_usd          double precision NOT NULL DEFAULT 0,
    updated_at        timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, provider, model, dimensions)
);

-- When a space stopped serving (rollback returns to the most recently retired one).
ALTER TABLE rag_spaces ADD COLUMN retired_at timestamptz;
CREATE INDEX rag_embedding_cache_last_used ON rag_embedding_cache (last_used_at);
