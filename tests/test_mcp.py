"""The MCP server through the SDK's own client, once over stdio (`rag mcp`) and once over streamable
HTTP (`rag mcp --transport http`), each against a database holding the shared corpus: every tool of
seed 001 (plus rag_context and rag_list) called with the seeds' own example arguments, and the error
paths. A stub chat server on 127.0.0.1 plays the query-expansion model."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from conftest import SHARED_CORPUS

from chat_stub import ChatStub as BaseChatStub
from testkit import RAG, child_env, error_text, payload, start_server

pytestmark = pytest.mark.subprocess

NVDA = "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml"
SEED_FILE = "trading/knowledge/analysis/earnings/NVDA_20260219T0900.yaml"  # seed 000's example path
SEED_TOOLS = {"rag_embed", "rag_embed_text", "rag_search", "rag_similar", "rag_hybrid_context", "rag_status",
              "rag_search_rerank", "rag_search_expanded", "rag_classify_query", "rag_expand_query", "rag_evaluate",
              "rag_metrics_summary"}
TOOLS = SEED_TOOLS | {"rag_context", "rag_list", "rag_graph"}
WRITE_TOOLS = {"rag_embed", "rag_embed_text"}
VARIATIONS = ["artificial intelligence accelerator demand", "GPU orders from hyperscalers", "datacenter chip sales"]


class ChatStub(BaseChatStub):
    """Answers every RAGAS judge prompt with all yes, and the query expander with VARIATIONS."""

    def __init__(self) -> None:
        self.expansions = 0  # expander prompts answered (a request expands once, and only when asked)
        super().__init__(self.answer)

    def answer(self, system: str, user: str) -> str:
        if system.startswith("TASK:"):  # a RAGAS judge prompt: every numbered item is a yes
            return "\n".join(f"{n}: yes" for n in re.findall(r"^(?:context |statement )?(\d+):", user, re.M))
        self.expansions += 1
        return "\n".join(VARIATIONS)


@pytest.fixture(scope="module")
def chat_stub() -> Iterator[ChatStub]:
    stub = ChatStub()
    yield stub
    stub.close()


def server_env(db_url: str, tmp_path: Path, chat: ChatStub) -> dict[str, str]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    (root / "ok.md").write_text("# Ok\n\n## Body\n\nQuartz futures spread widened after the storage report.\n")
    seed_file = root / SEED_FILE
    seed_file.parent.mkdir(parents=True, exist_ok=True)
    seed_file.write_bytes((SHARED_CORPUS / NVDA).read_bytes())
    env = child_env(db_url, tmp_path / ".rag", RAG_SERVER__CORPUS_ROOTS=json.dumps([str(root)]), RAG_SEARCH__TOP_K="4",
                    RAG_SEARCH__EXPANSION_MODEL="stub-chat", RAG_SEARCH__EXPANSION_BASE_URL=chat.base_url,
               RAG_EVAL__JUDGE_MODEL="stub-judge", RAG_EVAL__JUDGE_BASE_URL=chat.base_url, OPENAI_API_KEY="stub-key")
    return env


async def check_listing(client: Client, expected: set[str]) -> None:
    listed = (await client.list_tools()).tools
    by_name = {t.name: t for t in listed}
    assert set(by_name) == expected
    for tool in listed:
        assert len(tool.description or "") > 60, tool.name
        assert tool.input_schema["type"] == "object"
        for name, prop in tool.input_schema.get("properties", {}).items():
            assert prop.get("description"), (tool.name, name)
    assert by_name["rag_search"].input_schema["required"] == ["query"]
    # the hit record is defined once: the search tools' output schema is the HTTP API's SearchHitOut
    hit = by_name["rag_search"].output_schema["$defs"]["SearchHitOut"]["properties"]
    assert {"rank", "unit_id", "score", "text", "excerpt"} <= set(hit)
    assert "knowledge-graph facts" in by_name["rag_hybrid_context"].description
    if "rag_embed" in by_name:
        assert "ctx" not in by_name["rag_embed"].input_schema["properties"]


def seed_hits(hits: list[dict]) -> None:
    """Every hit carries the seeds' names (000 §4.1/§5.5, 001 SearchResult) beside ours."""
    assert hits
    for h in hits:
        assert (h["content"], h["file_path"], h["section_label"]) == (h["text"], h["path"], h["section"])
        assert isinstance(h["similarity"], float)


