"""Our full-text scoring against a reference BM25 (`bm25s`, Lucene/ES-style, Snowball stemmer) on the
same chunks, scored the same way (a unit's rank is its best chunk's), per query type. Variants show
what length normalisation and field weights do: `body` (chunk text only), `indexed` (what our text
columns index: the `[doc_type] [ticker] [section]` prefix plus the text), `fields` (indexed, plus the
section key/heading and the document's title and ticker once more: a field weight of 2).

    RAG_HOME=... .venv/bin/python benchmarks/lexical_reference.py --collection tradegent \\
        --set ../shared/eval/tradegent-dev --set ../shared/eval/tradegent-dev2
    .venv/bin/python benchmarks/lexical_reference.py --collection scifact --unit document \\
        --queries ../shared/datasets/scifact/queries.jsonl --qrels ../shared/datasets/scifact/qrels/train.tsv

Prints one JSON line: nDCG@10 per set, variant and query type, beside our `lexical` mode."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bm25s  # noqa: E402
import Stemmer  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.eval import evaluate, evaluate_kb, load_qrels, load_queries, load_query_types, metrics_by_type  # noqa: E402


def texts(rows: list[dict], variant: str) -> list[str]:
    if variant == "body":
        return [r["text"] for r in rows]
    if variant == "indexed":
        return [r["embed_text"] for r in rows]
    heading = lambda r: (r["section"] or "").replace("_", " ")  # noqa: E731
    return [f"{r['embed_text']}\n{heading(r)}\n{r['title'] or ''} {r['ticker'] or ''}" for r in rows]


class Hit:  # what rag_lib.eval.unit_ranking reads
    def __init__(self, row: dict):
        self.unit_id, self.doc_id = row["unit_id"], row["doc_id"]


def run(kb: KnowledgeBase, collection: str, queries_path: Path, qrels_path: Path, unit: str,
        k1: float, b: float) -> dict:
    rows = kb.store.chunk_texts(collection)
    stemmer = Stemmer.Stemmer("english")
    queries, qrels = load_queries(queries_path), load_qrels(qrels_path)
    types = load_query_types(queries_path)
    out = {}
    for variant in ("body", "indexed", "fields"):
        retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
        retriever.index(bm25s.tokenize(texts(rows, variant), stopwords="en", stemmer=stemmer, show_progress=False),
                        show_progress=False)
        depth = min(len(rows), 300)

        def search(text: str) -> list[Hit]:
            tokens = bm25s.tokenize([text], stopwords="en", stemmer=stemmer, show_progress=False)
            if not tokens.vocab:
                return []
            ids, _ = retriever.retrieve(tokens, k=depth, show_progress=False)
            return [Hit(rows[i]) for i in ids[0]]

        report = evaluate(search, queries, qrels, unit=unit, mode=f"bm25s:{variant}")
        out[f"bm25s_{variant}"] = _typed(report, types)
    ours = evaluate_kb(kb, queries, qrels, mode="lexical", unit=unit, collection=collection)
    out["ours_lexical"] = _typed(ours, types)
    return out


def _typed(report, types) -> dict:
    return {t: m["ndcg@10"] for t, m in metrics_by_type(report.per_query, types).items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--collection", required=True)
    parser.add_argument("--corpus", help="ingest this folder into the collection first (a small run)")
    parser.add_argument("--set", action="append", default=[], help="a BEIR folder (queries.jsonl, qrels.tsv)")
    parser.add_argument("--queries")
    parser.add_argument("--qrels")
    parser.add_argument("--unit", default="section", choices=("section", "document"))
    parser.add_argument("--k1", type=float, default=1.2)  # Elasticsearch's defaults
    parser.add_argument("--b", type=float, default=0.75)
    args = parser.parse_args()
    sets = [(Path(s).name, Path(s) / "queries.jsonl", Path(s) / "qrels.tsv") for s in args.set]
    if args.queries:
        sets.append((Path(args.qrels).stem, Path(args.queries), Path(args.qrels)))
    with KnowledgeBase(Settings()) as kb:
        if args.corpus:
            kb.ingest([args.corpus], args.collection, root=args.corpus)
        results = {name: run(kb, args.collection, q, r, args.unit, args.k1, args.b) for name, q, r in sets}
    print(json.dumps({"benchmark": "lexical_reference", "collection": args.collection, "k1": args.k1, "b": args.b,
                      "ndcg@10": results}))


if __name__ == "__main__":
    main()
