"""Evaluation metrics agree with pytrec_eval and with hand-computed values; BEIR files load."""

from __future__ import annotations

import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytrec_eval

from rag_lib.errors import ValidationError
from rag_lib.eval import evaluate, load_qrels, load_queries, query_metrics, unit_ranking

SHARED = Path(__file__).resolve().parents[2] / "shared"
if not SHARED.is_dir():
    SHARED = Path(os.environ.get("RAG_SHARED", "/work/shared"))

QRELS = {
    "q1": {"a": 2, "b": 1, "c": 0, "z": 1},  # z never retrieved
    "q2": {"x": 1},
    "q3": {"m": 1, "n": 2},
}
RANKINGS = {
    "q1": ["d", "a", "c", "b", "e"],
    "q2": ["p", "q", "r", "s", "t", "u", "v", "w", "y", "o", "x"],  # relevant at rank 11
    "q3": ["n", "m"],
}


def _pytrec(rankings, qrels):
    run = {q: {u: float(len(r) - i) for i, u in enumerate(r)} for q, r in rankings.items()}
    run10 = {q: {u: s for u, s in list(run[q].items())[:10]} for q in run}
    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.10", "recall.100"}).evaluate(run)
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run10)
    return {q: {"ndcg@10": full[q]["ndcg_cut_10"], "recall@10": full[q]["recall_10"],
                "recall@100": full[q]["recall_100"], "mrr@10": rr[q]["recip_rank"]} for q in qrels}


def test_metrics_match_pytrec_eval():
    expected = _pytrec(RANKINGS, QRELS)
    for qid in QRELS:
        ours = query_metrics(RANKINGS[qid], QRELS[qid])
        for name, value in expected[qid].items():
            assert ours[name] == pytest.approx(value, abs=1e-9), (qid, name)


def test_metrics_hand_computed():
    m = query_metrics(RANKINGS["q1"], QRELS["q1"])
    dcg = 2 / math.log2(3) + 1 / math.log2(5)
    idcg = 2 / math.log2(2) + 1 / math.log2(3) + 1 / math.log2(4)
    assert m["ndcg@10"] == pytest.approx(dcg / idcg)
    assert m["recall@10"] == pytest.approx(2 / 3)  # a, b of a, b, z (c is judged non-relevant)
    assert m["mrr@10"] == pytest.approx(0.5)
    m2 = query_metrics(RANKINGS["q2"], QRELS["q2"])
    assert (m2["ndcg@10"], m2["recall@10"], m2["recall@100"], m2["mrr@10"]) == (0.0, 0.0, 1.0, 0.0)


def test_unit_rank_is_best_chunk_rank():
    hits = [SimpleNamespace(unit_id="f.yaml#a", doc_id="D1"), SimpleNamespace(unit_id="g.yaml#b", doc_id="D2"),
            SimpleNamespace(unit_id="f.yaml#a", doc_id="D1"), SimpleNamespace(unit_id="f.yaml#c", doc_id="D1")]
    assert unit_ranking(hits, "section") == ["f.yaml#a", "g.yaml#b", "f.yaml#c"]
    assert unit_ranking(hits, "document") == ["D1", "D2"]


def test_evaluate_averages_judged_queries_and_reports_latency():
    hits = {"one": [SimpleNamespace(unit_id="a", doc_id="a")], "two": [SimpleNamespace(unit_id="b", doc_id="b")]}
    report = evaluate(lambda text: hits[text], {"q1": "one", "q2": "two", "q9": "unjudged"},
                      {"q1": {"a": 1}, "q2": {"a": 1}, "q3": {"a": 1}}, mode="semantic")
    assert report.queries == 2 and report.missing_queries == ["q3"]
    assert report.metrics["ndcg@10"] == pytest.approx(0.5)
    summary = report.summary()
    assert set(summary) == {"ndcg@10", "recall@10", "recall@100", "mrr@10", "queries", "latency_ms", "mode"}
    assert set(summary["latency_ms"]) == {"p50", "p95"}


def test_load_beir_files_crlf_and_header(tmp_path):
    (tmp_path / "q.jsonl").write_text('{"_id": "1", "text": "claim one", "metadata": {}}\n\n{"_id": 2, "text": "two"}\n')
    (tmp_path / "qrels.tsv").write_bytes(b"query-id\tcorpus-id\tscore\r\n1\t31715818\t1\r\n1\t99\t2\r\n2\t5\t0\r\n")
    assert load_queries(tmp_path / "q.jsonl") == {"1": "claim one", "2": "two"}
    assert load_qrels(tmp_path / "qrels.tsv") == {"1": {"31715818": 1, "99": 2}, "2": {"5": 0}}
    (tmp_path / "bad.tsv").write_text("query-id\tcorpus-id\tscore\n1\tx\tlots\n")
    with pytest.raises(ValidationError, match="not a number"):
        load_qrels(tmp_path / "bad.tsv")
    with pytest.raises(ValidationError):
        load_queries(tmp_path / "missing.jsonl")


def test_scifact_qrels_load():
    qrels = load_qrels(SHARED / "datasets" / "scifact" / "qrels" / "test.tsv")
    assert len(qrels) == 300 and sum(len(v) for v in qrels.values()) == 339
