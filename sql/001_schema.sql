-- Core schema: documents, sections, chunks (the serving table), vectors per embedding space,
-- the embedding cache, skipped inputs and per-stage outputs for the Dagster assets.
CREATE EXTENSION IF NOT EXISTS vector;

-- One row per ingested file (or JSONL record). The path is relative to its corpus root.
CREATE TABLE rag_documents (
    collection      text        NOT NULL,
    path            text        NOT NULL,
    doc_id          text        NOT NULL,
    doc_type        text        NOT NULL,
    title           text,
    ticker          text,
    doc_date        date,
    version         text,
    format          text        NOT NULL,
    content_hash    text        NOT NULL,
    fingerprint     text        NOT NULL,   -- chunker + model + settings that produced the rows
    source_path     text,                   -- absolute path on the ingesting machine
    size_bytes      bigint,
    metadata        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    section_count   integer     NOT NULL DEFAULT 0,
    chunk_count     integer     NOT NULL DEFAULT 0,
    token_count     integer     NOT NULL DEFAULT 0,
    ingested_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (collection, path)
);
CREATE INDEX rag_documents_doc_id ON rag_documents (collection, doc_id);

-- Every top-level section, including empty ones (so `rag show` can say they exist).
CREATE TABLE rag_sections (
    collection   text    NOT NULL,
    path         text    NOT NULL,
    name         text    NOT NULL,
    ordinal      integer NOT NULL,
    title        text    NOT NULL,
    text         text    NOT NULL,
    token_count  integer NOT NULL,
    is_empty     boolean NOT NULL,
    PRIMARY KEY (collection, path, name),
    FOREIGN KEY (collection, path) REFERENCES rag_documents (collection, path) ON DELETE CASCADE
);

-- The serving table: one row per chunk, with text, metadata and full-text vectors.
CREATE TABLE rag_chunks (
    chunk_id      text        PRIMARY KEY,
    collection    text        NOT NULL,
    path          text        NOT NULL,
    doc_id        text        NOT NULL,
    doc_type      text        NOT NULL,
    ticker        text,
    doc_date      date,
    section       text        NOT NULL,     -- top-level key / H2 / _intro
    section_path  text        NOT NULL,     -- e.g. phase1_catalyst > thesis
    unit_id       text        NOT NULL,     -- <path>#<section>
    ordinal       integer     NOT NULL,     -- position of the chunk in its document
    text          text        NOT NULL,
    embed_text    text        NOT NULL,     -- context prefix + text: what the model saw
    token_count   integer     NOT NULL,
    content_hash  text        NOT NULL,     -- sha256 of embed_text: the embedding cache key
    doc_hash      text        NOT NULL,     -- the document's content hash when chunked
    char_start    integer     NOT NULL,
    char_end      integer     NOT NULL,
    metadata      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    tsv           tsvector    GENERATED ALWAYS AS (to_tsvector('english', embed_text)) STORED,
    tsv_simple    tsvector    GENERATED ALWAYS AS (to_tsvector('simple', embed_text)) STORED,
    FOREIGN KEY (collection, path) REFERENCES rag_documents (collection, path) ON DELETE CASCADE
);
CREATE INDEX rag_chunks_doc ON rag_chunks (collection, path);
CREATE INDEX rag_chunks_filters ON rag_chunks (collection, doc_type, ticker);
CREATE INDEX rag_chunks_tsv ON rag_chunks USING gin (tsv);
CREATE INDEX rag_chunks_tsv_simple ON rag_chunks USING gin (tsv_simple);

-- An embedding space is (model, dimensions). Exactly one is active for search at a time.
CREATE TABLE rag_spaces (
    space         text        PRIMARY KEY,  -- '<model>:<dims>'
    model         text        NOT NULL,
    dimensions    integer     NOT NULL CHECK (dimensions > 0),
    provider      text        NOT NULL,
    status        text        NOT NULL CHECK (status IN ('active', 'building', 'retired')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    activated_at  timestamptz,
    UNIQUE (space, dimensions)
);
CREATE UNIQUE INDEX rag_spaces_one_active ON rag_spaces ((status)) WHERE status = 'active';

-- Vectors per chunk and space. The column is dimensionless so spaces can live side by side;
-- the CHECK + FK pin every row to its space's dimension, and per-space partial HNSW indexes
-- over `embedding::vector(d)` serve search.
CREATE TABLE rag_chunk_vectors (
    chunk_id    text    NOT NULL REFERENCES rag_chunks (chunk_id) ON DELETE CASCADE,
    space       text    NOT NULL,
    dimensions  integer NOT NULL,
    embedding   vector  NOT NULL,
    PRIMARY KEY (space, chunk_id),
    FOREIGN KEY (space, dimensions) REFERENCES rag_spaces (space, dimensions),
    CHECK (vector_dims(embedding) = dimensions)
);
CREATE INDEX rag_chunk_vectors_chunk ON rag_chunk_vectors (chunk_id);

-- Embedding cache: re-chunking, re-runs and rollbacks never pay twice.
CREATE TABLE rag_embedding_cache (
    content_hash  text        NOT NULL,
    model         text        NOT NULL,
    dimensions    integer     NOT NULL,
    embedding     vector      NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    last_used_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (content_hash, model, dimensions),
    CHECK (vector_dims(embedding) = dimensions)
);

-- Inputs that could not be ingested, with the reason. Never deletes what is live.
CREATE TABLE rag_skipped (
    collection    text        NOT NULL,
    path          text        NOT NULL,
    reason        text        NOT NULL,
    detail        text        NOT NULL,
    content_hash  text,
    seen_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (collection, path)
);

-- Per-file outputs of each pipeline stage (Dagster assets), inspectable with SQL.
CREATE TABLE rag_stage_outputs (
    collection    text        NOT NULL,
    path          text        NOT NULL,
    stage         text        NOT NULL,
    content_hash  text,
    payload       jsonb       NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (collection, path, stage)
);

-- Pipeline failures (recorded by the Dagster run-failure sensor), shown by `rag status`.
CREATE TABLE rag_failures (
    id          bigserial   PRIMARY KEY,
    source      text        NOT NULL,
    run_id      text,
    partition   text,
    message     text        NOT NULL,
    failed_at   timestamptz NOT NULL DEFAULT now()
);

-- HNSW builds with their parameters and measured recall.
CREATE TABLE rag_index_builds (
    id            bigserial   PRIMARY KEY,
    space         text        NOT NULL,
    index_name    text        NOT NULL,
    m             integer     NOT NULL,
    ef_construction integer   NOT NULL,
    rows_indexed  bigint      NOT NULL,
    build_seconds double precision NOT NULL,
    recall_at_10  double precision,
    ef_search     integer,
    built_at      timestamptz NOT NULL DEFAULT now()
);
