"""Core commands: init, ingest, search, status, list, show, delete, validate, reset."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rag_lib.cli.app import CollectionOpt, EveryCollectionOpt, JsonOpt, app, console, fail, kb, print_json, progress_bar
from rag_lib.cli.output import PathCell
from rag_lib.documents import record_of
from rag_lib.errors import first_of
from rag_lib.log import get_logger
from rag_lib.models import IngestReport

log = get_logger("cli")
FOLD_OVER = 3  # a JSONL file's rows of one status and reason beyond this many are one row of a table
FOLD_SHOWN = 5  # the records a folded row names


def _date(value: Optional[str], name: str) -> Optional[dt.date]:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        fail(f"{name} must be a date like 2025-01-31, got '{value}'", 2)
    return None


@app.command()
def init() -> None:
    """Start the database, apply migrations and load the embedding model once."""
    info = kb().init()
    console.print(f"ready: database {info['database']}, model {info['space']}")


def print_ingest_report(report: IngestReport) -> None:
    table = Table(title=f"ingest into '{report.collection}' ({report.seconds:.1f} s)")
    table.add_column("files / chunks")
    table.add_column("count", justify="right")
    for status in ("new", "changed", "unchanged", "skipped", "failed"):
        table.add_row(f"{status} files", str(report.count(status)))
    table.add_row("pruned documents", str(len(report.pruned)))
    table.add_row("chunks published", str(report.chunks))
    # chunks and texts apart, as `rag reembed` counts them: chunks with the same text share one vector
    table.add_row("chunks from the embedding cache", str(report.chunks_from_cache))
    table.add_row(f"distinct texts embedded for the other {report.chunks - report.chunks_from_cache}",
                  str(report.texts_embedded))
    console.print(table)
    problems = [o for o in report.outcomes if o.status in ("skipped", "failed")]
    if problems:
        detail = Table(title="skipped and failed inputs")
        for col in ("path", "status", "reason", "detail"):
            detail.add_column(col, overflow="fold", no_wrap=col in ("status", "reason"))
        rows = folded([{"path": o.path, "status": o.status, "reason": o.reason or "", "detail": o.detail or ""}
                       for o in problems])
        for row in rows:
            detail.add_row(PathCell(row["path"]), row["status"], row["reason"], escape(row["detail"]))
        detail.caption = _folded_caption(rows)
        console.print(detail)
    if report.held:
        console.print(f"[yellow]served from an older version[/] (the newest edit is skipped, the last good version "
                      f"stays live): {escape(_some(report.held))}; fix and ingest again", soft_wrap=True, highlight=False)
    warned = [(o.path, w) for o in report.outcomes for w in o.warnings]
    if warned:
        table = Table(title="ingested without some of their metadata")
        for col in ("path", "warning"):
            table.add_column(col, overflow="fold")
        for path, warning in warned:
            table.add_row(PathCell(path), escape(warning))
        console.print(table)
    if report.pruned:  # what --prune deleted, by name: a count alone hides a surprise
        console.print(f"pruned (their files are gone): {escape(_some(report.pruned))}", soft_wrap=True, highlight=False)
    if report.stale:  # a renamed file's old document would otherwise come back in searches unnoticed
        console.print(f"still served though their files are gone: {escape(_some(report.stale))}; run the same "
                      "command with --prune to delete them", soft_wrap=True, highlight=False)


def folded(rows: list[dict]) -> list[dict]:
    """Table rows (`path`, `reason`, `detail`, maybe `status`) with the JSONL records of one file
    that share a status and reason folded into one row when there are more than FOLD_OVER of them (a
    file repeating one `_id` on 2,000 lines gave 2,000 rows): the file, how many, the first records
    and the first one's detail, `folded` set to the count. The records of each fold are logged at
    INFO; `--json` keeps every row."""
    groups: dict[tuple, list[dict]] = {}
    for n, row in enumerate(rows):
        record = record_of(row["path"])
        key = (record[0], row.get("status"), row["reason"]) if record else (n,)
        groups.setdefault(key, []).append(row)
    out = []
    for key, group in groups.items():
        if len(group) <= FOLD_OVER:
            out.extend(group)
            continue
        group = sorted(group, key=_record_order)  # status lists them by path text: line 10 before line 2
        records = [record_of(r["path"])[1] for r in group]
        named = _named_records(records)
        log.info("%s: %d records %s as %s: %s", key[0], len(group), group[0].get("status", "skipped"), key[2],
                 _named_records(records, len(records)))
        out.append({**group[0], "path": key[0], "folded": len(group),
                    "detail": f"{len(group)} records ({named}); first: {group[0]['detail']}"})
    return out


def _record_order(row: dict) -> int:
    """A record row's line number (a skipped record's), for sorting; 0 for a record named by its id."""
    label = record_of(row["path"])[1]
    return int(label.removeprefix("line ")) if label.startswith("line ") and label[5:].isdigit() else 0


def _named_records(records: list[str], shown: int = FOLD_SHOWN) -> str:
    """`lines 3, 4, 5 and 1,995 more` (skipped records) or `ids a, b, c` (documents)."""
    lines = all(r.startswith("line ") for r in records)
    names = [r.removeprefix("line ") for r in records] if lines else records
    more = len(names) - shown
    return ("lines " if lines else "ids ") + ", ".join(names[:shown]) + (f" and {more:,} more" if more > 0 else "")


def _folded_caption(rows: list[dict]) -> str | None:
    """Under a table with folded rows: where every record is listed."""
    if not any(r.get("folded") for r in rows):
        return None
    return "rows of many records of one JSONL file are folded: --json lists every one (RAG_LOG_LEVEL=INFO logs them)"


def _served(row: dict) -> str:
    """The documents a held file still serves: how many, and which (the first few)."""
    if row["examples"] == [row["path"]]:
        return "its 1 document"
    more = row["documents"] - len(row["examples"])
    return f"{row['documents']} documents: " + ", ".join(row["examples"]) + (f" and {more:,} more" if more > 0 else "")


def _some(paths: list[str], shown: int = 20) -> str:
    """The first `shown` paths and how many more."""
    return first_of(paths, shown)


@app.command("embed", help="Same as `ingest` (the name the design brief uses).")
@app.command()
def ingest(
    paths: Optional[list[Path]] = typer.Argument(None, help="Files or folders (a folder is its own corpus root)."),
    dirs: Optional[list[Path]] = typer.Option(None, "--dir", help="A folder to embed (seed 000's `rag embed --dir "
                                              "DIR`; same as giving it as an argument). Repeatable."),
    collection: Optional[str] = CollectionOpt,
    prune: bool = typer.Option(False, "--prune", help="Delete documents whose files are gone (under the folders or of the files named)."),
    prune_empty: bool = typer.Option(False, "--prune-empty", help="--prune, and also under a root that lists no files "
                                     "at all (--prune keeps those documents: an unmounted disk leaves an empty folder)."),
    force: bool = typer.Option(False, "--force", help="Re-chunk and re-publish unchanged files too."),
    root: Optional[Path] = typer.Option(None, "--root", help="Corpus root for file arguments (unit ids are relative to it)."),
    as_json: bool = JsonOpt,
) -> None:
    """Parse, chunk, embed and publish files; unchanged files are skipped."""
    for d in dirs or []:
        if not d.is_dir():
            fail(f"--dir {d}: not a directory; give a folder, or the file as an argument", 2)
    paths = [*(paths or []), *(dirs or [])]
    if not paths:
        fail("nothing to ingest: give files or folders as arguments, or --dir DIR", 2)
    base = kb()
    with progress_bar(TextColumn("[bold]ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), hidden=as_json) as bar:
        task = bar.add_task("", total=None)
        report = base.ingest(
            paths, collection, prune=prune, force=force, root=root, prune_empty=prune_empty,
            progress=lambda name, done, total: bar.update(
                task, completed=done, total=total, description=Path(name).name[:40]),
        )
    if as_json:
        print_json(report.to_dict())
    else:
        print_ingest_report(report)
    if report.count("failed"):
        raise typer.Exit(1)


@app.command()
def search(
    query: str = typer.Argument(..., help="What to look for."),
    mode: str = typer.Option("semantic", "--mode", "-m", help="semantic | lexical | hybrid"),
    collection: Optional[str] = CollectionOpt,
    doc_type: Optional[list[str]] = typer.Option(None, "--doc-type", "--type", "-t", help="Only these document types."),
    ticker: Optional[list[str]] = typer.Option(None, "--ticker", help="Only these tickers."),
    section: Optional[str] = typer.Option(None, "--section", help="Only sections whose path contains this, any "
                                          "case (seed 000: `--section risks` searches the risk sections)."),
    date_from: Optional[str] = typer.Option(None, "--from", "--since", help="Documents dated on or after (YYYY-MM-DD)."),
    date_to: Optional[str] = typer.Option(None, "--to", help="Documents dated on or before (YYYY-MM-DD)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", "-k", min=1, max=1000,
                                        help="How many results (default: search.top_k, 10)."),
    min_similarity: float = typer.Option(0.0, "--min-similarity", min=0.0, max=1.0),
    path: Optional[str] = typer.Option(None, "--path", help="Only documents whose path starts with this."),
    chunks: bool = typer.Option(False, "--chunks", help="Every matching chunk, not one result per section."),
    rerank: Optional[bool] = typer.Option(None, "--rerank/--no-rerank", help="Rerank the head (default: settings)."),
    as_json: bool = JsonOpt,
) -> None:
    """Search the knowledge base (one result per section unless --chunks)."""
    from rag_lib.search import MODES

    if mode not in MODES:
        fail(f"--mode must be one of {', '.join(MODES)}, got '{mode}'", 2)
    result = kb().search(
        query, mode=mode, collection=collection, doc_type=doc_type, ticker=ticker, section_contains=section,
        date_from=_date(date_from, "--from/--since"), date_to=_date(date_to, "--to"), top_k=top_k,
        min_similarity=min_similarity, path=path, group=not chunks, rerank=rerank,
    )
    if as_json:
        print_json(result.to_dict())
        return
    if not result.hits:
        console.print("no results" + (f": {result.note}" if result.note else ""), soft_wrap=True)
        _say_if_the_database_is_empty()
        return
    # the query, unit ids and passages are printed as they are, not read as console markup
    table = Table(title=escape(f"{result.mode} search: {query}  ({result.timings_ms.get('total', 0):.0f} ms)"))
    for name in ("#", "score", "date", "ticker"):  # short: never wrapped, so the unit and text get the rest
        table.add_column(name, justify="right" if name in ("#", "score") else "left", no_wrap=True)
    table.add_column("unit")
    table.add_column("text", overflow="fold")
    for n, hit in enumerate(result.hits, 1):
        score = f"{hit.score:.3f}" if hit.rerank_score is None else f"{hit.score:.3f} / {hit.rerank_score:.3f}"
        table.add_row(str(n), score, str(hit.doc_date or ""), escape(hit.ticker or ""), PathCell(hit.unit_id),
                      escape(_excerpt_cell(hit)))
    console.print(table)
    for line in (_plan_hints(result.plan or {}), _order_hint(result.plan or {})):
        if line:
            console.print(f"[dim]{escape(line)}[/]")


def _excerpt_cell(hit) -> str:
    """A hit's excerpt on one line, whole (the excerpt marks its own cuts with "…"); without one, its
    text cut at `EXCERPT_CHARS` with "…", never mid-word without a mark."""
    from rag_lib.search.results import EXCERPT_CHARS

    text = (hit.excerpt or hit.text).replace("\n", " ")
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 1].rstrip() + "…"


def _plan_hints(plan: dict) -> str:
    """What the question was read as, where it changed the ranking: tickers named or linked (a
    description matched to a ticker's profile), document types, documents and dates named (soft boosts),
    and the types whose documents were also searched alone (`plan.type_lists`)."""
    linked = plan.get("linked") or {}
    named = [t for t in plan.get("tickers") or [] if t not in linked]
    parts = [f"named {', '.join(named)}"] if named else []
    parts += [f"linked {t} (profile similarity {s:.2f})" for t, s in linked.items()]
    if plan.get("doc_types"):
        parts.append(f"document types {', '.join(plan['doc_types'])}")
    if plan.get("documents"):
        parts.append(f"documents {', '.join(plan['documents'])}")
    if plan.get("dates"):
        parts.append(f"dated {' to '.join(dict.fromkeys(plan['dates']))}")
    if plan.get("type_lists"):
        parts.append(f"{', '.join(plan['type_lists'])} also searched alone")
    return "preferred: " + "; ".join(parts) if parts else ""


def _order_hint(plan: dict) -> str:
    """Why a trend question's scores are out of order: its results read in date order."""
    from rag_lib.search.classify import asks_for_latest

    if plan.get("kind") != "trend":
        return ""
    newest = asks_for_latest(plan.get("query") or "")
    return f"in date order, {'newest' if newest else 'oldest'} first (a question about " \
           f"{'the latest' if newest else 'change over time'}), not by score"


@app.command()
def status(collection: Optional[str] = EveryCollectionOpt, as_json: bool = JsonOpt) -> None:
    """Documents, chunks, vectors, skipped inputs, files served from an older version and recent failures."""
    data = kb().status(collection)
    if as_json:
        print_json(data)
        return
    space = data["active_space"]["space"] if data["active_space"] else "none"
    console.print(
        f"[bold]{data['documents']}[/] documents, [bold]{data['chunks']}[/] chunks, {data['tokens']} tokens; "
        f"active space {space}; last ingest {data['last_ingest'] or 'never'}"
    )
    if not data["documents"]:
        _say_if_the_database_is_empty()
    if mismatch := kb().space_mismatch():
        console.print(mismatch, style="yellow", markup=False, soft_wrap=True)
    elif data.get("documents_with_other_settings"):
        console.print(other_settings_note(data["documents_with_other_settings"]), style="yellow", markup=False,
                      soft_wrap=True)
    for building in (v for v in data["vectors"] if v["status"] == "building"):
        name = building["space"]
        state = (f"is filled but not active (--no-switch, or a gate failed); `rag reembed --to {name}` checks and "
                 "switches to it" if building["vectors"] >= data["chunks"] else
                 f"is under way or was stopped: {building['vectors']} of {data['chunks']} chunks have a vector there; "
                 f"`rag reembed --to {name}` resumes it")
        console.print(f"a re-embed into {name} {state}, `rag reembed --abort` abandons it", style="yellow",
                      markup=False, soft_wrap=True)
    if collection and not data["documents"] and any(c["documents"] for c in data["collections"]):  # others do
        console.print(f"[yellow]{escape(kb().empty_collection_note(collection) or '')}[/]", soft_wrap=True)
    index = data.get("index") or {}
    if index:
        console.print(f"index size {index['index_size_mb']:.1f} MB (tables and indexes {index['total_size_mb']:.1f} MB), "
                      f"{index['vector_rows']} vector rows, ef_search {index['ef_search']}")
        for h in index["hnsw"]:
            console.print(f"  HNSW {h['index']}: {h['size_mb']:.1f} MB, m {h['m']}, ef_construction "
                          f"{h['ef_construction']}, {h['rows_indexed']} rows at build")
    if data["by_type"]:
        table = Table(title="documents by type")
        table.add_column("type")
        table.add_column("documents", justify="right")
        for name, count in data["by_type"].items():
            table.add_row(name, str(count))
        console.print(table)
    if data["skipped"]:
        table = Table(title="skipped inputs")
        for col in ("path", "reason", "detail"):
            table.add_column(col, overflow="fold", no_wrap=col == "reason")
        rows = folded(data["skipped"])
        for row in rows:
            table.add_row(PathCell(row["path"]), row["reason"], escape(row["detail"]))
        table.caption = _folded_caption(rows)
        console.print(table)
    if data.get("held"):  # a skip never deletes: what is served is not what the file says now
        console.print(f"[yellow]served from an older version[/] ({len(data['held'])}; the newest edit is skipped):")
        for row in data["held"]:
            console.print(escape(f"  {row['path']} ({row['collection']}): {row['reason']}: {row['detail']}; serves "
                                 f"{_served(row)}; {row['action']}"), soft_wrap=True, highlight=False)
    if data["failures"]:
        table = Table(title="recent pipeline failures")
        for col in ("when", "source", "partition", "message"):
            table.add_column(col, overflow="fold")
        for row in data["failures"]:
            table.add_row(str(row["failed_at"])[:19], row["source"], PathCell(row["partition"] or ""),
                          escape(row["message"][:200]))
        console.print(table)
    if data.get("failures_fixed"):
        console.print(f"{data['failures_fixed']} earlier file failures are fixed (the files ingested since, or deleted)")
    from rag_lib.cli.cache import print_usage

    print_usage(data.get("embedding_usage"))


@app.command("list")
def list_documents(
    collection: Optional[str] = EveryCollectionOpt,
    limit: int = typer.Option(1000, "--limit", min=1, max=100_000),
    offset: int = typer.Option(0, "--offset", min=0, max=10_000_000),
    as_json: bool = JsonOpt,
) -> None:
    """Documents in the knowledge base."""
    rows = kb().list_documents(collection, limit, offset)
    if as_json:
        print_json(rows)
        return
    if not rows and collection and offset == 0 and (note := kb().empty_collection_note(collection)):
        console.print(f"no documents: {escape(note)}", soft_wrap=True)
        _say_if_the_database_is_empty()
        return
    if not rows and offset == 0:
        _say_if_the_database_is_empty()
    table = Table(title=f"{len(rows)} documents")
    for col in ("collection", "path", "id", "type", "ticker", "date", "chunks"):
        table.add_column(col, overflow="fold", no_wrap=col in ("ticker", "date", "chunks"),
                         justify="right" if col == "chunks" else "left")
    for r in rows:
        table.add_row(escape(r["collection"]), PathCell(r["path"]), PathCell(r["doc_id"]), r["doc_type"],
                      escape(r["ticker"] or ""), str(r["doc_date"] or ""), str(r["chunk_count"]))
    console.print(table)


@app.command()
def show(ref: str = typer.Argument(..., help="Document id or path."), collection: Optional[str] = CollectionOpt,
         as_json: bool = JsonOpt) -> None:
    """One document: metadata, sections (empty ones too) and chunks."""
    doc = kb().show(ref, collection)
    if as_json:
        print_json(doc)
        return
    console.print(f"[bold]{escape(doc['path'])}[/]  id {escape(doc['doc_id'])}  type {doc['doc_type']}  ticker {doc['ticker'] or '-'}"
                  f"  date {doc['doc_date'] or '-'}  hash {doc['content_hash'][:12]}")
    table = Table(title="sections")
    for col in ("#", "name", "title", "tokens", "empty"):
        table.add_column(col, justify="right" if col in ("#", "tokens") else "left")
    for s in doc["sections"]:
        table.add_row(str(s["ordinal"]), escape(s["name"]), escape(s["title"]), str(s["token_count"]),
                      "yes" if s["is_empty"] else "")
    console.print(table)
    table = Table(title="chunks")
    for col in ("#", "section path", "tokens", "preview"):
        table.add_column(col, overflow="fold", no_wrap=col in ("#", "tokens"),
                         justify="right" if col in ("#", "tokens") else "left")
    for c in doc["chunks"]:
        table.add_row(str(c["ordinal"]), escape(c["section_path"]), str(c["token_count"]),
                      escape(_preview_cell(c["preview"])))
    console.print(table)


def _preview_cell(preview: str) -> str:
    """The start of a chunk on one line, its indentation and line breaks each one space, and "…" where
    it was cut (at `PREVIEW_CHARS`, maybe mid-word)."""
    from rag_lib.store.documents import PREVIEW_CHARS

    return " ".join(preview.split()) + ("…" if len(preview) >= PREVIEW_CHARS else "")


@app.command()
def delete(ref: str = typer.Argument(..., help="Document id or path."), collection: Optional[str] = CollectionOpt) -> None:
    """Delete a document and all its chunks and vectors."""
    for path in kb().delete_document(ref, collection):
        console.print(f"deleted {path}", markup=False, highlight=False)


def _validate_database(as_json: bool) -> None:
    report = kb().validate_database()
    if as_json:
        print_json(report)
    else:
        table = Table(title=f"database check (active space {report['active_space'] or 'none'}, "
                            f"{report['chunks']} chunks, {report['vectors']} vectors)")
        for col in ("check", "count", "examples"):
            table.add_column(col, overflow="fold")
        for name in ("chunks_without_vector", "vectors_without_chunk", "chunks_with_stale_hash",
                     "chunks_without_document", "duplicate_chunks", "documents_with_other_settings"):
            item = report[name]
            table.add_row(name.replace("_", " "), f"[red]{item['count']}[/]" if item["count"] else "0",
                          ", ".join(item["ids"][:5]))
        console.print(table)
        if report["documents_with_other_settings"]["count"]:
            console.print(other_settings_note(report["documents_with_other_settings"]["count"]), style="yellow",
                          markup=False, soft_wrap=True)
        console.print("no problems" if not report["problems"] else f"[red]{report['problems']} problems[/]")
    if report["problems"]:
        raise typer.Exit(1)


def _say_if_the_database_is_empty() -> None:
    """One yellow line naming the database when it holds no documents at all (see `empty_database_note`)."""
    if note := kb().empty_database_note():
        console.print(note, style="yellow", markup=False, soft_wrap=True)


def other_settings_note(count: int) -> str:
    """What to run when documents were published under settings other than today's."""
    return (f"{count} documents were published under other settings (chunking, embedding model, sections mapping "
            "or loader version changed since); searches serve them as they were: `rag ingest PATH` of their corpus "
            "root, or `rag reembed --all`, publishes them again (unchanged chunks' vectors come from the cache)")


@app.command()
def validate(paths: list[Path] = typer.Argument(None, help="Files or folders to check (none: check the database)."),
             root: Optional[Path] = typer.Option(None, "--root"), as_json: bool = JsonOpt) -> None:
    """Dry run over files (parse, flatten, chunk without writing), or without paths a check of the
    database (orphans, missing embeddings, stale hashes); exit 1 on problems."""
    from rag_lib.validate import validate_paths

    if not paths:
        _validate_database(as_json)
        return

    report = validate_paths(kb().settings, paths, root)
    if as_json:
        print_json(report)
    else:
        table = Table(title="validate")
        for col in ("path", "type", "sections", "empty", "chunks", "max tokens", "problem"):
            table.add_column(col, overflow="fold")
        for f in report["files"]:
            table.add_row(PathCell(f["path"]), f.get("doc_type") or "", str(f.get("sections", "")),
                          str(f.get("empty_sections", "")), str(f.get("chunks", "")), str(f.get("max_tokens", "")),
                          f"[red]{escape(f['problem'])}[/]" if f.get("problem") else
                          "\n".join(f"[yellow]{escape(w)}[/]" for w in f.get("warnings") or []))
        console.print(table)
        warned = sum(1 for f in report["files"] if f.get("warnings"))
        console.print(f"{report['ok']} ok, {report['problems']} with problems"
                      + (f", {warned} ingested without some of their metadata" if warned else ""))
    if report["problems"]:
        raise typer.Exit(1)


@app.command()
def reindex(as_json: bool = JsonOpt) -> None:
    """Rebuild the active space's HNSW index (records build time and parameters)."""
    info = kb().reindex()
    if as_json:
        print_json(info)
    else:
        console.print(f"rebuilt {info['index']} over {info['rows']} vectors in {info['seconds']:.2f} s")


@app.command()
def reset(yes: bool = typer.Option(False, "--yes", help="Confirm: drop every table and recreate the schema.")) -> None:
    """Drop and recreate every table (all documents, vectors, cache entries and metrics are lost)."""
    if not yes:
        fail("reset drops every table and all data; rerun with --yes to confirm", 2)
    applied = kb().reset()
    console.print(f"dropped and recreated the schema ({len(applied)} migrations applied)")


@app.command("metrics")
def metrics(
    since: Optional[str] = typer.Option(None, "--since", help="From this date/time (2026-01-01) or span (7d, 24h)."),
    as_json: bool = JsonOpt,
) -> None:
    """Search latency p50/p95 per mode, zero-result rate, query-class mix, embed failures and fallback share."""
    data = kb().metrics_summary(since)
    if as_json:
        print_json(data)
        return
    console.print(f"[bold]{data['searches']}[/] searches since {data['since'] or 'the start'}; zero-result rate "
                  f"{data['zero_result_rate']:.1%}, reranked {data['rerank_share']:.1%}")
    table = Table(title="latency per mode")
    for col in ("mode", "searches", "p50 ms", "p95 ms", "zero results"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for mode, row in data["by_mode"].items():
        table.add_row(mode, str(row["searches"]), f"{row['p50_ms']:.1f}", f"{row['p95_ms']:.1f}",
                      f"{row['zero_result_rate']:.1%}")
    console.print(table)
    if data["query_classes"]:
        console.print("query classes: " + ", ".join(f"{k} {v}" for k, v in data["query_classes"].items()))
        console.print("strategies: " + ", ".join(f"{k} {v}" for k, v in data["strategies"].items()))
    e = data["embedding"]
    console.print(f"embedding calls {e['calls']}: failure rate {e['failure_rate']:.1%}, fallback share "
                  f"{e['fallback_share']:.1%}, {e['retries']} retries"
                  + (f", p50 {e['p50_ms']:.1f} ms, p95 {e['p95_ms']:.1f} ms" if e["calls"] else ""))
