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
    for ep in command_plugins():
        try:
            ep.load()(app)
        except Exception:  # a broken plugin must not take `rag search` down with it
            log.warning("rag.commands plugin %s failed to load", ep.name, exc_info=True)


def plugin_function(name: str):
    """A function exported by a `rag.commands` plugin's module (e.g. `_run` for `rag reembed --all`)."""
    import importlib

    for ep in command_plugins():
        module = importlib.import_module(ep.module)
        if hasattr(module, name):
            return getattr(module, name)
    from rag_lib.errors import ConfigError

    raise ConfigError(f"no installed `rag` plugin provides {name} (is the Dagster code location installed?)")
