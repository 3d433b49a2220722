"""Sub-commands contributed by other packages through the `rag.commands` entry-point group: each
entry point is a callable taking the typer app (rag_lib itself imports none of them)."""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

from rag_lib.log import get_logger

GROUP = "rag.commands"
log = get_logger("cli")


def command_plugins() -> list:
    """The installed `rag.commands` entry points."""
    return list(entry_points(group=GROUP))


def load_plugins(app: typer.Typer) -> None:
    """Register every plugin's commands; a plugin that fails to load is logged, not fatal."""
    import sys

    for ep in command_plugins():
        if ep.module in sys.modules and not hasattr(sys.modules[ep.module], ep.attr):
            continue  # the plugin module is importing rag_lib.cli right now (imported directly, not via `rag`)
        try:
            ep.load()(app)
        except Exception:  # a broken plugin must not take `rag search` down with it
            log.warning("rag.commands plugin %s failed to load", ep.name, exc_info=True)
