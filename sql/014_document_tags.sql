-- Tags a client attaches to a document when indexing it (seed 003's `/rag/index` `metadata`, e.g.
-- {"category": "documentation"}). They are not in the file, so re-ingesting the file keeps them;
-- they go with the document. `/rag/retrieve` filters on them (`filters.category`, `filters.tags`).
ALTER TABLE rag_documents ADD COLUMN IF NOT EXISTS tags jsonb NOT NULL DEFAULT '{}'::jsonb;
CREATE INDEX IF NOT EXISTS rag_documents_tags ON rag_documents USING gin (tags jsonb_path_ops);
