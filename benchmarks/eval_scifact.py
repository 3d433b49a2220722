"""SciFact (BEIR) retrieval quality: ingest the 5,183 abstracts once (collection `scifact` on the
reusable benchmark server, embedded for real; later runs reuse it), then score semantic, lexical and
hybrid search on a split (document units). Prints ONE JSON line. Tune on train, report on test.

    .venv/bin/python benchmarks/eval_scifact.py [--split test] [--modes semantic,lexical,hybrid]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import SHARED, bench_database  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.eval import evaluate_kb, load_qrels, load_queries  # noqa: E402

PUBLISHED = {"bm25": 0.665, "bm25_flat_pyserini": 0.679, "all-MiniLM-L6-v2": 0.645}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--split", default="test", choices=("train", "test"))
    parser.add_argument("--modes", default="semantic,lexical,hybrid")
    parser.add_argument("--database", default="scifact")
    parser.add_argument("--docs", type=int, default=None, help="only the first N records of the corpus (a quick run)")
    parser.add_argument("--work", type=Path, default=None,
                    help="folder of the reusable benchmark server (default: .rag/bench)")
    args = parser.parse_args()
    data = SHARED / "datasets" / "scifact"
    url, work = bench_database(args.database, args.work)
    # The corpus is one 8 MB file of records; the per-file size limit is for analyst documents.
    settings = Settings(database_url=url, home=work / "home", max_file_bytes=64 * 1024 * 1024)
    kb = KnowledgeBase(settings)
    started = time.perf_counter()
    corpus = data / "corpus.jsonl"
    if args.docs is not None:  # a prefix of the records, in a file of the same name (same document ids)
        corpus = work / "scifact-sample" / "corpus.jsonl"
        corpus.parent.mkdir(parents=True, exist_ok=True)
        with open(data / "corpus.jsonl", encoding="utf-8") as fh:
            corpus.write_text("".join(line for _, line in zip(range(args.docs), fh)), encoding="utf-8")
    report = kb.ingest([corpus], "scifact")
    space = kb.store.active_space()
    kb.store.ensure_hnsw_index(space["space"], space["dimensions"])
    counts = kb.store.status_counts("scifact")
    ingest = {"documents": counts["documents"], "chunks": counts["chunks"], "embedded_now": report.texts_embedded,
              "seconds": round(time.perf_counter() - started, 1)}
    queries = load_queries(data / "queries.jsonl")
    qrels = load_qrels(data / "qrels" / f"{args.split}.tsv")
    results = {}
    for mode in args.modes.split(","):
        r = evaluate_kb(kb, queries, qrels, mode=mode, unit="document", collection="scifact")
        results[mode] = r.summary()
    print(json.dumps({"benchmark": "scifact", "split": args.split, "ingest": ingest, "results": results,
                      "published_ndcg@10_test": PUBLISHED}))
    kb.close()


if __name__ == "__main__":
    main()
