"""The evaluation harness on the development set over the shared corpus, and `rag eval`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import rag_lib.api
from rag_lib.cli import main
from rag_lib.config import get_settings
from rag_lib.eval import evaluate_kb, load_qrels, load_queries

DEV = Path(__file__).resolve().parents[2] / "shared" / "eval" / "tradegent-dev"
if not DEV.is_dir():
    DEV = Path("/work/shared/eval/tradegent-dev")


def test_dev_set_hybrid_beats_single_modes(corpus_kb):
    queries, qrels = load_queries(DEV / "queries.jsonl"), load_qrels(DEV / "qrels.tsv")
    reports = {m: evaluate_kb(corpus_kb, queries, qrels, mode=m) for m in ("semantic", "lexical", "hybrid")}
    for r in reports.values():
        assert r.queries == 30 and r.missing_queries == []
        assert 0 < r.metrics["ndcg@10"] <= 1
        assert r.metrics["recall@10"] <= r.metrics["recall@100"]
    ndcg = {m: r.metrics["ndcg@10"] for m, r in reports.items()}
    assert ndcg["hybrid"] > max(ndcg["semantic"], ndcg["lexical"]), ndcg
    # document units: a document's rank is its best chunk's; doc ids are the documents' ids
    doc_qrels = {"d01": {corpus_kb.show("tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml")["doc_id"]: 1}}
    doc = evaluate_kb(corpus_kb, queries, doc_qrels, mode="hybrid", unit="document")
    assert doc.queries == 1 and doc.metrics["mrr@10"] == 1.0


def test_rag_eval_json(monkeypatch, corpus_db_url, provider, tmp_path, capsys):
    monkeypatch.setenv("RAG_DATABASE_URL", corpus_db_url)
    monkeypatch.setenv("RAG_HOME", str(tmp_path / ".rag"))
    monkeypatch.setattr(rag_lib.api, "get_provider", lambda settings: provider)
    get_settings.cache_clear()
    qrels = tmp_path / "qrels.tsv"
    qrels.write_bytes(b"query-id\tcorpus-id\tscore\r\n" + b"".join(
        line.encode() + b"\r\n" for line in (DEV / "qrels.tsv").read_text().splitlines()[1:] if line.startswith("d0")))

    def rag_eval(*args: str) -> tuple[int, str]:
        monkeypatch.setattr(sys, "argv", ["rag", "eval", "--queries", str(DEV / "queries.jsonl"), "--qrels", str(qrels),
                                          *args])
        try:
            main()
        except SystemExit as exc:
            return int(exc.code or 0), capsys.readouterr().out
        return 0, capsys.readouterr().out

    code, out = rag_eval("--mode", "lexical", "--json")
    assert code == 0 and len(out.strip().splitlines()) == 1
    data = json.loads(out)
    assert set(data) == {"ndcg@10", "recall@10", "recall@100", "mrr@10", "queries", "latency_ms", "mode", "by_type"}
    assert data["queries"] == 9 and data["mode"] == "lexical" and 0 < data["ndcg@10"] <= 1
    assert data["latency_ms"]["p50"] <= data["latency_ms"]["p95"]
    # per query type, as the queries file's metadata.type says
    types = {json.loads(line)["_id"]: json.loads(line)["metadata"]["type"]
             for line in (DEV / "queries.jsonl").read_text().splitlines() if line.strip()}
    assert set(data["by_type"]) == {t for q, t in types.items() if q.startswith("d0")} | {"all"}
    assert data["by_type"]["all"]["queries"] == 9 and data["by_type"]["all"]["ndcg@10"] == data["ndcg@10"]

    code, out = rag_eval("--mode", "lexical", "--json", "--per-query")
    rows = json.loads(out)["per_query"]
    assert code == 0 and len(rows) == 9
    assert rows["d01"]["type"] == types["d01"] and rows["d01"]["text"].startswith("NVDA bull call")
    ndcgs = [r["ndcg@10"] for r in rows.values()]
    assert ndcgs == sorted(ndcgs)  # worst first
    assert sum(ndcgs) / 9 == pytest.approx(data["ndcg@10"], abs=1e-4)

    code, text = rag_eval("--mode", "lexical", "--per-query")
    assert code == 0 and "per query type" in text and "factual" in text
    assert "per query, worst first" in text and "d01" in text
    assert rag_eval("--unit", "paragraph")[0] == 2
    get_settings.cache_clear()
