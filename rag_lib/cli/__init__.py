"""The `rag` command. Each command group lives in its own module and registers on `app`."""

from __future__ import annotations

from rag_lib.cli.app import app, main
from rag_lib.cli import core as _core  # noqa: F401  (registers commands)
from rag_lib.cli import db as _db  # noqa: F401
from rag_lib.cli import serve as _serve  # noqa: F401
from rag_lib.cli import cache as _cache  # noqa: F401
from rag_lib.cli import eval as _eval  # noqa: F401
from rag_lib.cli import roots as _roots  # noqa: F401
from rag_lib.cli import graph as _graph  # noqa: F401
from rag_lib.cli import settings as _settings  # noqa: F401
# last: its `reembed` (--to/--status/--rollback/--drop-old/--abort, --all/--version in the library) wins
from rag_lib.cli import reembed as _reembed  # noqa: F401

from rag_lib.cli.plugins import load_plugins

load_plugins(app)  # e.g. `rag materialize` / `rag dev` from the Dagster code location (pipelines/cli.py)

__all__ = ["app", "main"]
