"""The Dagster code location (thin glue over rag_lib; no SQL or chunking here).

Modules: partitions (one partition per registered corpus file, the partition sync, run ranges),
resources (RagResource: settings, database, stage runner, partition map), gc_policy (garbage
collection around Dagster's objects), assets (raw_documents → flattened_sections → chunks → embeddings →
vector_table → hnsw_index), checks, jobs, sensors (corpus watcher, run failures), schedules
(nightly reconcile, re-embed, index maintenance), instance (Postgres-backed DAGSTER_HOME), launch
(`rag materialize`: runs of the code location's job), workers (the run launcher dagster.yaml names: is a
run's process still there), cli (`rag materialize`/`rag dev`, plugged into
`rag` through the `rag.commands` entry point), definitions (`defs`, loaded by workspace.yaml).
"""
