"""The one ingest engine. `stages` holds the stage functions (load, flatten, chunk, embed through
the cache, publish); `state` the per-file state machine over their stored outputs (what is current,
what failed upstream, what a reconcile must redo); `run` the `rag ingest` driver. The Dagster assets
(pipelines/) drive the same modules."""

from rag_lib.ingest.run import ProgressFn, collect_files, ingest, source_files

__all__ = ["ProgressFn", "collect_files", "ingest", "source_files"]
