"""Knowledge-graph commands: `rag graph NODE` (neighbourhood, path, ticker context),
`rag graph export --format cypher|graphml`, and `rag context QUERY` (hybrid vector + graph context)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from rag_lib.cli.app import CollectionOpt, JsonOpt, app, console, err_console, fail, kb, print_json
from rag_lib.cli.output import PathCell



@app.command("graph")
def graph(
    node: str = typer.Argument(..., help="Ticker, document path or id, entity name or node key; "
                                         "`export` writes the whole graph (see --format)."),
    depth: int = typer.Option(1, "--depth", "-d", min=1, max=3, help="Steps from the node (1-3)."),
    predicate: Optional[list[str]] = typer.Option(None, "--predicate", "-p", help="Follow only these predicates."),
    to: Optional[str] = typer.Option(None, "--to", help="Show the shortest path from NODE to this node instead."),
    context: bool = typer.Option(False, "--context", help="NODE is a ticker: show its graph context."),
    fmt: str = typer.Option("cypher", "--format", "-f", help="export: cypher (Neo4j) | graphml (Gephi, yEd)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="export: write to this file, not stdout."),
    collection: Optional[str] = CollectionOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Explore the knowledge graph around a node, or export it (`rag graph export --format graphml`)."""
    if node == "export":
        from rag_lib.graph.export import FORMATS

        if fmt not in FORMATS:
            fail(f"--format must be one of {', '.join(FORMATS)}, got '{fmt}'", 2)
        text = kb().graph_export(fmt, collection)
        if output:
            try:
                output.write_text(text, encoding="utf-8")
            except OSError as exc:
                fail(f"cannot write {output}: {exc.strerror or exc}; choose a path in an existing, writable folder")
            console.print(f"wrote {output} ({fmt})", markup=False)
        else:
            typer.echo(text, nl=False)
        return
    if to:
        result = kb().graph_path(node, to, collection=collection)
        if as_json:
            print_json(result)
            return
        if not result["found"]:
            console.print(f"no path between {result['from']['key']} and {result['to']['key']} within 4 steps", markup=False)
            return
        for e in result["edges"]:
            console.print(f"{e['src']} -[{e['predicate']}]-> {e['dst']}   ({e['path']}#{e['section']})", highlight=False,
                          markup=False)
        return
    if context:
        result = kb().ticker_context(node, depth=depth if depth > 1 else 2, collection=collection)
        if as_json:
            print_json(result)
            return
        from rag_lib.graph.queries import context_markdown

        console.print(context_markdown(result), highlight=False, markup=False)
        return
    result = kb().neighbors(node, depth=depth, predicates=predicate, collection=collection)
    if as_json:
        print_json(result)
        return
    start = result["node"]
    if start.get("aliases"):
        console.print(f"{start['key']} is also named: {', '.join(start['aliases'])}", highlight=False, markup=False)
    table = Table(title=f"{start['key']} ({start['kind']}): {len(result['edges'])} edges within {depth}")
    for col in ("depth", "src", "predicate", "dst", "provenance"):
        table.add_column(col, overflow="fold", no_wrap=col in ("depth", "predicate"))
    for e in result["edges"]:
        table.add_row(str(e["depth"]), PathCell(e["src"]), e["predicate"], PathCell(e["dst"]),
                      PathCell(f"{e['path']}#{e['section']}"))
    console.print(table)
    nodes = Table(title=f"{len(result['nodes'])} nodes")
    for col in ("depth", "node", "kind", "also named"):
        nodes.add_column(col, overflow="fold", no_wrap=col in ("depth", "kind"))
    for n in result["nodes"]:
        nodes.add_row(str(n["depth"]), PathCell(n["key"]), n["kind"], escape(", ".join(n.get("aliases") or [])))
    console.print(nodes)


@app.command("context")
def context_command(
    query: str = typer.Argument(..., help="The question to build context for."),
    ticker: Optional[str] = typer.Option(None, "--ticker", help="The ticker the question is about."),
    budget: int = typer.Option(4000, "--budget", "-b", min=64, help="Token budget of the markdown."),
    collection: Optional[str] = CollectionOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Hybrid context (passages with citations + knowledge-graph facts) routed by the query's class."""
    result = kb().hybrid_context(query, ticker=ticker, token_budget=budget, collection=collection)
    if as_json:
        print_json(result.to_dict())
        return
    # how it was built goes to stderr: `rag context ... > prompt.md` writes the markdown alone
    err_console.print(f"[dim]{result.kind} → {result.route}; {result.tokens}/{result.token_budget} tokens[/]")
    if result.note:
        err_console.print(f"[yellow]note: {escape(result.note)}[/]", soft_wrap=True)
    typer.echo(result.markdown)
