"""`rag cache stats|prune`: the embedding cache; `print_usage` renders embedding spend for `rag status`."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from rag_lib.cli.app import app, console, kb, print_json

cache_app = typer.Typer(help="The embedding cache (content hash, model, dimensions → vector).", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("stats")
def stats(as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
    """Entries per model and dimensions, how many live chunks use them, and the size on disk."""
    data = kb().cache_stats()
    if as_json:
        print_json(data)
        return
    table = Table(title=f"embedding cache: {data['entries']} entries, {data['bytes'] / 1e6:.1f} MB")
    for col in ("model", "dims", "entries", "used by live chunks", "oldest", "last used"):
        table.add_column(col, overflow="fold")  # a model cut with "…" could not be looked up
    for row in data["models"]:
        table.add_row(row["model"], str(row["dimensions"]), str(row["entries"]), str(row["referenced"]),
                      str(row["oldest"])[:19], str(row["last_used"])[:19])
    console.print(table)


@cache_app.command("prune")
def prune(
    older_than: float = typer.Option(30.0, "--older-than", min=0, help="Days since last use."),
    model: str = typer.Option(None, "--model", help="Only this model's entries."),
    include_live: bool = typer.Option(
        False, "--include-live", help="Also delete entries live chunks still use (re-runs and rollbacks then pay again)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Delete entries not used for --older-than days (entries of live chunks are kept by default)."""
    deleted = kb().cache_prune(older_than, include_live, model)
    if as_json:
        print_json({"deleted": deleted})
    else:
        console.print(f"deleted {deleted} cache entries")


def print_usage(usage: dict[str, Any] | None) -> None:
    """Embedding spend for `rag status`: totals per provider and the latest runs."""
    if not usage or not usage.get("by_provider") and not usage.get("recent_runs"):
        return
    if usage["by_provider"]:
        table = Table(title="embedding usage by provider (all runs)")
        for col in ("provider", "model", "dims", "requests", "retries", "failures", "tokens", "est. cost USD"):
            # folded, not cut with "…": a model or run id cut short cannot be looked up
            table.add_column(col, justify="right" if col not in ("provider", "model") else "left", overflow="fold")
        for r in usage["by_provider"]:
            table.add_row(r["provider"], r["model"], str(r["dimensions"]), str(r["requests"]), str(r["retries"]),
                          str(r["failures"]), str(r["tokens"]), f"{r['cost_usd']:.4f}")
        console.print(table)
    if usage["recent_runs"]:
        table = Table(title="recent embedding runs")
        for col in ("run", "kind", "started", "cache hit rate", "requests", "tokens", "est. cost USD"):
            table.add_column(col, overflow="fold")
        for r in usage["recent_runs"]:
            rate = "-" if r["cache_hit_rate"] is None else f"{r['cache_hit_rate']:.0%}"
            table.add_row(r["run_id"], r["kind"], str(r["started_at"])[:19], rate, str(r["requests"]),
                          str(r["tokens"]), f"{r['cost_usd']:.4f}")
        console.print(table)
