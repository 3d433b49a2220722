"""The code location's `rag` sub-commands: `rag dev` (embedded Postgres + Dagster UI + daemon) and
`rag materialize` (runs of the code location's job). They join the `rag` app through the
`rag.commands` entry point (pyproject.toml), so rag_lib imports nothing from pipelines. `_run` also
serves `rag reembed --all | --version V` with the re-embed job. Dagster is imported lazily."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from rag_lib.cli.app import console, err_console, fail, leave_on_interrupt, print_json
from rag_lib.config import get_settings
from rag_lib.models import CorpusRoot

UI_HINT = "open the Dagster UI with `rag dev` → http://127.0.0.1:3000 (runs, checks, lineage)"


def parse_roots(specs: list[str], default_collection: str) -> list[CorpusRoot]:
    """`path` or `collection=path` strings → roots (absolute paths, not yet registered)."""
    roots = []
    for spec in specs:
        collection, sep, path = spec.partition("=")
        if not sep:
            collection, path = default_collection, spec
        roots.append(CorpusRoot(Path(path).expanduser().resolve(), collection))
    return roots


def _roots(paths: list[str], collection: Optional[str]) -> list[CorpusRoot]:
    """The roots named on the command line (each an existing folder); none: every registered root."""
    roots = parse_roots(paths, collection or get_settings().collection)
    for root in roots:
        if not root.path.is_dir():
            fail(f"{root.path}: not a folder (each PATH is a corpus root)", 2)
    return roots


def _print_summary(summary, as_json: bool) -> None:
    if as_json:
        print_json(summary.to_dict())
        return
    for skip in summary.skipped:  # one line per file not ingested, with what to do
        console.print(f"skipped {skip['path']}: {skip['reason']}: {skip['detail']}", highlight=False, soft_wrap=True,
                      markup=False)
    if not summary.run_ids and not summary.waited_for:
        console.print(f"all {summary.partitions} files are current: nothing to run (--force runs them again)"
                      + (f"; removed {len(summary.removed)} files that are gone" if summary.removed else ""))
        return
    in_flight = f", {summary.in_flight} in runs in flight" if summary.in_flight else ""
    waited = f" + {len(summary.waited_for)} waited for" if summary.waited_for else ""
    table = Table(title=f"pipeline run: {summary.partitions} files ({summary.current} current{in_flight}), "
                        f"{len(summary.run_ids)} run(s){waited}, {summary.seconds:.1f}s")
    table.add_column("asset")
    table.add_column("partitions by status")
    for asset, counts in summary.stages.items():
        table.add_row(asset, ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    console.print(table)
    checks = Table(title="asset checks")
    for col in ("check", "asset", "result", "detail"):
        checks.add_column(col, overflow="fold")
    for c in summary.checks:
        result = "[green]passed[/]" if c.passed else ("[yellow]warn[/]" if c.severity == "WARN" else "[red]failed[/]")
        checks.add_row(c.name, c.asset, result, c.description)
    console.print(checks)
    if summary.removed:
        console.print(f"removed {len(summary.removed)} files that are gone")
    if summary.failed_partitions:
        failed = len(summary.failed_partitions)
        console.print(f"[red]{failed} file{'s' if failed != 1 else ''} failed[/] (see `rag status`): "
                      + ", ".join(summary.failed_partitions[:10]))
    for step in summary.failed_steps:  # a step that raised (a check's included) emits no result of its own
        console.print(f"[red]step {escape(step['step'])} failed[/] in run {step['run_id']}: {escape(step['error'])}",
                      soft_wrap=True)
    if not summary.success and not summary.failed_steps and not summary.failed_partitions:
        console.print("[red]a run did not succeed[/]; see it in the Dagster UI")
    runs = [f"runs: {', '.join(summary.run_ids)}"] if summary.run_ids else []
    if summary.waited_for:  # runs over the same files, already queued or in progress: waited for, not launched
        runs.append(f"waited for: {', '.join(summary.waited_for)}")
    console.print(f"{'; '.join(runs)}\n{UI_HINT}")


@contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """Point file descriptor 1 at stderr (child processes included) while active."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _say(line: str) -> None:
    """A line about what the command waits on, on stderr at once (stdout may be --json's)."""
    err_console.print(line, markup=False, highlight=False, soft_wrap=True)


