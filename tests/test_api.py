"""The Python API: module-level functions on a default knowledge base, and KnowledgeBase methods."""

from __future__ import annotations

import numpy as np
import pytest

import rag_lib
import rag_lib.api
from rag_lib.config import get_settings
from rag_lib.errors import NotFoundError, ValidationError

TRADE = "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml"

# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


@pytest.fixture
def default_kb(monkeypatch, database_url, provider, tmp_path):
    monkeypatch.setenv("RAG_DATABASE_URL", database_url)
    monkeypatch.setenv("RAG_HOME", str(tmp_path / ".rag"))
    monkeypatch.setattr(rag_lib.api, "get_provider", lambda settings: provider)
    monkeypatch.setattr(rag_lib.api, "_default", None)
    get_settings.cache_clear()
    yield
    if rag_lib.api._default is not None:
        rag_lib.api._default.close()
    get_settings.cache_clear()


def test_module_level_api_round_trip(default_kb, corpus_copy):
    root = corpus_copy(TRADE)
    report = rag_lib.embed_document(root / TRADE, root=root)
    assert report.count("new") == 1 and report.outcomes[0].path == TRADE
    vector = rag_lib.embed_text("NVDA earnings trade")
    assert vector.shape == (384,) and np.isclose(np.linalg.norm(vector), 1.0, atol=1e-4)
    hits = rag_lib.search("why did the NVDA trade enter at support", top_k=3).hits
    assert hits and hits[0].path == TRADE
    status = rag_lib.status()
    assert status["documents"] == 1 and status["active_space"]["dimensions"] == 384
    assert rag_lib.delete_document("TRD-2025-001") == [TRADE]
    assert rag_lib.status()["documents"] == 0
    again = rag_lib.ingest([root])
    assert again.count("new") == 1 and again.texts_embedded == 0  # vectors come from the cache


def test_api_errors_are_typed(default_kb, tmp_path):
    with pytest.raises(ValidationError):
        rag_lib.embed_text("  ")
    with pytest.raises(ValidationError):
        rag_lib.embed_document(tmp_path)
    with pytest.raises(NotFoundError):
        rag_lib.delete_document("nope")


NVDA = "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml"
AMD = "tradegent/knowledge/analysis/stock/AMD_20250122T0935.yaml"
LEARNING_DIR = "tradegent/knowledge/learnings"


