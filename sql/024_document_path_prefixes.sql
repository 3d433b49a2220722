-- Documents by path prefix. `rag ingest PATH` names (and with --prune deletes) the documents under
-- PATH whose files are gone; it read every document path of the collection for that: ~190 ms of a
-- one-file ingest into 100k documents, now ~2 ms (benchmarks/stale_plan.py). The primary key orders
-- paths by the database's collation, which (unless it is "C") does not keep a folder's paths
-- together; text_pattern_ops orders them byte by byte, so a prefix is one range of this index
-- (the store's `~>=~` / `~<~` conditions).
CREATE INDEX IF NOT EXISTS rag_documents_path_prefix ON rag_documents (collection, path text_pattern_ops);