def _run(paths: list[str], collection: Optional[str], force: bool, job: str, embed_version: Optional[str],
         as_json: bool, parallel: Optional[int] = None) -> None:
    from rag_lib import quality

    settings = get_settings()
    roots = _roots(paths, collection)
    try:
        if validates_new_chunks_here(settings, force, job, embed_version, parallel):
            # Its import (seconds of one core) runs beside Dagster's, on the core that import leaves
            # idle, instead of at the run's end where the chunk_sizes check waited for it (cold: 2.6-2.8 s).
            quality.preload_great_expectations()
        from pipelines.gc_policy import collections_paused, ends_with_its_runs

        ends_with_its_runs()
        with collections_paused():  # importing Dagster
            from pipelines.instance import get_instance
            from pipelines.launch import QueueWatch, materialize_corpus

        instance = get_instance(settings)
        watch = QueueWatch(say=_say)
        try:
            with _stdout_to_stderr(as_json):  # the code server and runs inherit fd 1: keep --json clean
                summary = materialize_corpus(instance, roots, force=force, job_name=job, embed_version=embed_version,
                                             parallel=parallel, watch=watch)
        except KeyboardInterrupt:  # runs in the queue go on without this command: say so, not "run it again"
            leave_on_interrupt(watch.interrupted_note())
            raise
        finally:
            instance.dispose()
    finally:
        quality.discard_unused_validator()  # e.g. every file current: no run, and no waiting for its import
    _print_summary(summary, as_json)
    if not summary.success or summary.failed_partitions:
        raise typer.Exit(1)


def validates_new_chunks_here(settings, force: bool, job: str, embed_version: Optional[str],
                              parallel: Optional[int]) -> bool:
    """Whether this `rag materialize` will likely validate a new chunk frame in this process: an
    ingest (whose runs check chunk_sizes) that is not forced (the files it runs are new or changed;
    a forced re-run of an unchanged corpus finds its frame validated before), one range at a time
    (runs in this process, unless a daemon's queue takes them: `pipelines.launch.runs_in_process`
    then discards the process unused)."""
    return job == "ingest_files" and not force and not embed_version \
        and (parallel or settings.pipeline.parallel_runs) == 1


def materialize(
    paths: list[str] = typer.Argument(None, help="Corpus folders (`path` or `collection=path`); default: every registered root."),
    collection: Optional[str] = typer.Option(None, "--collection", "-c", help="Collection for PATHS without one."),
    force: bool = typer.Option(False, "--force", help="Redo every stage, even for current files."),
    parallel: Optional[int] = typer.Option(None, "--parallel", "-p", min=1, max=32,
                                           help="Split the files into N ranges run at once (default: "
                                                "pipeline.parallel_runs)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Ingest through the Dagster code location (roots registered, one run per partition range).

    Each folder is registered as a corpus root, every file is a partition, and the runs of the
    code location's `ingest_files` job go to the instance (visible and re-executable in the UI).
    Files that are current (and materialized on this instance) get no run unless --force; files a
    run already queued or in progress covers get none either, and that run is waited for."""
    _run(paths or [], collection, force, "ingest_files", None, as_json, parallel)


def dev(
    port: int = typer.Option(3000, "--port", "-p", help="UI port."),
    host: str = typer.Option("127.0.0.1", "--host", "-h", help="UI address."),
) -> None:
    """Start the embedded Postgres and the Dagster UI + daemon (`dagster dev`) on the code location."""
    from pipelines.instance import WORKSPACE_YAML, prepare_dagster_home

    settings = get_settings()
    home = prepare_dagster_home(settings)
    repo = WORKSPACE_YAML.parent
    console.print(f"DAGSTER_HOME={home}\nDagster UI on http://{host}:{port} (Ctrl-C to stop)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    if Path("rag.yaml").is_file() and "RAG_CONFIG" not in env:
        env["RAG_CONFIG"] = str(Path("rag.yaml").resolve())  # the code server runs from the repo folder
    env.setdefault("RAG_HOME", str(settings.home.resolve()))
    dagster = Path(sys.executable).with_name("dagster")
    cmd = [str(dagster), "dev", "-w", str(WORKSPACE_YAML), "-h", host, "-p", str(port)]
    # `dagster dev` stops its webserver and daemon cleanly on SIGINT (KeyboardInterrupt); it must not
    # inherit an ignored SIGINT (a background job, a supervisor), or nothing could stop it.
    proc = subprocess.Popen(cmd, cwd=repo, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def stop(_signum, _frame) -> None:  # SIGTERM (systemd, kill): stop `dagster dev` as Ctrl-C does
        proc.send_signal(signal.SIGINT)

    signal.signal(signal.SIGTERM, stop)
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the child too (same process group); let it finish
        code = proc.wait()
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Entry point `rag.commands`: add `materialize` and `dev` to the `rag` app."""
    app.command()(materialize)
    app.command()(dev)
