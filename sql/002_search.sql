-- Search support. Lexical ranking itself is composed by rag_lib/store/lexical.py (IDF-weighted
-- per-term ts_rank over the generated tsv / tsv_simple columns and their GIN indexes from 001).
-- Trend questions order by date within a collection; date-range filters use the same index.
CREATE INDEX IF NOT EXISTS rag_chunks_collection_date ON rag_chunks (collection, doc_date);