async def exercise_seed_tools(client: Client, chat: ChatStub) -> None:
    """Every tool with the seeds' example arguments (000 section 5, 001, 004 phases 3-7)."""
    await check_listing(client, TOOLS)

    # seed 000 5.5: embed a YAML file, then raw text
    made = payload(await client.call_tool("rag_embed", {"file_path": SEED_FILE, "force": False}))
    assert made["status"] == "embedded" and made["doc_id"] and made["chunks"] > 3 and made["tokens_processed"] > 100
    # seed 001's EmbedResult names
    assert made["chunk_count"] == made["chunks"] and made["embed_model"] == "all-MiniLM-L6-v2"
    assert made["error_message"] is None
    again = payload(await client.call_tool("rag_embed", {"file_path": SEED_FILE}))
    assert again["error_message"] == "unchanged" and again["chunk_count"] == made["chunk_count"]
    stored = payload(await client.call_tool("rag_embed_text", {
        "text": "NVIDIA reported strong Q4 with data center revenue up 400%...",
        "doc_id": "external-article-001", "doc_type": "article", "ticker": "NVDA"}))
    assert stored["doc_id"] == "external-article-001" and stored["chunks"] == 1 and stored["status"] == "embedded"

    # seed 000 5.3: past analyses, peers, learnings
    past = payload(await client.call_tool("rag_search", {"query": "NVDA earnings-analysis thesis catalysts risks",
                                                         "ticker": "NVDA", "top_k": 3}))
    assert len(past["results"]) == 3 and all(h["ticker"] == "NVDA" for h in past["results"])
    seed_hits(past["results"])
    expansions = chat.expansions
    held = payload(await client.call_tool("rag_search", {"query": "AI capex thesis", "ticker": "NVDA", "top_k": 5,
                                                         "min_similarity": 0.4}))
    assert held["results"] and all(h["similarity"] >= 0.4 for h in held["results"])
    assert chat.expansions == expansions  # an expander is configured, but rag_search did not ask for it
    assert past["results"][0]["unit_id"].startswith(past["results"][0]["path"] + "#")
    # without top_k: the server's search.top_k (4 here), not a default of the tool's own
    assert payload(await client.call_tool("rag_search", {"query": "NVDA thesis"}))["count"] == 4
    # an agent that names a collection holding nothing is told which ones hold documents
    wrong = payload(await client.call_tool("rag_search", {"query": "NVDA thesis", "collection": "research"}))
    assert wrong["results"] == [] and wrong["note"].startswith("collection 'research' holds no documents; these do: ")
    typo = payload(await client.call_tool("rag_search", {"query": "NVDA thesis", "doc_type": "stock-analyses"}))
    assert typo["results"] == [] and "(did you mean stock-analysis" in typo["note"]
    peers = payload(await client.call_tool("rag_search", {"query": "earnings-analysis thesis catalysts",
                                                          "ticker": ["AMD", "AVGO"], "top_k": 2}))
    assert peers["results"] and all(h["ticker"] in ("AMD", "AVGO") for h in peers["results"])
    learnings = payload(await client.call_tool("rag_search", {"query": "NVDA lessons bias mistakes",
                                                              "doc_type": "post-trade-review", "top_k": 3}))
    # the corpus holds no post-trade review (its one template is skipped): every hit would be another type
    assert learnings["results"] == []
    text_hit = payload(await client.call_tool("rag_search", {"query": "NVIDIA data center revenue up 400%",
                                                             "doc_type": "article", "mode": "lexical"}))
    assert [h["doc_id"] for h in text_hit["results"]] == ["external-article-001"]

    # seed 000 5.5 option 4: similar analyses for a ticker; today's by-document similarity too
    sim = payload(await client.call_tool("rag_similar", {"ticker": "NVDA", "analysis_type": "earnings-analysis",
                                                         "top_k": 3}))
    paths = [h["path"] for h in sim["results"]]
    assert 0 < len(paths) <= 3 and len(set(paths)) == len(paths)
    assert all(h["ticker"] == "NVDA" and h["doc_type"] == "earnings-analysis" for h in sim["results"])
    seed_hits(sim["results"])
    related = payload(await client.call_tool("rag_similar", {"ref": NVDA, "top_k": 3}))
    assert related["results"] and NVDA not in [h["path"] for h in related["results"]]
    seed_hits(related["results"])
    assert "invalid_input" in error_text(await client.call_tool("rag_similar", {"top_k": 3}))

    # seed 001: hybrid context (relationship questions go graph-first), status
    hybrid = payload(await client.call_tool("rag_hybrid_context", {"ticker": "NVDA",
                                                                   "query": "How does NVDA relate to AMD?"}))
    assert hybrid["context"] and hybrid["citations"] and hybrid["graph"]
    assert hybrid["query_type"] == "relationship" and hybrid["strategy"] == hybrid["route"]
    assert hybrid["tokens"] <= hybrid["token_budget"]
    # seed 004's HybridContext: vector_results, graph_context, formatted; analysis_type and exclude_doc_id
    assert hybrid["formatted"] == hybrid["markdown"] and hybrid["graph_context"]["ticker"] == "NVDA"
    seed_hits(hybrid["vector_results"])
    excluded = hybrid["vector_results"][0]["doc_id"]
    without = payload(await client.call_tool("rag_hybrid_context", {
        "ticker": "NVDA", "query": "How does NVDA relate to AMD?", "exclude_doc_id": excluded}))
    assert without["vector_results"] and excluded not in {h["doc_id"] for h in without["vector_results"]}
    narrowed = payload(await client.call_tool("rag_hybrid_context", {
        "ticker": "NVDA", "query": "NVDA thesis catalysts risks", "analysis_type": "earnings-analysis"}))
    learning_types = {"learning", "post-trade-review"}
    assert {h["doc_type"] for h in narrowed["vector_results"]} - learning_types == {"earnings-analysis"}
    status = payload(await client.call_tool("rag_status", {}))
    assert status["documents"] > 50
    # seed 001's RAGStats names beside ours
    assert status["document_count"] == status["documents"] and status["doc_types"] == status["by_type"]
    assert {"NVDA", "AMD"} <= set(status["tickers"]) and status["last_embed"] == status["last_ingest"]

    # seed 004 phase 4-6: classify, expand, expanded search, reranked search
    cls = payload(await client.call_tool("rag_classify_query", {"query": "Compare NVDA vs AMD earnings"}))
    assert cls["query_type"] == "comparison" and cls["tickers"] == ["NVDA", "AMD"]
    assert cls["suggested_strategy"] == "vector" and 0 < cls["confidence"] <= 1
    expanded = payload(await client.call_tool("rag_expand_query", {"query": "AI chip demand", "n": 3}))
    assert expanded["variations"] == VARIATIONS and expanded["all_queries"] == ["AI chip demand", *VARIATIONS]
    expansions = chat.expansions
    wide = payload(await client.call_tool("rag_search_expanded", {"query": "AI chip demand", "top_k": 5,
                                                                  "n_expansions": 3}))
    assert chat.expansions == expansions + 1  # expanded once for the request (each search did not again)
    seed_hits(wide["results"])
    assert wide["queries"] == ["AI chip demand", *VARIATIONS] and len(wide["results"]) == 5
    assert len({h["chunk_id"] for h in wide["results"]}) == 5
    assert {h["matched_query"] for h in wide["results"]} <= set(wide["queries"])
    # today's tools
    page = payload(await client.call_tool("rag_list", {"limit": 3}))
    assert len(page["items"]) == 3 and page["next_offset"] == 3
    up = payload(await client.call_tool("rag_embed", {"name": "n/up.md", "collection": "mcp",
                                                      "content": "# Up\n\n## A\n\nUploaded by an agent.\n"}))
    assert up["new"] == 1
    assert payload(await client.call_tool("rag_list", {"collection": "mcp"}))["items"][0]["path"] == "n/up.md"
    ctx = payload(await client.call_tool("rag_context", {"query": "NVDA earnings risks", "token_budget": 300}))
    assert ctx["context"] and ctx["citations"] and ctx["tokens"] <= 300

    # errors come back as tool errors and the server keeps serving
    assert "not_found" in error_text(await client.call_tool("rag_similar", {"ref": "no/such.yaml"}))
    assert "path_not_allowed" in error_text(await client.call_tool("rag_embed", {"path": "../../etc/passwd"}))
    assert "invalid_input" in error_text(await client.call_tool("rag_embed", {"name": "x.md"}))
    assert error_text(await client.call_tool("rag_search", {"query": ""}))
    assert error_text(await client.call_tool("rag_search", {"query": "x", "mode": "telepathic"}))
    assert error_text(await client.call_tool("rag_search", {"query": "x", "top_k": 500}))
    # an argument the tool does not take is refused, not ignored (results would look filtered)
    unknown = error_text(await client.call_tool("rag_search", {"query": "x", "filters": {"ticker": "NVDA"}}))
    assert "rag_search takes no argument 'filters'" in unknown and "ticker, section, date_from" in unknown
    assert error_text(await client.call_tool("rag_search", {"query": "x" * 5000}))  # the HTTP limit applies
    assert error_text(await client.call_tool("rag_list", {"collection": "x", "limit": 0}))
    assert error_text(await client.call_tool("rag_embed_text", {"text": "x", "doc_id": "../etc"}))
    assert payload(await client.call_tool("rag_search", {"query": "x' OR 1=1 --", "ticker": "N' OR '1'='1",
                                                         "mode": "semantic"}))["results"] == []
    after = payload(await client.call_tool("rag_status", {"collection": "default"}))
    assert after["documents"] == status["documents"]

    # the library's rerank, metrics and evaluation (seed 004 phases 1, 3 and 7)
    assert status["index_size_mb"] > 0
    reranked = payload(await client.call_tool("rag_search_rerank", {"query": "NVDA competitive position vs AMD",
                                                                     "ticker": "NVDA", "top_k": 5}))
    assert 0 < len(reranked["results"]) <= 5 and all(h["ticker"] == "NVDA" for h in reranked["results"])
    seed_hits(reranked["results"])
    # no reranker is configured here: the tool says so instead of returning the hybrid order as reranked
    assert reranked["reranked"] is False and "search.rerank_model_path" in reranked["rerank_note"]
    assert all(h["rerank_score"] is None for h in reranked["results"])

    metrics = payload(await client.call_tool("rag_metrics_summary", {"days": 7}))
    assert metrics
    judged = payload(await client.call_tool("rag_evaluate", {
        "query": "What drove NVDA's Q4?", "contexts": ["NVIDIA data center revenue rose 400% on AI demand."],
        "answer": "Data center revenue driven by AI demand."}))
    assert judged["context_precision"] == judged["faithfulness"] == 1.0 and judged["context_recall"] is None
    assert judged["answer_relevancy"] == judged["overall_score"] == 1.0  # seed 004's RAGEvalResult names
    assert judged["judge_calls"] == 3


