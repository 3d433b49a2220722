"""Choose search settings by cross-validation over judged sets: nDCG@10 per question (hybrid, section
units, 100 units per query) for the current settings and each variant, then repeated k-fold
cross-validation over the union of the sets' questions. Each fold picks, on its training questions,
the best variant among those that lower no set's training mean below the current settings' (a change
must help every set, not one set at another's cost), and is scored on its held-out questions.
Prints ONE JSON line: per variant and set, nDCG@10 per query type; the folds' picks; the held-out
folds' mean for the current settings, for each variant, and for what the folds picked.

How the README's settings were chosen (5 folds, 20 repeats over tradegent-dev + tradegent-dev2). The
corpus is ingested once into a reusable benchmark database (collection `default`, root the corpus,
so unit ids match the qrels); later runs only search.

    nice -n 5 .venv/bin/python benchmarks/retrieval_cv.py \\
        --variant alpha0.4:convex_alpha=0.4 --variant alpha0.6:convex_alpha=0.6 \\
        --variant nolink:entity_linking=false,link_boost=0
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import SHARED, bench_database, ingest_once  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.eval import evaluate_kb, load_qrels, load_queries, load_query_types, metrics_by_type  # noqa: E402

BASE = "current"
Scores = Mapping[str, Mapping[tuple[str, str], float]]  # variant -> (set, question id) -> nDCG@10


def parse_variant(text: str) -> tuple[str, dict[str, object]]:
    """`name:key=value,key=value` -> (name, {key: value}); values read as JSON when they parse
    (numbers, true/false), else as strings."""
    name, sep, body = text.partition(":")
    if not sep or not name or name == BASE:
        raise SystemExit(f"--variant {text!r}: write NAME:key=value[,key=value] (NAME not {BASE!r})")
    values: dict[str, object] = {}
    for pair in filter(None, body.split(",")):
        key, eq, raw = pair.partition("=")
        if not eq:
            raise SystemExit(f"--variant {text!r}: {pair!r} is not key=value")
        try:
            values[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            values[key.strip()] = raw
    return name, values


def cross_validate(scores: Scores, base: str = BASE, folds: int = 5, repeats: int = 20) -> dict[str, object]:
    """Repeated k-fold cross-validation over every (set, question) of `scores[base]`: per fold, the
    variant with the best training mean among those whose training mean on no set falls below the
    base's (the base always qualifies). Returns how often each was picked and the held-out folds'
    mean nDCG@10 for the pick, the base and every variant."""
    keys = sorted(scores[base])
    sets = sorted({s for s, _ in keys})

    def mean(variant: str, ks: list[tuple[str, str]]) -> float:
        return statistics.fmean(scores[variant][k] for k in ks) if ks else 0.0

    picks: dict[str, int] = {}
    held: dict[str, list[float]] = {"picked": [], **{v: [] for v in scores}}
    for repeat in range(repeats):
        order = keys[:]
        random.Random(repeat).shuffle(order)
        for fold in (order[i::folds] for i in range(folds)):
            out = set(fold)
            train = [k for k in keys if k not in out]
            by_set = {s: [k for k in train if k[0] == s] for s in sets}
            allowed = [v for v in scores
                       if all(mean(v, ks) >= mean(base, ks) - 1e-12 for ks in by_set.values())]
            best = max(allowed, key=lambda v: (mean(v, train), v == base))
            picks[best] = picks.get(best, 0) + 1
            held["picked"].append(mean(best, fold))
            for v in scores:
                held[v].append(mean(v, fold))
    return {"folds": folds, "repeats": repeats, "picks": dict(sorted(picks.items(), key=lambda kv: -kv[1])),
            "held_out_ndcg@10": {v: round(statistics.fmean(xs), 4) for v, xs in held.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", action="append", dest="sets", type=Path,
                    help="a BEIR folder with queries.jsonl and qrels.tsv (repeatable; default: the two tradegent dev sets)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:key=value[,key=value]",
                    help="search settings (settings.search fields) to compare with the current ones (repeatable)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--per-query", action="store_true", help="also print each question's nDCG@10 per variant")
    ap.add_argument("--corpus", type=Path, default=SHARED / "corpus", help="ingested when the database is empty")
    ap.add_argument("--work", type=Path, default=None,
                    help="folder of the reusable benchmark server (default: .rag/bench)")
    args = ap.parse_args()
    variants = dict(parse_variant(v) for v in args.variant)
    sets = args.sets or [SHARED / "eval" / "tradegent-dev", SHARED / "eval" / "tradegent-dev2"]
    url, work = bench_database("retrieval_cv", args.work)
    settings = Settings(database_url=url, home=work)
    settings.search_metrics.enabled = False
    unknown = sorted({k for v in variants.values() for k in v if not hasattr(settings.search, k)})
    if unknown:
        raise SystemExit(f"unknown search setting(s): {', '.join(unknown)} (see settings.search in rag_lib/config.py)")
    scores: dict[str, dict[tuple[str, str], float]] = {}
    tables: dict[str, dict[str, dict[str, float]]] = {}
    with KnowledgeBase(settings) as kb:
        ingest_s = ingest_once(kb, args.corpus)
        current = kb.settings.search.model_copy()
        for name, values in {BASE: {}, **variants}.items():
            # each variant starts from the current settings, so variants never leak into each other
            kb.settings.search = current.model_copy(update=values)
            scores[name], tables[name] = {}, {}
            for folder in sets:
                queries, qrels = load_queries(folder / "queries.jsonl"), load_qrels(folder / "qrels.tsv")
                report = evaluate_kb(kb, queries, qrels, mode="hybrid", collection="default")
                by_type = metrics_by_type(report.per_query, load_query_types(folder / "queries.jsonl"))
                tables[name][folder.name] = {t: m["ndcg@10"] for t, m in by_type.items()}
                scores[name].update({(folder.name, q): m["ndcg@10"] for q, m in report.per_query.items()})
        kb.settings.search = current
    out: dict[str, object] = {"ingest_seconds": ingest_s, "variants": {n: variants.get(n, {}) for n in scores},
                              "ndcg@10": tables, "cv": cross_validate(scores, BASE, args.folds, args.repeats)}
    if args.per_query:
        out["per_query"] = {n: {f"{s}:{q}": round(x, 4) for (s, q), x in v.items()} for n, v in scores.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
