"""`make demo`: start the embedded database, ingest the demo corpus, print a summary and two
example searches. Run as `python -m rag_lib.demo [CORPUS]`."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rag_lib.api import KnowledgeBase
from rag_lib.cli.core import print_ingest_report
from rag_lib.errors import RagError

EXAMPLE_QUERIES = [
    ("NVDA bull case", {}),
    ("which trades hit their stop", {"doc_type": "trade-journal"}),
]


def run(corpus: Path, console: Console) -> None:
    with KnowledgeBase() as kb:
        console.print(f"[bold]database[/] {kb.store.db.url}")
        console.print(f"[bold]ingesting[/] {corpus} with {kb.provider.space} ...")
        report = kb.ingest([corpus], prune=True)
        print_ingest_report(report)
        kb.store.ensure_hnsw_index(kb.provider.space, kb.provider.dimensions)
        for query, filters in EXAMPLE_QUERIES:
            result = kb.search(query, top_k=3, **filters)
            label = f" ({', '.join(f'{k}={v}' for k, v in filters.items())})" if filters else ""
            table = Table(title=f"search: {query}{label}  [{result.timings_ms.get('total', 0):.0f} ms]")
            table.add_column("score", justify="right")
            table.add_column("unit", overflow="fold")
            table.add_column("text", overflow="fold")
            for hit in result.hits:
                table.add_row(f"{hit.score:.3f}", hit.unit_id, (hit.excerpt or hit.text).replace("\n", " ")[:160])
            console.print(table)
    console.print("next: `.venv/bin/rag search \"your question\"`, `.venv/bin/rag status`")


def main() -> None:
    console = Console()
    corpus = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/corpus")
    try:
        run(corpus, console)
    except RagError as exc:
        console.print(f"[bold red]error:[/] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
