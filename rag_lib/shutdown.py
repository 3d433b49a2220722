"""Quick interpreter exit for processes that imported torch, Great Expectations or Dagster.

Python's shutdown ends with full garbage collections over every object still alive; with those
libraries loaded that is seconds of pure CPU (a Dagster run worker spent 2-6 s there after its run
had finished, and the caller waits for it). Freezing the heap at exit leaves those objects to
the operating system: exit codes, atexit handlers and explicit closes are unchanged, only
`__del__` of objects in reference cycles no longer runs at exit (Python never promised it)."""

from __future__ import annotations

import atexit
import gc

_REGISTERED = False


def skip_final_collections() -> None:
    """Freeze the heap when this process exits (once per process; later calls do nothing)."""
    global _REGISTERED
    if not _REGISTERED:
        # registered early, so it runs late: atexit handlers run last-registered first
        atexit.register(gc.freeze)
        _REGISTERED = True
