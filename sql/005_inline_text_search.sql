-- Lexical scoring reads tsv / tsv_simple once per query term per candidate row. Stored out of
-- line (TOAST kicks in past ~2 kB per row, which most chunks reach), every read is a TOAST index
-- lookup: full-text queries over SciFact ran about 5x slower. Keep chunk rows inline up to a page.
ALTER TABLE rag_chunks SET (toast_tuple_target = 8160);
ALTER TABLE rag_chunks ALTER COLUMN tsv SET STORAGE MAIN, ALTER COLUMN tsv_simple SET STORAGE MAIN;

-- Rows written before this migration keep their out-of-line values until rewritten; rewriting
-- recomputes the generated columns under the new rule (PostgreSQL 17+ can tell which rows need it).
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 170000 THEN
        EXECUTE 'UPDATE rag_chunks SET embed_text = embed_text
                 WHERE pg_column_toast_chunk_id(tsv) IS NOT NULL OR pg_column_toast_chunk_id(tsv_simple) IS NOT NULL';
    ELSE
        UPDATE rag_chunks SET embed_text = embed_text;
    END IF;
END $$;
