-- One row per search (every caller goes through KnowledgeBase.search) and per embedding call,
-- written in batches by a background recorder; `rag metrics` summarises them.
CREATE TABLE IF NOT EXISTS rag_search_metrics (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    collection  text,
    query       text NOT NULL,
    query_class text,             -- the classifier's kind: retrieval, comparison, trend, global, ...
    mode        text NOT NULL,    -- semantic | lexical | hybrid
    strategy    text NOT NULL,    -- how it ran: e.g. hybrid+rerank, per-ticker, expanded
    reranked    boolean NOT NULL DEFAULT false,
    results     integer NOT NULL,
    top_score   double precision,
    latency_ms  double precision NOT NULL,
    stages_ms   jsonb NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX IF NOT EXISTS rag_search_metrics_at ON rag_search_metrics (at);

CREATE TABLE IF NOT EXISTS rag_embed_metrics (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    provider    text NOT NULL,    -- the member that answered (or the last one tried)
    model       text,
    inputs      integer NOT NULL,
    latency_ms  double precision NOT NULL,
    retries     integer NOT NULL DEFAULT 0,
    fallback    boolean NOT NULL DEFAULT false,  -- a later chain member answered
    ok          boolean NOT NULL DEFAULT true,
    error       text
);
CREATE INDEX IF NOT EXISTS rag_embed_metrics_at ON rag_embed_metrics (at);
