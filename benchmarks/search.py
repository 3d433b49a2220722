"""Search benchmark over a collection of >= 100,000 chunks. Prints ONE JSON line.

How the collection is built (recorded in the JSON under "corpus"):
* real part: the shared corpus (shared/corpus, ~3,100 chunks) ingested through the normal pipeline
  and embedded for real by all-MiniLM-L6-v2 (collection `default`; the database is first copied from
  the `tradegent` database of the dev evaluation when that exists, so nothing is encoded twice);
* synthetic part, to reach the target size without hours of encoding on 2 cores: documents of 10
  chunks whose text recombines sentences of two real chunks and whose vector is drawn from a
  multivariate Gaussian fitted to the real model vectors (mean + covariance), normalised; the HNSW
  index is rebuilt after the load. Each synthetic document gets one of 20 document types, one of 200
  tickers and a date, so filters have a realistic selectivity (5%, 0.5%).
Then, in one run: p50/p95 latency (query embedding included) of semantic, lexical and hybrid search,
with and without filters, over SciFact test claims; and recall@10 of the HNSW index against exact
search at several hnsw.ef_search values, unfiltered and filtered (iterative index scans).
Queries: the 30 dev questions plus SciFact test claims (texts only), embedded per query.

    .venv/bin/python benchmarks/search.py [--chunks 100000] [--queries 200] [--recall-queries 50]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import SHARED, bench_database  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.eval import load_qrels, load_queries, percentile  # noqa: E402
from rag_lib.models import Chunk, Document, SearchFilters, Section  # noqa: E402
from rag_lib.search import search as library_search  # noqa: E402
from rag_lib.search import SearchOptions  # noqa: E402

SYNTH = "synthetic"
TYPES = [f"type-{n:02d}" for n in range(20)]
TICKERS = [f"T{n:03d}" for n in range(200)]
_SENT = re.compile(r"(?<=[.!?])\s+|\n+")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build_real(kb: KnowledgeBase) -> None:
    report = kb.ingest([SHARED / "corpus"], "default")
    if report.count("failed"):
        raise SystemExit(f"corpus ingest failed: {report.to_dict()['failed']}")


def build_synthetic(kb: KnowledgeBase, target: int, rng: np.random.Generator) -> dict:
    store = kb.store
    space = store.active_space()
    have = store.status_counts(SYNTH)["chunks"] if store.document_states(SYNTH) else 0
    real = store.chunk_vectors("default", space["space"])
    n_real_total = store.status_counts(None)["chunks"] - have
    need = target - n_real_total - have
    info = {"real_chunks": n_real_total, "synthetic_chunks_before": have, "synthetic_added": 0}
    if need <= 0:
        return info
    texts = [r["text"] for r, _ in real]
    vecs = np.stack([v for _, v in real])
    sentences = [[x for x in _SENT.split(t) if x.strip()] or [t] for t in texts]
    # Vectors: independent draws from a Gaussian fitted to the real model vectors (mean + full
    # covariance), normalised: the spread and anisotropy of real embeddings, without the tight
    # near-duplicate clusters that perturbing a few thousand real vectors would create.
    mean = vecs.mean(axis=0).astype(np.float64)
    chol = np.linalg.cholesky(np.cov(vecs, rowvar=False) + 1e-6 * np.eye(vecs.shape[1]))
    start_doc = len(store.document_states(SYNTH))
    fingerprint = kb.settings.pipeline_fingerprint("bench")
    docs = (need + 9) // 10
    started = time.perf_counter()
    for d in range(start_doc, start_doc + docs):
        doc_type, ticker = TYPES[d % len(TYPES)], TICKERS[(d * 7) % len(TICKERS)]
        date = dt.date(2020, 1, 1) + dt.timedelta(days=int(d % 1800))
        path = f"synthetic/{doc_type}/{ticker}_{d:06d}.md"
        doc = Document(collection=SYNTH, path=path, doc_id=f"S{d:06d}", doc_type=doc_type, format="markdown",
                       content_hash=sha(path), body="", ticker=ticker, doc_date=date)
        chunks, rows = [], []
        for n in range(10):
            a, b = rng.integers(0, len(texts), 2)
            sa, sb = sentences[a], sentences[b]
            text = " ".join(sa[: max(1, len(sa) // 2)] + sb[len(sb) // 2:])
            vec = mean + chol @ rng.standard_normal(len(mean))
            rows.append(vec / np.linalg.norm(vec))
            section = f"part{n}"
            embed = f"[{doc_type}] [{ticker}] [{section}]\n{text}"
            h = sha(embed + path)
            chunks.append(Chunk(
                chunk_id=f"syn-{d:06d}-{n}", collection=SYNTH, path=path, doc_id=doc.doc_id, doc_type=doc_type,
                section=section, section_path=section, ordinal=n, text=text, embed_text=embed,
                token_count=len(text.split()), content_hash=h, char_start=0, char_end=len(text), ticker=ticker,
                doc_date=date))
        sections = [Section(name=c.section, title=c.section, ordinal=n, text=c.text) for n, c in enumerate(chunks)]
        store.publish_document(doc, sections, chunks, np.stack(rows).astype(np.float32), space["space"],
                               space["dimensions"], fingerprint)
    info["synthetic_added"] = docs * 10
    info["synthetic_load_seconds"] = round(time.perf_counter() - started, 1)
    return info


def timed(fn, queries: list[str]) -> dict:
    fn(queries[0])  # warm caches (pool, plans, term statistics)
    times = []
    for q in queries:
        t0 = time.perf_counter()
        fn(q)
        times.append((time.perf_counter() - t0) * 1000)
    return {"p50": round(percentile(times, 50), 2), "p95": round(percentile(times, 95), 2), "n": len(times)}


def recall_sweep(kb: KnowledgeBase, vectors: list[np.ndarray], filters: SearchFilters, efs: list[int]) -> dict:
    store = kb.store
    space = store.active_space()
    exact = [[h.chunk_id for h in store.semantic_search(v, space["space"], space["dimensions"], filters, 10, exact=True)]
             for v in vectors]
    out = {}
    for ef in efs:
        store.settings.search.ef_search = ef
        recalls, times = [], []
        for v, truth in zip(vectors, exact):
            t0 = time.perf_counter()
            got = [h.chunk_id for h in store.semantic_search(v, space["space"], space["dimensions"], filters, 10)]
            times.append((time.perf_counter() - t0) * 1000)
            recalls.append(len(set(got) & set(truth)) / max(1, len(truth)))
        out[str(ef)] = {"recall@10": round(statistics.fmean(recalls), 4), "p50_ms": round(percentile(times, 50), 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--recall-queries", type=int, default=50)
    parser.add_argument("--database", default="bench_search")
    args = parser.parse_args()
    rng = np.random.default_rng(7)

    url, work = bench_database(args.database, template="tradegent")
    settings = Settings(database_url=url, home=work / "home", max_file_bytes=64 * 1024 * 1024)
    kb = KnowledgeBase(settings)
    t0 = time.perf_counter()
    build_real(kb)
    corpus = build_synthetic(kb, args.chunks, rng)
    space = kb.store.active_space()
    index = kb.store.ensure_hnsw_index(space["space"], space["dimensions"], rebuild=bool(corpus["synthetic_added"]))
    kb.store.analyze()
    corpus.update(total_chunks=kb.store.status_counts(None)["chunks"], build_seconds=round(time.perf_counter() - t0, 1),
                  index=index)

    queries = load_queries(SHARED / "datasets" / "scifact" / "queries.jsonl")
    test_ids = list(load_qrels(SHARED / "datasets" / "scifact" / "qrels" / "test.tsv"))
    dev = load_queries(SHARED / "eval" / "tradegent-dev" / "queries.jsonl")
    texts = (list(dev.values()) + [queries[q] for q in test_ids])[: args.queries]
    kb.provider.embed(["warm up"])
    opts = SearchOptions.from_settings(settings)
    type_filter = {"doc_type": "type-03"}  # 5% of the synthetic chunks
    ticker_filter = {"ticker": "T042"}  # 0.5% of the synthetic chunks

    store, provider = kb.search_context()

    def run(mode: str, **flt):
        # The library search over ALL 100k chunks (no collection filter; KnowledgeBase.search always
        # scopes to one collection, and the real and synthetic parts are separate collections).
        return lambda q: library_search(store, provider, q, mode=mode, top_k=10, filters=SearchFilters(**flt))

    latency = {}
    for mode in ("semantic", "lexical", "hybrid"):
        latency[mode] = timed(run(mode), texts)
        latency[f"{mode}_filtered_type"] = timed(run(mode, **type_filter), texts)
        latency[f"{mode}_filtered_ticker"] = timed(run(mode, **ticker_filter), texts)

    vectors = list(kb.provider.embed(texts[: args.recall_queries]))
    efs = [40, 64, 100, 200]
    recall = {
        "unfiltered": recall_sweep(kb, vectors, SearchFilters(), efs),
        "filtered_type_5pct": recall_sweep(kb, vectors, SearchFilters(doc_type="type-03"), efs),
        "filtered_ticker_0.5pct": recall_sweep(kb, vectors, SearchFilters(ticker="T042"), efs),
        # the real model vectors only (3%: iterative scan through the synthetic rows)
        "filtered_real_collection_3pct": recall_sweep(kb, vectors, SearchFilters(collection="default"), efs),
    }
    settings.search.ef_search = 100
    targets = {
        "hybrid_p95_le_50ms": latency["hybrid"]["p95"] <= 50,
        "semantic_p95_le_20ms": latency["semantic"]["p95"] <= 20,
        "filtered_recall_ge_0.95_at_default_ef": min(recall[k]["100"]["recall@10"] for k in recall if k != "unfiltered") >= 0.95,
    }
    print(json.dumps({
        "benchmark": "search",
        "corpus": {**corpus, "how": "shared corpus embedded for real (all-MiniLM-L6-v2) + synthetic chunks: text = recombined "
                   "real sentences/lines, vector = normalised draw from a Gaussian fitted to the real vectors"},
        "settings": {"ef_search": 100, "candidate_depth": opts.candidate_depth, "rrf_k": opts.rrf_k,
                     "hnsw_m": settings.search.hnsw_m, "ef_construction": settings.search.hnsw_ef_construction,
                     "max_scan_tuples": settings.search.max_scan_tuples, "iterative_scan": "relaxed_order"},
        "queries": len(texts), "latency_ms_incl_query_embedding": latency, "recall_vs_exact": recall,
        "targets_met": targets,
    }, default=str))
    kb.close()


if __name__ == "__main__":
    main()
