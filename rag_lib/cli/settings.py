"""`rag config`: every setting with the value in force, where it came from and what it does."""

from __future__ import annotations

from difflib import get_close_matches
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from rag_lib.cli.app import JsonOpt, app, console, fail, print_json


@app.command("config")
def config_command(
    name: Optional[str] = typer.Argument(None, help="A setting (search.top_k) or a section (search); default: all."),
    changed: bool = typer.Option(False, "--changed", help="Only settings that differ from their default."),
    markdown: bool = typer.Option(False, "--markdown", help="Print the settings reference (docs/settings.md)."),
    as_json: bool = JsonOpt,
) -> None:
    """Settings in force: value, source (default, $RAG_*, rag.yaml, a seed variable) and description."""
    from rag_lib.settings_doc import reference_markdown, setting_values

    if markdown:
        typer.echo(reference_markdown())
        return
    values = setting_values()
    if name:
        chosen = [v for v in values if v.doc.name == name or v.doc.name.startswith(name + ".")]
        if not chosen:
            near = get_close_matches(name, [v.doc.name for v in values] + sorted({v.doc.section for v in values}), n=1)
            fail(f"no setting or section named '{name}'" + (f"; did you mean '{near[0]}'?" if near else "")
                 + " (rag config lists them all)", 2)
        values = chosen
    if changed:
        values = [v for v in values if v.source != "default"]
    if as_json:
        print_json([{"name": v.doc.name, "value": v.value, "default": v.doc.default, "source": v.source,
                     "variable": v.doc.env, "type": v.doc.type, "description": v.doc.description} for v in values])
        return
    if len(values) == 1:
        v = values[0]
        console.print(f"[bold]{escape(v.doc.name)}[/] = {escape(_shown(v.value))}  ({escape(v.source)})", soft_wrap=True)
        console.print(f"default {escape(_shown(v.doc.default))}; variable {v.doc.env}; type {escape(v.doc.type)}",
                      soft_wrap=True)
        console.print(escape(v.doc.description), soft_wrap=True, highlight=False)
        return
    if not values:
        console.print("every setting has its default" if changed else "no settings")
        return
    table = Table("setting", "value", "source", box=None, show_edge=False)
    for v in values:
        table.add_row(escape(v.doc.name), escape(_shown(v.value)), escape(v.source))
    console.print(table)


def _shown(value: object) -> str:
    """A value as it is written in rag.yaml or a variable (JSON; a path as its text)."""
    import json

    return json.dumps(value, default=str)
