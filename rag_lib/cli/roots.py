"""`rag roots list|add|remove`: the corpus-roots registry the Dagster code location watches."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from rag_lib.cli.app import CollectionOpt, app, console, kb, print_json

roots_app = typer.Typer(help="Corpus roots: folders ingested or materialized, watched by the pipeline.",
                        no_args_is_help=True)
app.add_typer(roots_app, name="roots")


def _root_dict(root) -> dict:
    return {"name": root.name, "path": str(root.path), "collection": root.collection}


@roots_app.command("list")
def list_roots(as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
    """Registered roots (rag.yaml's pipeline.roots included) with their collection and key label."""
    roots = kb().roots()
    if as_json:
        print_json([_root_dict(r) for r in roots])
        return
    table = Table(title=f"{len(roots)} corpus root(s)")
    for col in ("name", "collection", "path", "exists"):
        table.add_column(col, overflow="fold")
    for r in roots:
        table.add_row(r.name, r.collection, str(r.path), "yes" if r.path.is_dir() else "[red]no[/]")
    console.print(table)


@roots_app.command("add")
def add_root(
    path: str = typer.Argument(..., help="An existing folder."),
    collection: Optional[str] = CollectionOpt,
) -> None:
    """Register a folder: the corpus sensor picks up its files on its next tick."""
    root = kb().add_root(path, collection)
    console.print(f"registered {root.path} → collection '{root.collection}' (partition keys '{root.name}/…')", markup=False)


@roots_app.command("remove")
def remove_root(
    path: str = typer.Argument(..., help="A registered root."),
    collection: Optional[str] = typer.Option(None, "--collection", "-c", help="Only this collection's registration."),
) -> None:
    """Stop watching a folder. Its documents stay (remove them with `rag delete`)."""
    removed = kb().remove_root(path, collection)
    for root in removed:
        console.print(f"unregistered {root.path} (collection '{root.collection}'); its documents are kept", markup=False)
