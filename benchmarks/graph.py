"""Graph walk latency: p50/p95 of depth-2 neighbourhoods (the `neighbors` recursive CTE) on a
generated graph of ~100k edges (2,000 documents; entities with a realistic skew: a few hubs, many
rare). Prints one JSON line. Target: p95 <= 20 ms. `--explain` also prints the slowest walk's plan.

    .venv/bin/python benchmarks/graph.py [--docs 2000] [--queries 300] [--explain]

Also path searches (issue 29): shortest paths (max depth 4, as `rag graph A --to B`) between random
nodes of that graph, with how many were found, had none, or hit `graph.max_path_rows`; and the
review's hostile case, a path from a 52-node complete graph to a node it cannot reach."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._bench_db import create_database, scratch_server  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.errors import LimitExceededError, QueryTimeoutError  # noqa: E402
from rag_lib.store import Store, apply_migrations  # noqa: E402

import numpy as np  # noqa: E402
import psycopg  # noqa: E402

DOCS, EDGES_PER_DOC, ENTITIES, TICKERS, QUERIES = 2000, 64, 20000, 500, 300


def build(url: str, rng: random.Random) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        apply_migrations(conn)
        with conn.cursor() as cur:
            with cur.copy("COPY rag_documents (collection, path, doc_id, doc_type, format, content_hash, fingerprint)"
                          " FROM STDIN") as cp:
                for d in range(DOCS):
                    cp.write_row(("b", f"d{d}.yaml", f"D{d}", "stock-analysis", "yaml", "h", "f"))
            keys = [f"doc:d{d}.yaml" for d in range(DOCS)] + [f"ticker:T{t}" for t in range(TICKERS)] + \
                   [f"e{e}" for e in range(ENTITIES)]
            with cur.copy("COPY rag_graph_nodes (collection, key, kind, label) FROM STDIN") as cp:
                for k in keys:
                    cp.write_row(("b", k, k.split(":")[0] if ":" in k else "entity", k))
            seen, n = set(), 0
            with cur.copy("COPY rag_graph_edges (collection, path, section, src, predicate, dst, doc_hash)"
                          " FROM STDIN") as cp:
                for d in range(DOCS):
                    me = f"doc:d{d}.yaml"
                    for _ in range(EDGES_PER_DOC):
                        r = rng.random()
                        if r < 0.1:
                            src, pred, dst = me, "mentions", f"ticker:T{int(rng.paretovariate(1.2)) % TICKERS}"
                        elif r < 0.2:
                            src, pred, dst = me, "links_to", f"doc:d{rng.randrange(DOCS)}.yaml"
                        elif r < 0.5:
                            src, pred, dst = me, "has_entity", f"e{int(rng.paretovariate(0.8)) % ENTITIES}"
                        else:
                            src = f"e{rng.randrange(ENTITIES)}"
                            pred, dst = rng.choice(["in_sector", "uses_signal_from", "catalyst_type", "analyzes"]), \
                                f"e{rng.randrange(ENTITIES)}"
                        if src == dst or (d, src, pred, dst) in seen:
                            continue
                        seen.add((d, src, pred, dst))
                        cp.write_row(("b", f"d{d}.yaml", "_graph", src, pred, dst, "h"))
                        n += 1
        conn.execute("ANALYZE rag_graph_edges; ANALYZE rag_graph_nodes")
    return n


def build_complete(url: str, nodes: int = 52) -> None:
    """Collection `k`: every pair of `nodes` nodes related, plus an island of two nodes."""
    pairs = [(f"n{i}", f"n{j}") for i in range(nodes) for j in range(i + 1, nodes)] + [("island-a", "island-b")]
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("INSERT INTO rag_documents (collection, path, doc_id, doc_type, format, content_hash, fingerprint)"
                    " VALUES ('k', 'complete.yaml', 'K', 'research', 'yaml', 'h', 'f')")
        with cur.copy("COPY rag_graph_nodes (collection, key, kind, label) FROM STDIN") as cp:
            for key in sorted({k for pair in pairs for k in pair}):
                cp.write_row(("k", key, "entity", key))
        with cur.copy("COPY rag_graph_edges (collection, path, section, src, predicate, dst, doc_hash) FROM STDIN") as cp:
            for a, b in pairs:
                cp.write_row(("k", "complete.yaml", "_graph", a, "relates_to", b, "h"))
        conn.execute("ANALYZE rag_graph_edges")


def timed_paths(store: Store, collection: str, pairs: list[tuple[str, str]]) -> dict:
    times, outcome = [], {"found": 0, "none": 0, "limit_exceeded": 0, "timeout": 0}
    for a, b in pairs:
        t0 = time.perf_counter()
        try:
            outcome["found" if store.graph_path(collection, a, b, 4) else "none"] += 1
        except LimitExceededError:
            outcome["limit_exceeded"] += 1
        except QueryTimeoutError:
            outcome["timeout"] += 1
        times.append((time.perf_counter() - t0) * 1000)
    return {"queries": len(times), **outcome, "p50_ms": round(float(np.percentile(times, 50)), 2),
            "p95_ms": round(float(np.percentile(times, 95)), 2), "max_ms": round(max(times), 2)}


def main() -> None:
    global DOCS, QUERIES  # build() and the start sampling read these
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=DOCS, help=f"documents of {EDGES_PER_DOC} edges each (default: {DOCS})")
    ap.add_argument("--queries", type=int, default=QUERIES, help=f"depth-2 walks timed (default: {QUERIES})")
    ap.add_argument("--explain", action="store_true", help="also print the slowest walk's plan on stderr")
    args = ap.parse_args()
    DOCS, QUERIES = args.docs, max(3, args.queries)
    rng = random.Random(16)
    with scratch_server("rag-graph-bench-") as (admin, work):
        url = create_database(admin, "graph_bench")
        edges = build(url, rng)
        store = Store(Settings(database_url=url, home=work / "home"))
        starts = [f"doc:d{rng.randrange(DOCS)}.yaml" for _ in range(QUERIES // 3)] + \
                 [f"ticker:T{rng.randrange(50)}" for _ in range(QUERIES // 3)] + \
                 [f"e{rng.randrange(ENTITIES)}" for _ in range(QUERIES // 3)]
        for s in starts[:20]:  # warm the pool and caches
            store.graph_walk("b", s, 2)
        times, sizes = [], []
        for s in starts:
            t0 = time.perf_counter()
            rows = store.graph_walk("b", s, 2)
            times.append((time.perf_counter() - t0) * 1000)
            sizes.append(len(rows))
        nodes = [f"e{rng.randrange(ENTITIES)}" for _ in range(120)] + [f"ticker:T{rng.randrange(50)}" for _ in range(40)]
        paths = timed_paths(store, "b", [(nodes[i], nodes[i + 1]) for i in range(0, len(nodes), 2)])
        build_complete(url)
        complete = timed_paths(store, "k", [("n0", "island-a")] * 5)
        if args.explain:  # the plan of the slowest start's walk, on stderr
            slow = starts[max(range(len(times)), key=times.__getitem__)]
            print(f"slowest start {slow}:", file=sys.stderr)
            for line in store.graph_walk_plan("b", slow, 2):
                print(line, file=sys.stderr)
        store.close()
    q = statistics.quantiles(times, n=100)
    print(json.dumps({"benchmark": "graph_neighbors_depth2", "edges": edges, "documents": DOCS, "queries": len(times),
                      "p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2), "max_ms": round(max(times), 2),
                      "mean_rows": round(statistics.mean(sizes), 1), "max_rows": max(sizes),
                      "target_p95_ms": 20, "ok": q[94] <= 20,
                      "paths_depth4": paths, "complete_graph_52_unreachable": complete,
                      "max_path_rows": Settings().graph.max_path_rows}))


if __name__ == "__main__":
    main()
