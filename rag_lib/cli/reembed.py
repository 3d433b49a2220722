"""`rag reembed`: fill a new embedding space beside the active one and switch without downtime
(`--to`), inspect (`--status`), go back (`--rollback`), free space (`--drop-old`), abandon a build
(`--abort`); `--all` / `--version V` hand the work to the Dagster re-embed job."""

from __future__ import annotations

import inspect
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rag_lib.cli.app import app, console, fail, kb, print_json


def _print_status(data: dict) -> None:
    table = Table(title=f"embedding spaces (rollback → {data['rollback_to'] or 'none'})")
    for col in ("space", "status", "provider", "vectors", "coverage", "HNSW", "activated", "retired"):
        table.add_column(col)
    for s in data["spaces"]:
        table.add_row(s["space"], s["status"], s["provider"], f"{s['vectors']}/{s['chunks']}", f"{s['coverage']:.1%}",
                      "yes" if s["hnsw_index"] else "no", str(s["activated_at"] or "")[:19], str(s["retired_at"] or "")[:19])
    console.print(table)


def _print_report(report, as_json: bool) -> None:
    if as_json:
        print_json(report.to_dict())
        return
    console.print(
        f"{report.space}: {report.filled} vectors written ({report.from_cache} from cache, {report.embedded} embedded) "
        f"in {report.seconds:.1f}s"
    )
    for gate in report.gates:
        console.print(f"  {'[green]pass[/]' if gate.passed else '[red]FAIL[/]'} {gate.name}: {gate.detail}")


def _progress():
    bar = Progress(TextColumn("filling"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                   transient=True)
    task = bar.add_task("fill", total=None)
    return bar, (lambda done, total: bar.update(task, completed=done, total=total))


def _run_dagster_job(all_: bool, version: Optional[str], paths: list[str], collection: Optional[str],
                     as_json: bool) -> None:
    """`--all` / `--version V`: the Dagster re-embed job (pipelines.jobs.run_reembed_job)."""
    try:
        from pipelines.jobs import run_reembed_job
    except ImportError:
        run_reembed_job = None
    if run_reembed_job is None:
        try:  # the Dagster CLI module's runner, until pipelines.jobs exposes run_reembed_job
            from rag_lib.cli.dagster import _run
        except ImportError as exc:
            fail(f"`rag reembed --all/--version` runs the Dagster re-embed job, which is not available here ({exc}); "
                 "use `rag reembed --to MODEL[:DIMS]` instead")
            return
        _run(paths, collection, all_, "reembed", version, as_json)
        return
    params = inspect.signature(run_reembed_job).parameters
    extra = {k: v for k, v in (("paths", paths), ("collection", collection)) if k in params}
    result = run_reembed_job(all=all_, version=version, **extra)
    if result is not None:
        print_json(result.to_dict() if hasattr(result, "to_dict") else result)


@app.command()
def reembed(
    paths: list[str] = typer.Argument(None, help="With --all/--version: corpus folders (default pipeline.roots)."),
    to: Optional[str] = typer.Option(None, "--to", help="Target space MODEL[:DIMS], e.g. text-embedding-3-large:1024."),
    show_status: bool = typer.Option(False, "--status", help="Spaces, coverage and what a rollback returns to."),
    do_rollback: bool = typer.Option(False, "--rollback", help="Switch back to the previous space."),
    drop_old: bool = typer.Option(False, "--drop-old", help="Delete retired spaces' vectors and indexes."),
    abort: bool = typer.Option(False, "--abort", help="Abandon the space being built."),
    no_switch: bool = typer.Option(False, "--no-switch", help="Fill and check only; switch later."),
    skip_quality: bool = typer.Option(False, "--skip-quality", help="Switch without the eval-set nDCG@10 gate."),
    all_: bool = typer.Option(False, "--all", help="Run the Dagster re-embed job over every file."),
    version: Optional[str] = typer.Option(None, "--version", help="Run the Dagster re-embed job for embed_version V."),
    collection: Optional[str] = typer.Option(None, "--collection", "-c", help="With --all/--version: collection for PATHS."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Re-embed into a new vector space while search keeps serving the active one."""
    from rag_lib import reembed as rm

    chosen = [bool(to), show_status, do_rollback, drop_old, abort, all_ or version is not None]
    if sum(chosen) != 1:
        fail("choose exactly one of --to, --status, --rollback, --drop-old, --abort, --all/--version", 2)
    if all_ or version is not None:
        _run_dagster_job(all_, version, paths or [], collection, as_json)
        return
    base = kb()
    store = base.store
    if show_status:
        data = rm.status(store)
        print_json(data) if as_json else _print_status(data)
        return
    if drop_old:
        dropped = rm.drop_old(store)
        print_json(dropped) if as_json else console.print(
            "dropped " + (", ".join(f"{k} ({v} vectors)" for k, v in dropped.items()) or "nothing"))
        return
    if abort:
        gone = rm.abort(store)
        print_json({"aborted": gone}) if as_json else console.print(f"aborted {gone or 'nothing (no build in progress)'}")
        return
    bar, progress = _progress()
    with bar:
        report = (rm.rollback(base.settings, store, progress=progress) if do_rollback
                  else rm.reembed(base.settings, store, to, switch=not no_switch, skip_quality=skip_quality,
                                  progress=progress))
    _print_report(report, as_json)
    if report.switched and not as_json:
        console.print(
            f"[bold]{report.space}[/] is now the active space (was {report.previous}). Set embedding.model/dimensions "
            f"(and provider) to match in rag.yaml and restart servers; `rag reembed --rollback` goes back."
        )
    elif not no_switch and not report.switched:
        failed = "; ".join(f"{g.name}: {g.detail}" for g in report.gates if not g.passed) or "unknown reason"
        fail(f"did not switch to {report.space} ({failed}); {report.previous or 'the old space'} keeps serving")
