"""`rag reembed`: fill a new embedding space beside the active one and switch without downtime
(`--to`), inspect (`--status`), go back (`--rollback`), free space (`--drop-old`), abandon a build
(`--abort`); `--version V` re-embeds the documents embedded under embed_version V and `--all` every
document, in the library (no orchestrator needed)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rag_lib.cli.app import app, console, fail, kb, print_json, progress_bar
from rag_lib.embedding.spaces import settings_naming
from rag_lib.search.notes import plural


def _print_status(data: dict) -> None:
    table = Table(title=f"embedding spaces (rollback → {data['rollback_to'] or 'none'})")
    for col in ("space", "status", "provider", "vectors/chunks", "coverage", "HNSW", "activated", "retired"):
        # folded, never cut with "…": a space's name is what `--to` takes; the name and status stay whole
        table.add_column(col, overflow="fold", no_wrap=col in ("space", "status"))
    for s in data["spaces"]:
        table.add_row(s["space"], s["status"], s["provider"], f"{s['vectors']}/{s['chunks']}", f"{s['coverage']:.1%}",
                      "yes" if s["hnsw_index"] else "no", str(s["activated_at"] or "")[:19], str(s["retired_at"] or "")[:19])
    console.print(table)


def _print_report(report, as_json: bool) -> None:
    if as_json:
        print_json(report.to_dict())
        return
    console.print(f"{report.space}: {counts_text(report.chunks, report.chunks_from_cache, report.texts_embedded)} "
                  f"in {report.seconds:.1f}s")
    for gate in report.gates:
        console.print(f"  {'[green]pass[/]' if gate.passed else '[red]FAIL[/]'} {gate.name}: {gate.detail}")


def counts_text(chunks: int, from_cache: int, texts_embedded: int) -> str:
    """`120 chunks given a vector (30 from the embedding cache; 85 distinct texts embedded for the
    other 90)`: chunks and texts apart, as chunks with the same text share one vector."""
    rest = chunks - from_cache
    embedded = f"; {plural(texts_embedded, 'distinct text')} embedded for the other {rest}" if rest or texts_embedded else ""
    return f"{plural(chunks, 'chunk')} given a vector ({from_cache} from the embedding cache{embedded})"


def _settings_step(base, space: str) -> str:
    """What to set after a switch to `space`, with the values, or that the settings name it already."""
    if base.settings.embedding.space == space:
        return "The settings name it already: "
    row = next(s for s in base.reembed_status()["spaces"] if s["space"] == space)
    return f"Set {settings_naming(row)} in rag.yaml and restart the servers; "


def _after_settings(carried: dict) -> str:
    """What the next `rag ingest` under settings naming the new space does (`reembed.carry_over`)."""
    if "skipped" in carried:
        return f"the next `rag ingest` republishes every document ({escape(carried['skipped'])})."
    return f"`rag ingest` then finds the {carried.get('documents', 0)} documents current (nothing is republished)."


def _progress():
    bar = progress_bar(TextColumn("filling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    task = bar.add_task("fill", total=None)
    return bar, (lambda done, total: bar.update(task, completed=done, total=total))


def _reembed_documents(base, version: Optional[str], paths: list[str], collection: Optional[str],
                       as_json: bool) -> None:
    """`--version V`: documents published under embed_version V; `--all`: every document (or PATHS)."""
    if version is not None:
        data = base.reembed_version(version)
    elif paths:
        data = base.reembed_paths(paths, collection)
    else:
        data = base.reembed_all()
    if as_json:
        print_json(data)
    else:
        which = (f"{data['documents']} documents embedded with version {data['version']}" if data["version"] is not None
                 else f"the {data['documents']} documents of {', '.join(data['paths'])}" if "paths" in data
                 else f"all {data['documents']} documents")
        console.print(f"{which}: {data['reembedded']} re-embedded under version {data['current_version']}, "
                      f"{data['failed']} failed; "
                      f"{counts_text(data['chunks'], data['chunks_from_cache'], data['texts_embedded'])}")
        if data["version"] is not None and not data["documents"]:
            console.print(f"no document is embedded under embed_version {data['version']} with today's model and "
                          f"chunking; today's version is {data['current_version']} (embedding.embed_version)",
                          style="yellow", markup=False)
        for path in data["missing_sources"]:
            console.print(f"source file gone, not re-embedded: {path}", style="yellow", markup=False)
    if data.get("failed") or data.get("missing_sources"):
        raise typer.Exit(1)


@app.command()
def reembed(
    paths: list[str] = typer.Argument(None, help="With --all: corpus folders (default: every document's own file)."),
    to: Optional[str] = typer.Option(None, "--to", help="Target space MODEL[:DIMS], e.g. text-embedding-3-large:1024."),
    show_status: bool = typer.Option(False, "--status", help="Spaces, coverage and what a rollback returns to."),
    do_rollback: bool = typer.Option(False, "--rollback", help="Switch back to the previous space."),
    drop_old: bool = typer.Option(False, "--drop-old", help="Delete retired spaces' vectors and indexes."),
    abort: bool = typer.Option(False, "--abort", help="Abandon the space being built."),
    no_switch: bool = typer.Option(False, "--no-switch", help="Fill and check only; switch later."),
    skip_quality: bool = typer.Option(False, "--skip-quality", help="Switch without the eval-set nDCG@10 gate."),
    all_: bool = typer.Option(False, "--all", help="Re-chunk and re-embed every document (after model/chunking changes)."),
    version: Optional[str] = typer.Option(None, "--version", help="Re-embed the documents embedded with embed_version V."),
    collection: Optional[str] = typer.Option(None, "--collection", "-c", help="With --all: collection for PATHS."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Re-embed into a new vector space while search keeps serving the active one."""
    chosen = [bool(to), show_status, do_rollback, drop_old, abort, all_ or version is not None]
    if sum(chosen) != 1:
        fail("choose exactly one of --to, --status, --rollback, --drop-old, --abort, --all/--version", 2)
    base = kb()
    if version is not None or all_:
        _reembed_documents(base, version, paths or [], collection, as_json)
        return
    if show_status:
        data = base.reembed_status()
        print_json(data) if as_json else _print_status(data)
        return
    if drop_old:
        dropped = base.reembed_drop_old()
        print_json(dropped) if as_json else console.print(
            "dropped " + (", ".join(f"{k} ({v} vectors)" for k, v in dropped.items()) or "nothing"))
        return
    if abort:
        gone = base.reembed_abort()
        print_json({"aborted": gone}) if as_json else console.print(f"aborted {gone or 'nothing (no build in progress)'}")
        return
    bar, progress = _progress()
    with bar:
        report = (base.reembed_rollback(progress=progress) if do_rollback
                  else base.reembed_to(to, switch=not no_switch, skip_quality=skip_quality, progress=progress))
    _print_report(report, as_json)
    if report.switched and not as_json:
        console.print(
            f"[bold]{report.space}[/] is now the active space (was {report.previous}). {_settings_step(base, report.space)}"
            f"{_after_settings(report.carried)} `rag reembed --rollback` goes back."
        )
    elif not no_switch and not report.switched:
        failed = "; ".join(f"{g.name}: {g.detail}" for g in report.gates if not g.passed) or "unknown reason"
        fail(f"did not switch to {report.space} ({failed}); {report.previous or 'the old space'} keeps serving")
