"""Compatibility shim for `rag reembed --all | --version` (rag_lib/cli/reembed.py): the Dagster
commands now live in the code location (pipelines/cli.py), reached through the entry point."""

from __future__ import annotations

from typing import Optional


def _run(paths: list[str], collection: Optional[str], force: bool, job: str, embed_version: Optional[str],
         as_json: bool) -> None:
    from rag_lib.cli.plugins import plugin_function

    plugin_function("_run")(paths, collection, force, job, embed_version, as_json)
