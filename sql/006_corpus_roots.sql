-- Corpus roots are state: every folder ingested or materialized is registered here with its
-- collection, and the Dagster code location (assets, sensor, schedules, UI-launched runs) reads
-- this table instead of run config. `name` is the root's stable label: partition keys are
-- `<name>/<path under the root>`, so a key names its root however many roots are registered.
CREATE TABLE IF NOT EXISTS rag_corpus_roots (
    name        TEXT PRIMARY KEY,
    path        TEXT NOT NULL,
    collection  TEXT NOT NULL,
    source      TEXT NOT NULL DEFAULT 'ingest',  -- ingest | materialize | cli | config
    added_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (path, collection)
);