def test_mcp_tools_over_stdio(corpus_db_url: str, tmp_path: Path, chat_stub: ChatStub):
    params = StdioServerParameters(command=RAG, args=["mcp"], env=server_env(corpus_db_url, tmp_path, chat_stub))

    async def run() -> None:
        async with Client(params, read_timeout_seconds=120) as client:
            await exercise_seed_tools(client, chat_stub)

    anyio.run(run)


def test_mcp_read_only_hides_writes(corpus_db_url: str, tmp_path: Path, chat_stub: ChatStub):
    env = server_env(corpus_db_url, tmp_path, chat_stub)
    params = StdioServerParameters(command=RAG, args=["mcp", "--read-only"], env=env)

    async def run() -> None:
        async with Client(params, read_timeout_seconds=60) as client:
            await check_listing(client, TOOLS - WRITE_TOOLS)
            assert error_text(await client.call_tool("rag_embed", {"path": "ok.md"}))
            assert error_text(await client.call_tool("rag_embed_text", {"text": "x", "doc_id": "x"}))

    anyio.run(run)


def test_mcp_tools_over_streamable_http(corpus_db_url: str, tmp_path: Path, chat_stub: ChatStub):
    """`rag mcp --transport http`: no key is refused with 401; a full key runs every tool; a read-only
    key may search but the write tools answer with a tool error."""
    import httpx
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    env = {**server_env(corpus_db_url, tmp_path, chat_stub),
           "RAG_API_KEYS": "mcp-full-1", "RAG_API_READ_ONLY_KEYS": "mcp-read-1"}
    server = start_server(["mcp", "--transport", "http"], env, tmp_path / "mcp.log", health=None)
    url = f"{server.url}/mcp"
    try:
        refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"

        async def run() -> None:
            full = httpx2.AsyncClient(headers={"X-API-Key": "mcp-full-1"}, timeout=120)
            async with full, Client(streamable_http_client(url, http_client=full), read_timeout_seconds=120) as client:
                await exercise_seed_tools(client, chat_stub)
            read = httpx2.AsyncClient(headers={"X-API-Key": "mcp-read-1"}, timeout=60)
            async with read, Client(streamable_http_client(url, http_client=read), read_timeout_seconds=60) as client:
                found = payload(await client.call_tool("rag_search", {"query": "AMD guidance", "mode": "semantic",
                                                                      "top_k": 2}))
                assert len(found["results"]) == 2
                assert "forbidden" in error_text(await client.call_tool("rag_embed", {"path": "ok.md"}))
                assert "forbidden" in error_text(await client.call_tool("rag_embed_text", {"text": "x", "doc_id": "y"}))

        anyio.run(run)
    finally:
        server.stop(timeout=5)  # an idle SSE stream can hold graceful shutdown open: killed after 5 s
