-- Full-text indexes without a pending list. With GIN's default `fastupdate`, new chunks' lexemes
-- wait in an unsorted list (up to gin_pending_list_limit, 4 MB) that every full-text query reads in
-- full, re-checking its matches against their rows: at 100k chunks one lexical query took 2.0 ms
-- with an empty list and 7.7 ms with 3,400 chunks in it, and over 200 questions lexical search's
-- p50 was 9.5-11.0 ms without the list and 12.5-13.2 ms with it (README, Benchmarks: "Full text
-- without a pending list"). Searches are what users wait for: a publish now writes its chunks'
-- lexemes into the index itself, ~0.2 ms more per chunk on the shared corpus, beside ~20 ms of
-- encoding.
ALTER INDEX rag_chunks_tsv SET (fastupdate = off);
ALTER INDEX rag_chunks_tsv_simple SET (fastupdate = off);
-- turning it off leaves the entries already in the list there (PostgreSQL docs, "GIN Fast Update Technique")
SELECT gin_clean_pending_list('rag_chunks_tsv'), gin_clean_pending_list('rag_chunks_tsv_simple');
