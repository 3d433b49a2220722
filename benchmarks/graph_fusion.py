"""Does the knowledge graph help retrieval? nDCG@10 per query type on the tradegent-dev set
(shared/eval/tradegent-dev, section units, hybrid mode, 100 units per query) with graph fusion off
and on, for a small grid of graph weights and seed counts. Prints ONE JSON line.

The shared corpus is ingested once into a reusable benchmark database (collection `default`, root
shared/corpus, so unit ids match the qrels); later runs only search.

    nice -n 19 .venv/bin/python benchmarks/graph_fusion.py [--weights 0.15,0.25,0.35] [--seeds 5,10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import SHARED, bench_database, ingest_once  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.eval import evaluate_kb, load_qrels, load_queries  # noqa: E402

EVAL = SHARED / "eval" / "tradegent-dev"


def query_types(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            out[str(record["_id"])] = (record.get("metadata") or {}).get("type", "untyped")
    return out


def per_type(report, types: dict[str, str]) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for qid, metrics in report.per_query.items():
        groups.setdefault(types.get(qid, "untyped"), []).append(metrics["ndcg@10"])
    table = {t: round(statistics.fmean(v), 4) for t, v in sorted(groups.items())}
    table["all"] = round(report.metrics["ndcg@10"], 4)
    return table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", default="0.15,0.25,0.35")
    ap.add_argument("--seeds", default="5,10")
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--corpus", type=Path, default=SHARED / "corpus", help="ingested when the database is empty")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder of the reusable benchmark server (default: .rag/bench)")
    args = ap.parse_args()
    url, work = bench_database("graph_fusion", args.work)
    settings = Settings(database_url=url, home=work)
    settings.search_metrics.enabled = False
    queries, qrels = load_queries(EVAL / "queries.jsonl"), load_qrels(EVAL / "qrels.tsv")
    types = query_types(EVAL / "queries.jsonl")
    with KnowledgeBase(settings) as kb:
        ingest_s = ingest_once(kb, args.corpus)
        s = kb.settings.search
        s.graph_candidates = args.candidates
        s.graph_fusion = False
        base = evaluate_kb(kb, queries, qrels, mode="hybrid", collection="default")
        runs = {"off": {"ndcg@10": per_type(base, types), "latency_ms": base.latency_ms}}
        per_query = {"off": {q: round(m["ndcg@10"], 4) for q, m in base.per_query.items()}}
        s.graph_fusion = True
        for seeds in [int(x) for x in args.seeds.split(",")]:
            for weight in [float(x) for x in args.weights.split(",")]:
                s.graph_seeds, s.graph_weight = seeds, weight
                rep = evaluate_kb(kb, queries, qrels, mode="hybrid", collection="default")
                name = f"on:w{weight}:s{seeds}"
                runs[name] = {"ndcg@10": per_type(rep, types), "latency_ms": rep.latency_ms}
                per_query[name] = {q: round(m["ndcg@10"], 4) for q, m in rep.per_query.items()}
        counts = kb.graph_checks("default")[-1].metadata
    print(json.dumps({"benchmark": "graph_fusion", "set": "tradegent-dev", "unit": "section", "mode": "hybrid",
                      "queries": len(base.per_query), "types": {t: list(types.values()).count(t) for t in sorted(set(types.values()))},
                      "graph": {"nodes": counts["nodes"], "edges": counts["edges"]}, "ingest_s": ingest_s,
                      "runs": runs, "per_query": per_query}))


if __name__ == "__main__":
    main()
