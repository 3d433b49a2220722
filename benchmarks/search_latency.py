"""search.py's latency section alone, for whichever rag_lib is on PYTHONPATH, so old and new code can be
measured in alternate processes on one database built by search.py (README, Benchmarks: "ef_search
scaled with the index", 100,005 chunks). Prints one JSON line: p50/p95 per mode and filter, the hybrid
searches' per-stage p50/p95 (timings_ms), how many applied feedback, the walk's hnsw.ef_search, the
chunks, and the 1-minute load average around each.

    PYTHONPATH=/tmp/old-checkout .venv/bin/python benchmarks/search_latency.py --work .rag/bench --label old
    PYTHONPATH=. .venv/bin/python benchmarks/search_latency.py --work .rag/bench --label new --modes hybrid
"""
import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import rag_lib  # noqa: E402

sys.path.insert(0, str(Path(rag_lib.__file__).resolve().parents[1] / "tests"))
from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.db import start_embedded  # noqa: E402
from rag_lib.eval import load_qrels, load_queries, percentile  # noqa: E402
from rag_lib.models import SearchFilters  # noqa: E402
from rag_lib.search import search as library_search  # noqa: E402
from testkit import create_database  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
if not SHARED.is_dir():
    SHARED = Path(os.environ.get("RAG_SHARED", "/work/shared"))

p = argparse.ArgumentParser()
p.add_argument("--work", type=Path, default=Path(__file__).resolve().parents[1] / ".rag" / "bench",
               help="folder of search.py's benchmark server")
p.add_argument("--queries", type=int, default=200)
p.add_argument("--warmup", type=int, default=200)
p.add_argument("--modes", default="semantic,lexical,hybrid")
p.add_argument("--filters", default="none,type,ticker,date")
p.add_argument("--label", default="")
p.add_argument("--set", action="append", default=[], help="search.NAME=VALUE, e.g. search.ef_search=200")
args = p.parse_args()

url = create_database(start_embedded(args.work / "pgdata"), "bench_search", "tradegent")
settings = Settings(database_url=url, home=args.work / "home", max_file_bytes=64 * 1024 * 1024)
for kv in args.set:
    k, v = kv.split("=")
    setattr(settings.search, k.split(".")[-1], type(getattr(settings.search, k.split(".")[-1]))(v))
kb = KnowledgeBase(settings)
queries = load_queries(SHARED / "datasets" / "scifact" / "queries.jsonl")
test_ids = list(load_qrels(SHARED / "datasets" / "scifact" / "qrels" / "test.tsv"))
dev = load_queries(SHARED / "eval" / "tradegent-dev" / "queries.jsonl")
texts = (list(dev.values()) + [queries[q] for q in test_ids])[: args.queries]
warm = [queries[q] for q in load_qrels(SHARED / "datasets" / "scifact" / "qrels" / "train.tsv")][: args.warmup]
FILTERS = {"none": {}, "type": {"doc_type": "type-03"}, "ticker": {"ticker": "T042"},
           "date": {"date_from": dt.date(2022, 6, 1)}, "date9k": {"date_from": dt.date(2023, 3, 15)}}
store, provider = kb.search_context()


def run(mode, flt):
    return lambda q: library_search(store, provider, q, mode=mode, top_k=10, filters=SearchFilters(**flt),
                                    caches=kb.search_caches)


modes = args.modes.split(",")
for mode in modes:
    for q in warm:
        run(mode, {})(q)
space = store.active_space()["space"]
# the walk's hnsw.ef_search: fixed (search.ef_search) or scaled with the index (code after 8f01ebe's)
ef_search = store.ef_search(space) if hasattr(store, "ef_search") else settings.search.ef_search
out = {"label": args.label, "code": str(Path(rag_lib.__file__).parent.parent), "load_start": os.getloadavg()[0],
       "ef_search": ef_search, "vectors": store.status_counts(None)["chunks"],
       "latency": {}, "stages_p95": {}, "stages_p50": {}, "feedback_applied": {}}
for mode in modes:
    for fname in args.filters.split(","):
        fn = run(mode, FILTERS[fname])
        times, stages, fed = [], {}, 0
        la0 = os.getloadavg()[0]
        for q in texts:
            t0 = time.perf_counter()
            res = fn(q)
            times.append((time.perf_counter() - t0) * 1000)
            for k, v in (res.timings_ms or {}).items():
                stages.setdefault(k, []).append(v)
            fed += "feedback" in (res.timings_ms or {})
        key = mode if fname == "none" else f"{mode}_{fname}"
        out["latency"][key] = {"p50": round(percentile(times, 50), 1), "p95": round(percentile(times, 95), 1),
                               "load": [round(la0, 1), round(os.getloadavg()[0], 1)]}
        if mode == "hybrid":
            out["stages_p95"][key] = {k: round(percentile(v, 95), 1) for k, v in stages.items()}
            out["stages_p50"][key] = {k: round(percentile(v, 50), 1) for k, v in stages.items()}
            out["feedback_applied"][key] = fed
out["load_end"] = os.getloadavg()[0]
print(json.dumps(out))
kb.close()