def test_seed_python_api(default_kb, corpus_copy):
    """Seed 000 §5.5 and seed 001's Python API, called as the seeds call it, reading the seeds' names."""
    import datetime as dt

    root = corpus_copy(NVDA, AMD, TRADE)
    rag_lib.ingest([root / AMD, root / TRADE], root=root)
    # Option 1: embed a YAML file (seed 000: `embed_document(file_path=..., force=False)`)
    result = rag_lib.embed_document(file_path=str(root / NVDA), force=False, root=root)
    assert result.doc_id and result.chunk_count > 3 and result.embed_model == "all-MiniLM-L6-v2"
    assert result.error_message is None and result.doc_type == "earnings-analysis" and result.ticker == "NVDA"
    assert result.count("new") == 1 and result.outcomes[0].path == NVDA  # the ingest report reads through
    assert rag_lib.embed_document(file_path=str(root / NVDA), root=root).error_message == "unchanged"
    # Option 2: raw text with a doc id is stored and searchable
    stored = rag_lib.embed_text(text="NVIDIA reported strong Q4 with data center revenue up 400%...",
                                doc_id="external-article-001", doc_type="article", ticker="NVDA")
    assert stored.doc_id == "external-article-001" and stored.chunk_count == 1 and stored.error_message is None
    assert [h.doc_id for h in rag_lib.search("data center revenue up 400%", mode="lexical",
                                             doc_type="article").hits] == ["external-article-001"]
    # Option 3: semantic search with the seed's filters and threshold; hits answer to the seed's names
    results = rag_lib.semantic_search(query="NVDA data center revenue growth", ticker="NVDA",
                                      doc_type="earnings-analysis", top_k=5, min_similarity=0.4)
    assert results and len(results) <= 5
    for r in results:
        assert r.doc_id == result.doc_id and r.similarity >= 0.4 and r.content == r.text
        assert r.file_path == NVDA and r.section_label == r.section
    guidance = rag_lib.semantic_search("NVIDIA earnings guidance")  # the seed's defaults: top 5, cosine >= 0.3
    assert 0 < len(guidance) <= 5 and all(r.similarity >= 0.3 for r in guidance)
    assert rag_lib.semantic_search("what could go wrong") == []  # MiniLM scores it at most 0.22 here
    risks = rag_lib.semantic_search("what could go wrong", section="RISK", min_similarity=0.0)
    assert risks and all("risk" in r.section_path.lower() for r in risks)  # seed: section_label ILIKE '%risk%'
    hybrid = rag_lib.hybrid_search(query="earnings volatility", ticker="NVDA", vector_weight=0.7, bm25_weight=0.3)
    assert hybrid and all(r.ticker == "NVDA" and r.similarity is not None for r in hybrid)
    reranked = rag_lib.search_with_rerank(query="competitive position", ticker="NVDA", top_k=5, retrieval_k=50)
    assert 0 < len(reranked) <= 5 and all(r.rerank_score is None for r in reranked)  # no reranker configured
    assert rag_lib.search_with_expansion(query="AI chip demand", top_k=5, n_expansions=3)
    # RAGStats, similar analyses, analysis and hybrid context (ticker first, as the seeds call it)
    stats = rag_lib.get_rag_stats()
    assert stats.document_count == 4 and stats.chunk_count > 10 and {"NVDA", "AMD"} <= set(stats.tickers)
    assert stats.doc_types["earnings-analysis"] == 1 and isinstance(stats.last_embed, dt.datetime)
    similar = rag_lib.get_similar_analyses(ticker="NVDA", analysis_type="earnings-analysis", top_k=3)
    assert [s.file_path for s in similar] == [NVDA]
    assert "NVDA" in str(rag_lib.build_analysis_context("NVDA", "earnings-analysis"))
    ctx = rag_lib.get_hybrid_context("NVDA", "What are the risks to the NVDA thesis?")
    assert ctx.ticker == "NVDA" and ctx.formatted == str(ctx) and ctx.vector_results
    assert isinstance(ctx.graph_context, dict) and ctx.graph_context.get("ticker") == "NVDA"
    assert result.doc_id in {r.doc_id for r in ctx.vector_results}
    without = rag_lib.get_hybrid_context("NVDA", "What are the risks to the NVDA thesis?", exclude_doc_id=result.doc_id)
    assert without.vector_results and result.doc_id not in {r.doc_id for r in without.vector_results}
    typed = rag_lib.get_hybrid_context("NVDA", "What are the risks to the NVDA thesis?", analysis_type="stock-analysis")
    assert "earnings-analysis" not in {r.doc_type for r in typed.vector_results}
    # the default knowledge base closes and reopens
    first = rag_lib.api._default
    rag_lib.close()
    assert rag_lib.api._default is None and rag_lib.get_rag_stats().document_count == 4
    assert rag_lib.api._default is not first


def test_seed_tools_say_what_they_did(default_kb, corpus_copy):
    """Without a reranker or a judge model, rag_search_rerank and rag_evaluate say so and name the setting."""
    import json

    import anyio
    from mcp import Client

    from rag_lib.mcp_server import create_mcp

    root = corpus_copy(NVDA)
    rag_lib.ingest([root])
    kb = rag_lib.api.default_kb()

    async def run() -> None:
        async with Client(create_mcp(lambda: kb)) as client:
            res = await client.call_tool("rag_search_rerank", {"query": "competitive position", "ticker": "NVDA",
                                                               "top_k": 5})
            body = res.structured_content or json.loads(res.content[0].text)
            assert not res.is_error and body["results"] and body["reranked"] is False
            assert "search.rerank_model_path" in body["rerank_note"]
            hit = body["results"][0]
            assert hit["content"] == hit["text"] and hit["file_path"] == NVDA and hit["similarity"] is not None
            res = await client.call_tool("rag_evaluate", {"query": "What drove NVDA's Q4?",
                                                          "contexts": ["Data center revenue rose on AI demand."],
                                                          "answer": "AI demand."})
            body = res.structured_content or json.loads(res.content[0].text)
            assert not res.is_error and body["overall_score"] is None and body["answer_relevancy"] is None
            assert "eval.judge_model" in body["error_message"]
            res = await client.call_tool("rag_status", {})
            body = res.structured_content or json.loads(res.content[0].text)
            assert body["document_count"] == body["documents"] == 1 and body["tickers"] == ["NVDA"]
            assert body["doc_types"] == {"earnings-analysis": 1} and body["last_embed"] == body["last_ingest"]

    anyio.run(run)


