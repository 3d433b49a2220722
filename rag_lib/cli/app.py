"""The typer app, shared state and the one error boundary: a `RagError` becomes one clear line on
stderr and exit code 1 (2 for usage errors); `--debug` shows the traceback."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import typer
from rich.markup import escape
from rich.progress import Progress, ProgressColumn

from rag_lib.cli.output import CliConsole
from rag_lib.db import database_gone
from rag_lib.errors import RagError, first_line
from rag_lib.log import get_logger, setup_logging
from rag_lib.shutdown import skip_final_collections

app = typer.Typer(
    name="rag",
    help="RAG knowledge base for trading research (PostgreSQL + pgvector).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = CliConsole()  # in a pipe or a file, each table row on one line (see `CliConsole`)
err_console = CliConsole(stderr=True)
log = get_logger("cli")
# interrupt_kept: what an interrupt leaves, once the command knows it better than INTERRUPTED (`leave_on_interrupt`)
STATE: dict[str, Any] = {"debug": False, "kb": None, "command": None, "interrupted": False, "interrupt_kept": None}

# What an interrupted command leaves behind and how to go on (the rest of `interrupted_line`)
_WRITES_WHOLE = ("files already published stay published and none is half-written (each document is one "
                 "transaction); run the same command again to resume: published files are skipped as unchanged")
INTERRUPTED = {
    "ingest": _WRITES_WHOLE,
    "embed": _WRITES_WHOLE,
    "reembed": ("what was re-embedded so far is kept whole (each batch or document is one transaction) and the "
                "active space keeps serving; run the same command again to resume"),
    "eval": "its scores so far are discarded; run the same command again",
    "search": "nothing was changed; run the search again",
}


@app.callback()
def _root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks and debug logs."),
) -> None:
    STATE["debug"] = debug
    STATE["command"] = ctx.invoked_subcommand
    if debug:
        setup_logging("DEBUG")


def kb():
    """The knowledge base for this command (opened once)."""
    if STATE["kb"] is None:
        from rag_lib.api import KnowledgeBase

        STATE["kb"] = KnowledgeBase()
    return STATE["kb"]


def print_json(data: Any) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, default=str, indent=None) + "\n")


def progress_bar(*columns: str | ProgressColumn, hidden: bool = False) -> Progress:
    """A transient progress bar on stdout, shown only in a terminal: into a pipe or a file it shows
    nothing, and rich would still print a blank line before the output."""
    return Progress(*columns, console=console, transient=True, disable=hidden or not console.is_terminal)


CollectionOpt = typer.Option(None, "--collection", "-c", help="Collection (default: settings.collection, 'default').")
EveryCollectionOpt = typer.Option(None, "--collection", "-c", help="Only this collection (default: every collection).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON document.")


def fail(message: str, code: int = 1) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def interrupted_line(command: str | None) -> str:
    """The one line an interrupt (Ctrl-C) prints: what stopped, what is kept, what to do."""
    name = f"rag {command}" if command else "rag"
    kept = STATE["interrupt_kept"] or INTERRUPTED.get(command or "",
                                                      "what it finished writing is kept whole; run the same command again")
    return f"interrupted: {name} stopped before it finished; {kept}"


def leave_on_interrupt(kept: str | None) -> None:
    """What an interrupt of the running command leaves, known only as it runs (e.g. the runs it
    queued): `interrupted_line` says it instead of the command's INTERRUPTED entry (None: that)."""
    STATE["interrupt_kept"] = kept


def _note_interrupt(signum: int, frame: Any) -> None:
    """SIGINT: remember it (typer turns the KeyboardInterrupt into a silent exit code 130), then interrupt."""
    STATE["interrupted"] = True
    signal.default_int_handler(signum, frame)


def _interrupted() -> None:
    log.info("interrupted by the user (SIGINT) during rag %s", STATE["command"] or "")
    err_console.print(escape(interrupted_line(STATE["command"])), highlight=False, soft_wrap=True)
    sys.exit(130)


def database_gone_line(exc: BaseException) -> str:
    """What a command that lost its database says: why, what its writes left (as for an interrupt) and
    what to do."""
    left = INTERRUPTED.get(STATE["command"] or "", "each write is one transaction, so none is half done")
    return (f"the database stopped answering ({type(exc).__name__}); {left}; start the database first (`rag db "
            "start`, or the server of RAG_DATABASE_URL)")


def main() -> None:
    """Console-script entry point."""
    skip_final_collections()  # torch, Dagster and GE make a plain exit take seconds
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    STATE["interrupted"] = False
    STATE["interrupt_kept"] = None
    previous = signal.signal(signal.SIGINT, _note_interrupt)
    try:
        # Non-standalone click returns the code of typer.Exit instead of raising it.
        code = app(standalone_mode=False)
        if STATE["interrupted"]:
            _interrupted()
        if isinstance(code, int) and code:
            sys.exit(code)
    except RagError as exc:
        log.debug("command failed", exc_info=True)
        if STATE["debug"]:
            raise
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _interrupted()
    except typer.Abort:
        err_console.print("aborted")
        sys.exit(130)
    except Exception as exc:  # click usage errors and unexpected failures
        # typer ships its own click (`typer._click`): its usage errors are not `click.ClickException`s,
        # only `typer.TyperException`s that can show themselves (usage, hint and error; exit code 2)
        if isinstance(exc, typer.TyperException) and callable(getattr(exc, "show", None)):
            exc.show()
            sys.exit(getattr(exc, "exit_code", 2))
        if STATE["debug"]:
            raise
        log.debug("command failed", exc_info=True)  # the whole message (a statement too) with --debug
        if database_gone(exc):  # not a bug: the server stopped or the network went (was "unexpected PoolTimeout")
            err_console.print(f"[bold red]error:[/] {escape(database_gone_line(exc))}", highlight=False, soft_wrap=True)
            sys.exit(1)
        err_console.print(f"[bold red]error:[/] unexpected {type(exc).__name__}: {escape(first_line(exc))} "
                          "(for the traceback: rag --debug COMMAND ...)", highlight=False, soft_wrap=True)
        sys.exit(1)
    finally:
        if STATE["kb"] is not None:  # its pools and encoder threads, also after an interrupt
            STATE["kb"].close()
            STATE["kb"] = None
        signal.signal(signal.SIGINT, previous)
