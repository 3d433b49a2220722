-- Field weights for full-text search. The text-search vectors indexed `embed_text` (the
-- `[doc_type] [ticker] [section]` prefix plus the chunk text) as one field, so a word of a section's
-- heading counted no more than the same word anywhere in its text. Now each field carries a
-- text-search weight, which ts_rank scales by `search.lexical_*_weight` (rag_lib/store/lexical.py):
--   A  the section's heading (its display title, the prefix's `[section]`)
--   B  the document's ticker
--   C  the document type
--   D  the chunk's text
-- The same words as before, so with equal weights (the defaults) every score is what it was.
-- Also measured (README, Retrieval): the section key and the document's title as extra fields helped
-- full text alone a little and hybrid search not at all; they are not indexed.
DROP INDEX IF EXISTS rag_chunks_tsv;
DROP INDEX IF EXISTS rag_chunks_tsv_simple;
-- DROP + ADD rather than ALTER COLUMN ... SET EXPRESSION, which needs PostgreSQL 17
ALTER TABLE rag_chunks DROP COLUMN tsv, DROP COLUMN tsv_simple;
ALTER TABLE rag_chunks
    ADD COLUMN tsv tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', coalesce(metadata->>'section_title', section)), 'A')
        || setweight(to_tsvector('english', coalesce(ticker, '')), 'B')
        || setweight(to_tsvector('english', doc_type), 'C')
        || to_tsvector('english', text)
    ) STORED,
    ADD COLUMN tsv_simple tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('simple', coalesce(metadata->>'section_title', section)), 'A')
        || setweight(to_tsvector('simple', coalesce(ticker, '')), 'B')
        || setweight(to_tsvector('simple', doc_type), 'C')
        || to_tsvector('simple', text)
    ) STORED;
-- kept inline, as 005 decided for the old columns
ALTER TABLE rag_chunks ALTER COLUMN tsv SET STORAGE MAIN, ALTER COLUMN tsv_simple SET STORAGE MAIN;
CREATE INDEX rag_chunks_tsv ON rag_chunks USING gin (tsv);
CREATE INDEX rag_chunks_tsv_simple ON rag_chunks USING gin (tsv_simple);
ANALYZE rag_chunks;
