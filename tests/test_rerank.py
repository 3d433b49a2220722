"""Rerank providers: the `/rerank` HTTP provider against a server on 127.0.0.1 (429 + Retry-After,
5xx, timeouts, wrong lengths), the no-op default, and `rerank_score` beside the fused score."""

from __future__ import annotations

import pytest

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.search.rerank import HttpReranker, NoopReranker, RerankError, reranker_from_settings
from rerank_stub import RerankStub, stub_score

TEXTS = ["nothing relevant here", "NVDA earnings beat", "NVDA guidance and earnings call risks"]
QUERY = "NVDA earnings risks"


# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


@pytest.mark.parametrize("shape", ["tei", "cohere"])
def test_http_reranker_scores_in_input_order(shape):
    with RerankStub(shape=shape) as stub:
        scores = HttpReranker(stub.base_url, model="bge-reranker").rerank(QUERY, TEXTS)
    assert scores == [stub_score(QUERY, t) for t in TEXTS] == [0.0, 2.0, 3.0]
    assert stub.requests[0]["body"]["query"] == QUERY and stub.requests[0]["body"]["model"] == "bge-reranker"


def test_429_waits_for_retry_after_then_succeeds():
    slept = []
    with RerankStub(retry_after="0.3") as stub:
        stub.script = ["429", "ok"]
        reranker = HttpReranker(stub.base_url, backoff_base=0.01, sleep=lambda s: slept.append(s))
        assert reranker.rerank(QUERY, TEXTS) == [0.0, 2.0, 3.0]
    assert len(stub.requests) == 2 and reranker.retries == 1
    assert slept[0] >= 0.3  # never sooner than the server asked


def test_5xx_is_retried_then_fails_with_a_typed_error():
    with RerankStub() as stub:
        stub.script = ["500"] * 10
        reranker = HttpReranker(stub.base_url, max_retries=2, backoff_base=0.01, sleep=lambda s: None)
        with pytest.raises(RerankError, match="after 3 attempt.*HTTP 500"):
            reranker.rerank(QUERY, TEXTS)
    assert len(stub.requests) == 3


def test_timeout_is_retried():
    with RerankStub(slow_seconds=1.0) as stub:
        stub.script = ["slow", "ok"]
        reranker = HttpReranker(stub.base_url, timeout=0.3, backoff_base=0.01, sleep=lambda s: None)
        assert reranker.rerank(QUERY, TEXTS) == [0.0, 2.0, 3.0]
    assert reranker.retries == 1


def test_wrong_number_of_scores_is_an_error_and_not_retried():
    with RerankStub() as stub:
        stub.script = ["short"]
        with pytest.raises(RerankError, match="expected 3 scores.*not retried"):
            HttpReranker(stub.base_url, sleep=lambda s: None).rerank(QUERY, TEXTS)
    assert len(stub.requests) == 1


def test_default_reranker_is_the_noop():
    assert isinstance(reranker_from_settings(Settings()), NoopReranker)
    assert NoopReranker().rerank("q", ["a", "b"]) == [0.0, 0.0]


FILES = ("tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml",
         "tradegent/knowledge/analysis/earnings/NFLX_20250118T0800.yaml",
         "tradegent/knowledge/analysis/stock/MSFT_20260220T1805.yaml")


def test_search_keeps_the_fused_score_beside_rerank_score(database_url, provider, tmp_path, corpus_copy):
    query = "NVDA earnings guidance risks"
    with RerankStub() as stub:
        settings = Settings(database_url=database_url, home=tmp_path / ".rag",
                            search={"rerank_base_url": stub.base_url, "rerank_depth": 20})
        with KnowledgeBase(settings, provider=provider) as base:
            base.ingest([corpus_copy(*FILES)])
            assert base.rerank_enabled()  # a configured HTTP reranker is on by default
            fused = base.search(query, mode="hybrid", top_k=10, rerank=False, group=False)
            reranked = base.search(query, mode="hybrid", top_k=10, group=False)
    assert len(fused.hits) == len(reranked.hits) == 10
    assert all(h.rerank_score is None for h in fused.hits)
    assert all(h.rerank_score is not None for h in reranked.hits)
    scores = [h.rerank_score for h in reranked.hits]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] == stub_score(query, reranked.hits[0].text)
    by_id = {h.chunk_id: h.score for h in fused.hits}
    same = [h for h in reranked.hits if h.chunk_id in by_id]
    assert same and all(abs(h.score - by_id[h.chunk_id]) < 1e-9 for h in same)  # fused score kept
    assert "rerank" in reranked.timings_ms and "rerank" not in fused.timings_ms
    assert reranked.to_dict()["results"][0]["rerank_score"] == scores[0]


def test_noop_rerank_keeps_the_fused_order(kb, corpus_copy):
    kb.ingest([corpus_copy(*FILES)])
    assert not kb.rerank_enabled()
    plain = kb.search("earnings guidance risks", mode="hybrid", top_k=8)
    kept = kb.search("earnings guidance risks", mode="hybrid", top_k=8, rerank=True)
    assert [h.chunk_id for h in kept.hits] == [h.chunk_id for h in plain.hits]
