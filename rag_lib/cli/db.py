"""`rag db start|stop|status|url`: the embedded PostgreSQL server."""

from __future__ import annotations

from pathlib import Path

import typer

from rag_lib.cli.app import app, console, fail, print_json
from rag_lib.config import get_settings
from rag_lib.db import embedded_running, other_clients, redacted_url, server_status, stop_embedded
from rag_lib.store.connection import library_url

db_app = typer.Typer(help="Manage the database server (embedded unless RAG_DATABASE_URL is set).", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("start")
def start() -> None:
    """Start the embedded server (reused if already running) and apply migrations."""
    from rag_lib.store import Store

    settings = get_settings()
    Store(settings).close()
    console.print(f"database ready: {redacted_url(library_url(settings))}")


@db_app.command("stop")
def stop(force: bool = typer.Option(False, "--force", help="Stop it even while other commands use it.")) -> None:
    """Stop the embedded server (refused while other commands are connected, unless --force)."""
    settings = get_settings()
    if settings.database_url:
        console.print("RAG_DATABASE_URL is set: that server is not managed here")
        return
    if not force and embedded_running(settings.pgdata):
        if users := clients_line(settings.pgdata):
            fail(f"not stopped: {users} use the embedded server and would fail; stop them first, or pass --force "
                 "to stop it anyway")
    console.print("stopped" if stop_embedded(settings.pgdata) else "not running")


def clients_line(pgdata: Path) -> str:
    """Who else is connected, as "2 connections (rag serve ×2)"; "" for no one."""
    from collections import Counter

    names = Counter(name or "unnamed" for name in other_clients(pgdata))
    if not names:
        return ""
    total = sum(names.values())
    which = ", ".join(f"{name} ×{n}" if n > 1 else name for name, n in names.most_common())
    return f"{total} connection{'s' if total > 1 else ''} ({which})"


@db_app.command("status")
def status(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Is the database up, and where."""
    st = server_status(get_settings())
    data = {"embedded": st.embedded, "running": st.running, "url": st.url, "pgdata": str(st.pgdata) if st.pgdata else None}
    if st.error:
        data["error"] = st.error
    if as_json:
        print_json(data)
    elif st.embedded:
        console.print(f"embedded server {'running' if st.running else 'stopped'}" + (f" at {st.url}" if st.url else ""),
                      soft_wrap=True, markup=False)
    elif st.running:
        console.print(f"external server running at {st.url}", soft_wrap=True, markup=False)
    else:
        console.print(f"external server at {st.url} does not answer: {st.error}; start it, or fix RAG_DATABASE_URL",
                      soft_wrap=True, markup=False)
    if not st.running:
        raise typer.Exit(3)


@db_app.command("url")
def url() -> None:
    """Print the connection URL (starts the embedded server if needed)."""
    typer.echo(library_url(get_settings()))
