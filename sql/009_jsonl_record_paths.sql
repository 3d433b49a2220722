-- JSONL records now live under their file: path `<file>#<_id>` (it was the bare `_id`, so a record
-- could replace another file's document). Move the rows ingested before, keeping their chunks and
-- vectors (chunk ids are opaque; embed texts do not contain the path, so nothing is re-embedded).
-- Rows whose new path is already taken, or that lack their source file, are left for `--prune`.
CREATE TEMP TABLE rag_jsonl_moves ON COMMIT DROP AS
SELECT d.collection, d.path AS old_path, (d.metadata->>'source_file') || '#' || d.doc_id AS new_path
FROM rag_documents d
WHERE d.format = 'jsonl' AND d.path = d.doc_id AND d.metadata ? 'source_file'
  AND NOT EXISTS (
      SELECT 1 FROM rag_documents o
      WHERE o.collection = d.collection AND o.path = (d.metadata->>'source_file') || '#' || d.doc_id);

INSERT INTO rag_documents (collection, path, doc_id, doc_type, title, ticker, doc_date, version, format,
                           content_hash, fingerprint, source_path, size_bytes, metadata, section_count,
                           chunk_count, token_count, ingested_at)
SELECT d.collection, m.new_path, d.doc_id, d.doc_type, d.title, d.ticker, d.doc_date, d.version, d.format,
       d.content_hash, d.fingerprint, d.source_path, d.size_bytes, d.metadata, d.section_count,
       d.chunk_count, d.token_count, d.ingested_at
FROM rag_documents d JOIN rag_jsonl_moves m ON m.collection = d.collection AND m.old_path = d.path;

UPDATE rag_sections s SET path = m.new_path
FROM rag_jsonl_moves m WHERE s.collection = m.collection AND s.path = m.old_path;

UPDATE rag_chunks c SET path = m.new_path, unit_id = m.new_path || '#' || c.section
FROM rag_jsonl_moves m WHERE c.collection = m.collection AND c.path = m.old_path;

DELETE FROM rag_documents d USING rag_jsonl_moves m
WHERE d.collection = m.collection AND d.path = m.old_path;

-- Empty records were recorded as skipped at their bare `_id`; they are now `<file>:<line>`.
DELETE FROM rag_skipped
WHERE reason = 'empty' AND path NOT LIKE '%.jsonl:%' AND detail ~ '^line [0-9]+: record .* has no text$';
