-- Staged vectors of the `embeddings` asset: what the provider returned for a file's chunks,
-- before `vector_table` publishes them. The column is deliberately unconstrained (any
-- dimension, zero vectors allowed) so the blocking embeddings check can see bad vectors here
-- and stop them before they reach the serving table.
CREATE TABLE rag_stage_vectors (
    collection    text        NOT NULL,
    path          text        NOT NULL,   -- the file's path relative to its corpus root
    chunk_id      text        NOT NULL,
    content_hash  text        NOT NULL,   -- embed-text hash (the embedding cache key)
    model         text        NOT NULL,
    dimensions    integer     NOT NULL,   -- what the space says; vector_dims(embedding) may differ
    embedding     vector      NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (collection, path, chunk_id)
);
