"""`rag eval`: score retrieval on a BEIR-format set (queries.jsonl + qrels.tsv)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rag_lib.cli.app import CollectionOpt, app, console, err_console, fail, kb, print_json, progress_bar


@app.command("eval")
def eval_command(
    queries: Path = typer.Option(..., "--queries", help="BEIR queries.jsonl"),
    qrels: Path = typer.Option(..., "--qrels", help="BEIR qrels .tsv (query-id, corpus-id, score)"),
    collection: Optional[str] = CollectionOpt,
    unit: str = typer.Option("section", "--unit", help="section (<path>#<section>) | document (document id)"),
    mode: str = typer.Option("hybrid", "--mode", "-m", help="semantic | lexical | hybrid"),
    judge: bool = typer.Option(False, "--judge", help="Also the RAGAS metrics, judged by eval.judge_model."),
    judge_top_k: int = typer.Option(5, "--judge-top-k", min=1, max=50, help="Chunks per query the judge reads."),
    per_query: bool = typer.Option(False, "--per-query", help="Also each query's nDCG@10, recall@10 and MRR@10 "
                                   "(worst first), with its type and text."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """nDCG@10, Recall@10/100, MRR@10 and per-query latency of retrieval on a judged query set; with
    --judge also context precision, context recall and faithfulness (RAGAS) from a chat model."""
    from rag_lib.eval import (UNITS, evaluate_kb, judge_kb, load_qrels, load_queries, load_query_types,
                              load_references, metrics_by_type)
    from rag_lib.search import MODES

    if unit not in UNITS:
        fail(f"--unit must be one of {', '.join(UNITS)}, got '{unit}'", 2)
    if mode not in MODES:
        fail(f"--mode must be one of {', '.join(MODES)}, got '{mode}'", 2)
    query_map = load_queries(queries)
    judged = load_qrels(qrels)
    if not judged:
        fail(f"{qrels}: no judgments in it (rows of query-id, corpus-id, score)", 1)
    base = kb()
    if note := base.empty_collection_note(collection):  # every figure would be 0, and say nothing of retrieval
        fail(f"{note}; pass --collection", 1)
    with progress_bar(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      hidden=as_json) as bar:
        task = bar.add_task("", total=len(judged))
        report = evaluate_kb(base, query_map, judged, mode=mode, unit=unit, collection=collection,
                             progress=lambda: bar.update(task, advance=1))
    if report.queries == 0:
        fail("no judged query has text in the queries file, or no judgment has a grade above 0; check that the "
             "ids match", 1)
    if report.unknown_units:
        err_console.print(f"[yellow]warning:[/] {unknown_units_message(report.unknown_units, unit, collection or base.settings.collection)}",
                          highlight=False, soft_wrap=True)
    elif all(m.get("recall@100", 0) == 0 for m in report.per_query.values()):
        # not one judged unit in any query's first 100: the qrels name units this collection does not hold
        err_console.print(f"[yellow]warning:[/] no judged {unit} was found for any query: do the qrels' ids match "
                          f"--unit {unit} ('<path>#<section>' or a document id) and the paths of collection "
                          f"'{collection or base.settings.collection}' (see `rag list`)?", highlight=False, soft_wrap=True)
    ragas = None
    if judge:
        asked = {q: query_map[q] for q in judged if q in query_map}
        ragas = judge_kb(base, asked, mode=mode, collection=collection, top_k=judge_top_k,
                         references=load_references(queries))
    types = load_query_types(queries)
    # per query type (`metadata.type` in the queries file): the figures the retrieval_quality check keeps
    by_type = metrics_by_type(report.per_query, types)
    worst = sorted(report.per_query, key=lambda q: (report.per_query[q]["ndcg@10"], q))
    if as_json:
        rows = {q: {**report.per_query[q], "type": types.get(q, "untyped"), "text": query_map[q]}
                for q in worst} if per_query else None
        print_json({**report.summary(), "by_type": by_type, **({"per_query": rows} if rows is not None else {}),
                    **({"ragas": ragas} if ragas else {})})
        return
    title = f"{mode} retrieval, {report.queries} queries, unit = {unit}"
    table = Table(title=title, min_width=len(title))  # as wide as its title, which would wrap over two lines
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in report.metrics.items():
        table.add_row(name, f"{value:.4f}")
    table.add_row("latency p50 (ms)", f"{report.latency_ms['p50']:.1f}")
    table.add_row("latency p95 (ms)", f"{report.latency_ms['p95']:.1f}")
    if ragas:
        for name in ("context_precision", "context_recall", "faithfulness"):
            value = ragas[name]
            table.add_row(f"{name} (judge {ragas['model']})", "n/a (no references)" if value is None else f"{value:.4f}")
    console.print(table)
    if set(by_type) - {"all", "untyped"}:  # the queries carry types
        typed = Table(title="per query type")
        for name in ("type", "queries", "ndcg@10", "recall@10", "mrr@10"):
            typed.add_column(name, justify="left" if name == "type" else "right")
        for name, m in sorted(by_type.items(), key=lambda kv: (kv[0] != "all", kv[0])):
            typed.add_row(name, str(m["queries"]), *(f"{m[k]:.4f}" for k in ("ndcg@10", "recall@10", "mrr@10")))
        console.print(typed)
    if per_query:
        rows = Table(title="per query, worst first")
        for name in ("id", "type", "ndcg@10", "recall@10", "mrr@10", "query"):
            rows.add_column(name, justify="right" if "@" in name else "left", overflow="fold")
        for q in worst:
            m = report.per_query[q]
            rows.add_row(q, types.get(q, "untyped"), *(f"{m[k]:.3f}" for k in ("ndcg@10", "recall@10", "mrr@10")),
                         query_map[q])
        console.print(rows)
    if report.missing_queries:
        console.print(f"{len(report.missing_queries)} judged query ids have no text: "
                      f"{', '.join(report.missing_queries[:5])}", style="yellow", markup=False)


def unknown_units_message(unknown: dict[str, list[str]], unit: str, collection: str) -> str:
    """One line naming the judged units a collection does not hold (at most five, with what each may
    have meant): their queries score them as misses, which would read as poor retrieval."""
    from rich.markup import escape

    from rag_lib.errors import did_you_mean

    shown = [f"{u}{did_you_mean(near)}" for u, near in list(unknown.items())[:5]]
    more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
    what = f"judged {unit}{'s are' if len(unknown) > 1 else ' is'}"
    return escape(f"{len(unknown)} {what} not in collection '{collection}', so no search can return "
                  f"{'them' if len(unknown) > 1 else 'it'} and the figures count a miss: {'; '.join(shown)}{more}. "
                  "Fix the qrels' ids (`rag show PATH` lists a document's sections) or pass the collection they "
                  "were written for")
