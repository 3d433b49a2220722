-- Document frequencies per collection, text-search configuration and lexeme: how many chunks of the
-- collection hold the lexeme in `tsv` (english) or `tsv_simple` (simple), as a search engine's term
-- dictionary keeps them. Lexical search weighs each query lexeme by its IDF; counting a lexeme's
-- chunks through the GIN index the first time it was seen cost up to ~2,000 heap rows per lexeme
-- and most of a cold hybrid search at 1M chunks (docs/scale.md). Now it reads one row per lexeme.
--
-- Kept by the store in the transaction that publishes or deletes a document (rag_lib/store/
-- documents.py): a reader sees the counts of exactly the chunks it sees. Chunks do not depend on the
-- embedding space (vectors do), so re-embeds leave this table alone. Anything that rewrites the
-- tsvector columns (a migration like 020) must rebuild it (Store.rebuild_lexeme_frequencies).
-- fillfactor: a publish updates `chunks` in place; room on the page keeps those updates HOT.
CREATE TABLE rag_lexeme_frequencies (
    collection  text     NOT NULL,
    config      text     NOT NULL CHECK (config IN ('english', 'simple')),
    lexeme      text     NOT NULL,
    chunks      integer  NOT NULL,
    PRIMARY KEY (collection, config, lexeme)
) WITH (fillfactor = 80);

-- Back-fill from the chunks already published. unnest(tsvector) gives each lexeme of a chunk once,
-- so count(*) is the number of chunks holding it (what `tsv @@ 'lexeme'` counts).
INSERT INTO rag_lexeme_frequencies (collection, config, lexeme, chunks)
SELECT c.collection, 'english', u.lexeme, count(*) FROM rag_chunks c, unnest(c.tsv) u GROUP BY 1, 3
UNION ALL
SELECT c.collection, 'simple', u.lexeme, count(*) FROM rag_chunks c, unnest(c.tsv_simple) u GROUP BY 1, 3;
ANALYZE rag_lexeme_frequencies;