def test_reembed_keeps_jsonl_records_at_their_paths(kb, tmp_path):
    """A JSONL record lives at `<file>#<_id>`, so its source file does not end with its path: re-embedding
    must still find the corpus root and leave each record (and its unit ids) where it was, not add a
    second copy under a path relative to the file's own folder."""
    import json

    root = tmp_path / "corpus"
    (root / "beir").mkdir(parents=True)
    records = [{"_id": "a", "title": "Quartz", "text": "Quartz futures spread widened after the storage report."},
               {"_id": "b", "title": "Tin", "text": "Tin smelters cut output as ore grades fell."}]
    (root / "beir" / "recs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert kb.ingest([root]).count("failed") == 0
    before = sorted(r["path"] for r in kb.store.document_sources())
    assert before == ["beir/recs.jsonl#a", "beir/recs.jsonl#b"]
    out = kb.reembed_all()
    assert out["failed"] == 0 and out["missing_sources"] == []
    assert sorted(r["path"] for r in kb.store.document_sources()) == before


def test_bad_arguments_are_validation_errors(kb):
    with pytest.raises(ValidationError, match="text holds a NUL character"):
        kb.embed_text("te\x00xt", doc_id="nul-1")
    with pytest.raises(ValidationError, match="older_than_days must be a number of days, 0 or more"):
        kb.cache_prune(-5)
    with pytest.raises(ValidationError, match="collection 'a b/../c' must be"):
        kb.ingest([], collection="a b/../c")


@pytest.mark.subprocess
@pytest.mark.timeout(300)
def test_a_plain_script_stores_text_without_a_main_guard(database_url, tmp_path):
    """Seed 000's `embed_text(text, doc_id=...)` in a script as people write them (no
    `if __name__ == "__main__":`): the parse ran in a worker process that ran the script again."""
    import subprocess
    import sys

    from testkit import child_env

    script = tmp_path / "note.py"
    script.write_text("from rag_lib import KnowledgeBase\n"
                      "print('script start')\n"
                      "with KnowledgeBase() as kb:\n"
                      "    print(kb.embed_text('A note about grape harvest risk.', doc_id='grape-1').status)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=child_env(database_url, tmp_path / ".rag"),
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["script", "start", "embedded"], done.stdout


def _reopen_default(monkeypatch, **env: str | None) -> None:
    """Close the default knowledge base and read the settings again with `env` changed."""
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    rag_lib.close()
    get_settings.cache_clear()


def _verdict(system: str, user: str) -> str:
    """A judge (and expander) stub: a context or statement is relevant / supported iff it names NVDA."""
    import re

    if system.startswith("TASK: context relevance"):
        items = user.split("\n\n", 1)[1]
    elif "Statements:\n" in user:
        items = user.split("Statements:\n", 1)[1]
    else:  # the query expander
        return "1. NVIDIA accelerator demand\n2. GPU orders from hyperscalers\n3. AI semiconductor spending"
    return "\n".join(f"{n}: {'yes' if 'nvda' in t.lower() else 'no'}" for n, t in re.findall(r"^(\d+): (.*)$", items, re.M))


def test_seed_004_classifier_and_adaptive_context(default_kb, corpus_copy):
    """Seed 001/004's `classify_query` and `get_hybrid_context_adaptive`, called as the seeds call them;
    the classification is the one the MCP tool `rag_classify_query` returns."""
    from rag_lib import QueryType
    from rag_lib.server import service

    root = corpus_copy(NVDA, AMD, TRADE)
    rag_lib.ingest([root])
    analysis = rag_lib.classify_query("Compare NVDA vs AMD earnings")  # seed 001's example
    assert analysis.query_type == QueryType.COMPARISON and analysis.query_type.value == "comparison"
    assert analysis.tickers == ["NVDA", "AMD"] and analysis.suggested_strategy == "vector"
    assert analysis.confidence == 0.9 and analysis.time_constraint is None
    expected = {"How does NVDA relate to AMD?": ("relationship", "graph"),
                "NVDA earnings trend over time": ("trend", "vector"),
                "overview of all trades": ("global", "hybrid"),
                "NVDA stock analysis from February 2026": ("retrieval", "vector")}
    kb = rag_lib.api.default_kb()
    for query, (kind, strategy) in expected.items():
        got = rag_lib.classify_query(query)
        assert (got.query_type.value, got.suggested_strategy) == (kind, strategy), query
        served = service.classify_query(kb, query)
        assert got.to_dict() == served, query  # one classification, whichever surface asks
    assert rag_lib.classify_query("latest NVDA analysis").time_constraint == "recent"  # seed 004's value
    dated = rag_lib.classify_query("NVDA stock analysis from February 2026")
    assert dated.time_constraint == "2026-02-01/2026-02-28" and dated.confidence == 0.5
    assert dated.doc_types == ["stock-analysis"] and dated.tickers == ["NVDA"]
    with pytest.raises(ValidationError):
        rag_lib.classify_query("  ")

    # adaptive context: routed by the query's class, as seed 004 routes it; the seed's result names
    related = rag_lib.get_hybrid_context_adaptive(ticker="NVDA", query="How does NVDA relate to AMD?")
    assert related.route == "graph-first" and related.kind == "relationship" and related.ticker == "NVDA"
    assert related.vector_results and related.formatted == str(related)
    assert isinstance(related.graph_context, dict) and related.graph_context.get("ticker") == "NVDA"
    compared = rag_lib.get_hybrid_context_adaptive("NVDA", "Compare NVDA vs AMD earnings")
    assert compared.route == "per-ticker" and {"NVDA", "AMD"} <= {r.ticker for r in compared.vector_results}
    assert compared.formatted == rag_lib.get_hybrid_context("NVDA", "Compare NVDA vs AMD earnings").formatted
    doc_id = rag_lib.api.default_kb().show(NVDA)["doc_id"]
    assert doc_id in {r.doc_id for r in compared.vector_results}
    without = rag_lib.get_hybrid_context_adaptive("NVDA", "Compare NVDA vs AMD earnings", exclude_doc_id=doc_id,
                                                  analysis_type=None)
    assert without.vector_results and doc_id not in {r.doc_id for r in without.vector_results}


def test_seed_004_expansion_and_evaluation(default_kb, monkeypatch):
    """Seed 004's `expand_query` and `evaluate_rag`: without an expander or judge model they say what to
    set (as the MCP tools do); with one (a local chat server) they return its variations and scores."""
    from chat_stub import ChatStub

    from rag_lib.errors import RagError
    from rag_lib.eval import average_precision, overall_score
    from rag_lib.server import service

    plain = rag_lib.expand_query("AI chip demand", n=3)
    assert (plain.original, plain.variations, plain.all_queries) == ("AI chip demand", [], ["AI chip demand"])
    assert "search.expansion_model" in plain.note
    with pytest.raises(ValidationError):
        rag_lib.expand_query("AI chip demand", n=-1)
    contexts = ["NVDA data center revenue rose on AI demand.", "Apples are red."]
    answer = "NVDA beat its earnings estimate.\nThe moon is made of cheese."
    unjudged = rag_lib.evaluate_rag("What drove NVDA's Q4?", contexts, answer)
    assert unjudged.query == "What drove NVDA's Q4?" and unjudged.judge_calls == 0
    assert all(getattr(unjudged, m) is None for m in ("context_precision", "context_recall", "faithfulness",
                                                       "answer_relevancy", "overall_score"))
    kb = rag_lib.api.default_kb()
    assert unjudged.error_message == service.evaluate(kb, "What drove NVDA's Q4?", contexts, answer)["error_message"]
    assert "eval.judge_model" in unjudged.error_message
    with pytest.raises(ValidationError, match="contexts"):
        rag_lib.evaluate_rag("What drove NVDA's Q4?", "one context as a string", answer)

    with ChatStub(_verdict) as stub:
        _reopen_default(monkeypatch, RAG_SEARCH__EXPANSION_MODEL="stub-chat",
                        RAG_SEARCH__EXPANSION_BASE_URL=stub.base_url, RAG_EVAL__JUDGE_MODEL="judge-1",
                        RAG_EVAL__JUDGE_BASE_URL=stub.base_url)
        expanded = rag_lib.expand_query("AI chip demand", n=2)
        assert expanded.variations == ["NVIDIA accelerator demand", "GPU orders from hyperscalers"]
        assert expanded.all_queries == ["AI chip demand", *expanded.variations] and expanded.note is None
        judged = rag_lib.evaluate_rag("What drove NVDA's Q4?", contexts, answer,
                                      ground_truth="NVDA grew its data center sales. Pears are green.")
        assert stub.requests and all(r["model"] in ("stub-chat", "judge-1") for r in stub.requests)
    assert judged.error_message is None and judged.model == "judge-1" and judged.judge_calls == 4
    assert judged.context_precision == average_precision([True, False])
    assert judged.faithfulness == judged.answer_relevancy == judged.context_recall == 0.5
    assert judged.overall_score == overall_score({"a": 1.0, "b": 0.5, "c": 0.5, "d": 0.5})
    with ChatStub(_verdict, fail=True) as stub:
        _reopen_default(monkeypatch, RAG_EVAL__JUDGE_BASE_URL=stub.base_url)
        with pytest.raises(RagError, match="judge model judge-1 failed"):
            rag_lib.evaluate_rag("What drove NVDA's Q4?", contexts, answer)


def test_seed_004_metrics_collector(default_kb, corpus_copy, tmp_path, monkeypatch):
    """Seed 004's `get_metrics_collector().record_search(...)` records a search the caller timed (the
    table; the JSONL log only when one is named) and `get_summary(days)` summarises them."""
    import json

    from rag_lib.metrics import SearchMetrics

    rag_lib.ingest([corpus_copy(NVDA)])
    hits = rag_lib.semantic_search("NVDA data center revenue growth")
    collector = rag_lib.get_metrics_collector()
    assert collector.enabled and collector.log_path is None  # nothing writes a file that is not named
    before = collector.get_summary(days=7)
    metric = collector.record_search(query="NVDA data center revenue growth", strategy="vector", results=hits,
                                     latency_ms=12, query_type="retrieval")
    assert isinstance(metric, SearchMetrics) and metric.retrieval_count == len(hits) > 0
    assert metric.top_similarity == hits[0].similarity and metric.latency_ms == 12 and metric.reranked is False
    assert metric.query_type == "retrieval" and metric.strategy == "vector" and metric.timestamp
    after = collector.get_summary(days=7)
    assert after["searches"] == before["searches"] + 1 and after["strategies"].get("vector") == 1
    assert after["query_classes"].get("retrieval", 0) == before["query_classes"].get("retrieval", 0) + 1
    assert collector.record_search("nothing", "hybrid", [], 3).top_similarity is None
    with pytest.raises(ValidationError):
        collector.get_summary(days=0)
    with pytest.raises(ValidationError):
        collector.record_search("q", "vector", hits, latency_ms=-1)

    log = tmp_path / "logs" / "rag_metrics.jsonl"
    _reopen_default(monkeypatch, RAG_METRICS=str(log))
    collector = rag_lib.get_metrics_collector()
    assert collector.log_path == log
    collector.record_search("NVDA guidance", "hybrid+rerank", [h.to_dict() for h in hits], 40.6, reranked=True)
    rag_lib.api.default_kb().metrics.flush()
    line = json.loads(log.read_text().splitlines()[-1])
    assert line["query"] == "NVDA guidance" and line["retrieval_count"] == len(hits) and line["reranked"] is True
    assert line["latency_ms"] == 41 and line["top_similarity"] == pytest.approx(hits[0].similarity)
    assert line["mode"] == "hybrid" and line["timestamp"] == line["at"]

    _reopen_default(monkeypatch, RAG_METRICS="false")
    collector = rag_lib.get_metrics_collector()
    assert not collector.enabled and collector.log_path is None
    assert collector.record_search("off", "vector", hits, 5).retrieval_count == len(hits)  # returned, not written
    _reopen_default(monkeypatch, RAG_METRICS=None)
    # "NVDA guidance" was its knowledge base's first use of the database: in the table too (it was
    # dropped: a store not opened yet was taken for a closed one)
    assert rag_lib.get_metrics_collector().get_summary(days=1)["searches"] == after["searches"] + 2
    _reopen_default(monkeypatch, RAG_METRICS=None)
    rag_lib.get_metrics_collector().record_search("first thing", "vector", hits, 7)
    rag_lib.close()
    assert rag_lib.get_metrics_collector().get_summary(days=1)["searches"] == after["searches"] + 3


def test_seed_000_embedding_client(default_kb, monkeypatch):
    """Seed 000 §5.5 option 5: `EmbeddingClient(config).get_embedding(text)`. Without a config it is the
    configured provider's vector (the one searches use); with the seed's embedding config it uses that
    provider (here an Ollama-style server on 127.0.0.1)."""
    from openai_stub import OpenAIStub, stub_vector

    from rag_lib import EmbeddingClient
    from rag_lib.config import Settings
    from rag_lib.embedding import get_provider
    from rag_lib.errors import ConfigError

    client = EmbeddingClient()
    vector = client.get_embedding("NVIDIA data center growth thesis")
    assert isinstance(vector, list) and len(vector) == client.dimensions == 384 and isinstance(vector[0], float)
    assert np.allclose(vector, rag_lib.embed_text("NVIDIA data center growth thesis"), atol=1e-6)
    batch = client.get_embeddings_batch(["NVIDIA data center growth thesis", "AMD market share"])
    assert len(batch) == 2 and np.allclose(batch[0], vector, atol=1e-5)
    with pytest.raises(ValidationError, match="^text is empty$"):
        client.get_embedding(" ")
    # a batch checks each text as embed_text does, naming which one
    with pytest.raises(ValidationError, match=r"^texts\[1\] is empty$"):
        client.get_embeddings_batch(["AMD market share", " "])
    with pytest.raises(ValidationError, match=r"^texts\[0\] holds a NUL"):
        client.get_embeddings_batch(["AMD\x00"])
    with pytest.raises(ValidationError):
        EmbeddingClient("config.yaml")
    with pytest.raises(ConfigError, match="did you mean search.top_k"):
        EmbeddingClient({"embedding": {"model": "all-MiniLM-L6-v2"}, "search": {"top_kk": 3}})

    monkeypatch.setattr(rag_lib.api, "get_provider", get_provider)  # the config's own provider, not the test's
    with OpenAIStub() as stub:
        config = {"default_provider": "ollama", "fallback_chain": ["ollama"], "timeout_seconds": 5,
                  "ollama": {"base_url": stub.base_url.removesuffix("/v1"), "model": "nomic-embed-text",
                             "dimensions": 768}}
        with EmbeddingClient(config) as seeded:
            assert (seeded.model, seeded.dimensions) == ("nomic-embed-text", 768)
            got = seeded.get_embedding("NVIDIA data center growth thesis")
        assert stub.requests == 1
        assert np.allclose(got, stub_vector("nomic-embed-text", "NVIDIA data center growth thesis", 768), atol=1e-6)
        settings = Settings(embedding={"provider": "openai_compatible", "base_url": stub.base_url,
                                       "model": "stub-embed", "dimensions": 16, "api_key_env": "RAG_TEST_KEY"})
        monkeypatch.setenv("RAG_TEST_KEY", "k")
        with EmbeddingClient(settings) as own:
            assert np.allclose(own.get_embedding("x"), stub_vector("stub-embed", "x", 16), atol=1e-6)
