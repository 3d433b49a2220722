"""Garbage collection around Dagster's objects. No Dagster import here: `rag materialize` pauses
collections before it imports Dagster."""

from __future__ import annotations

import gc
import multiprocessing
from collections.abc import Iterator
from contextlib import contextmanager

# Whether this process ends after its runs (`rag materialize`, a code server's run worker): see
# `collections_paused`.
_ONE_SHOT = {"process": False}


def ends_with_its_runs() -> None:
    """Mark this process as one that exits after its runs (the `rag materialize` command)."""
    _ONE_SHOT["process"] = True


def _process_ends_with_its_runs() -> bool:
    # a code server starts each run in a child process of its own (dagster._grpc.impl)
    return _ONE_SHOT["process"] or multiprocessing.parent_process() is not None


@contextmanager
def collections_paused() -> Iterator[None]:
    """No cyclic garbage collection while importing or loading Dagster's and the code location's
    objects (hundreds of thousands, nearly all kept for the process's life: each full collection
    over them found almost nothing), and in a process that ends with its runs those objects are then
    left out of every later collection (`gc.freeze`, never undone: what it keeps of reference
    cycles ends with the process). They cost a `rag materialize --force` of the shared corpus 2-3 s
    of collections against `rag ingest`'s 0.5 s. Processes that go on (tests, an application
    calling `materialize_corpus`) only pause."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        freeze_if_one_shot()
        if enabled:
            gc.enable()


def freeze_if_one_shot() -> None:
    """In a process that ends with its runs, leave every object alive now out of later collections
    (`gc.freeze`; see `collections_paused`)."""
    if _process_ends_with_its_runs():
        gc.freeze()
