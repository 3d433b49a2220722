"""The Dagster code location (thin glue over rag_lib; no SQL or chunking here).

Modules: partitions (one partition per corpus file, run ranges), resources (RagResource: settings,
database, stage runner), assets (raw_documents → flattened_sections → chunks → embeddings →
vector_table → hnsw_index), checks, jobs, sensors (corpus watcher, run failures), schedules
(nightly reconcile, re-embed, index maintenance), instance (Postgres-backed DAGSTER_HOME), runner
(`rag materialize`), definitions (`defs`, loaded by workspace.yaml).
"""
