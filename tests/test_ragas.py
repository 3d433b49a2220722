"""RAGAS metrics (context precision, context recall, faithfulness) judged by an OpenAI-compatible chat
model: a stub chat server on 127.0.0.1 whose verdicts are known, so the scores are exact."""

from __future__ import annotations

import re

import pytest
from chat_stub import ChatStub

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.errors import ConfigError, RagError
from rag_lib.eval import average_precision, parse_verdicts

NVDA = "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml"
NFLX = "tradegent/knowledge/analysis/earnings/NFLX_20250118T0800.yaml"

# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache
ANSWER = "NVDA beat its earnings estimate.\nThe moon is made of cheese."


def _verdict(system: str, user: str) -> str:
    """Relevance: a context is relevant iff it names NVDA; support: a statement is supported iff it
    names NVDA; the answer is ANSWER (one supported sentence, one not)."""
    if system.startswith("TASK: answer"):
        return ANSWER
    items = user.split("\n\n", 1)[1] if system.startswith("TASK: context relevance") else user.split("Statements:\n", 1)[1]
    return "\n".join(f"{n}: {'yes' if 'nvda' in t.lower() else 'no'}" for n, t in re.findall(r"^(\d+): (.*)$", items, re.M))


def judge_stub(fail: bool = False) -> ChatStub:
    return ChatStub(_verdict, fail=fail)


def test_verdict_parsing_and_average_precision():
    assert parse_verdicts("1: yes\n2: NO\n[3] - yes\nnoise", 4) == [True, False, True, False]
    assert average_precision([True, False, True]) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision([False, False]) == 0.0


@pytest.fixture
def judged_kb(database_url, provider, tmp_path, corpus_copy, monkeypatch):
    def make(base_url: str) -> KnowledgeBase:
        # the seeds' LLM_BASE_URL names the judge's server too
        monkeypatch.setenv("LLM_BASE_URL", base_url)
        settings = Settings(database_url=database_url, home=tmp_path / ".rag", eval={"judge_model": "judge-1"})
        base = KnowledgeBase(settings, provider=provider)
        report = base.ingest([corpus_copy(NVDA, NFLX)])
        assert report.count("new") == 2
        return base

    return make


def test_evaluate_with_the_judge(judged_kb):
    with judge_stub() as stub:
        base = judged_kb(stub.base_url)
        try:
            assert base.settings.eval.judge_base_url == stub.base_url
            hits = base.search("NVDA earnings results", mode="hybrid", top_k=3).hits
            queries = {"q1": "NVDA earnings results"}
            qrels = {"q1": {hits[0].unit_id: 1}}
            out = base.evaluate(queries, qrels, mode="hybrid", judge=True, top_k=3,
                                references={"q1": "NVDA reported record revenue. Apples are red."})
        finally:
            base.close()
    assert out["ndcg@10"] == 1.0 and out["queries"] == 1
    ragas = out["ragas"]
    expected = average_precision(["nvda" in h.text.lower() for h in hits])
    assert ragas["context_precision"] == pytest.approx(expected, abs=1e-4)
    assert ragas["faithfulness"] == 0.5 and ragas["context_recall"] == 0.5
    assert ragas["judge_calls"] == 4 and all(r["model"] == "judge-1" for r in stub.requests)


def test_without_a_reference_context_recall_is_not_claimed(judged_kb):
    with judge_stub() as stub:
        base = judged_kb(stub.base_url)
        try:
            out = base.evaluate({"q1": "NVDA earnings"}, {"q1": {"x#y": 1}}, judge=True)
        finally:
            base.close()
    assert out["ragas"]["context_recall"] is None and out["ragas"]["faithfulness"] == 0.5


def test_judge_failures_are_typed(judged_kb):
    with judge_stub(fail=True) as stub:
        base = judged_kb(stub.base_url)
        try:
            with pytest.raises(RagError, match="judge model judge-1 failed"):
                base.evaluate({"q1": "NVDA earnings"}, {"q1": {"x#y": 1}}, judge=True)
        finally:
            base.close()
    base = KnowledgeBase(Settings(), provider=None)
    from rag_lib.eval import judge_from_settings

    with pytest.raises(ConfigError, match="judge_model"):
        judge_from_settings(base.settings)
