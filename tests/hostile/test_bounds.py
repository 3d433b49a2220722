"""Bounded work per request (issue 29, findings 5, 6 and 13): a graph path search on a complete graph
is refused naming its limit (HTTP, MCP, CLI); a document or request over the chunk limits is refused
with its number before anything is embedded (HTTP) or skipped with the reason (CLI, library); an
upload is parsed once (in the sandbox), not again in the server."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
import pytest
import yaml
from fastapi.testclient import TestClient
from mcp import Client

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.mcp_server import create_mcp
from rag_lib.server import create_app
from rag_lib.server.security import KeyRing

FULL, READ = "bounds-full-key-1", "bounds-read-key-1"
KEYS = {"RAG_API_KEYS": FULL, "RAG_API_READ_ONLY_KEYS": READ}
NODES = 52  # the review's graph: every pair of nodes related, 1,326 edges


def complete_graph(n: int = NODES) -> str:
    relations = [[f"n{i}", "relates_to", f"n{j}"] for i in range(n) for j in range(i + 1, n)]
    return yaml.safe_dump({"_meta": {"type": "research", "id": "complete"}, "summary": "Every node relates.",
                           "_graph": {"relations": relations}}, sort_keys=False)


ISLAND = "_meta: {type: research, id: island}\nsummary: Apart from the rest.\n_graph:\n  relations:\n" \
         "    - [island-a, relates_to, island-b]\n"


def sections_yaml(n: int) -> str:
    """A document of `n` top-level keys of a short sentence each: one chunk per key."""
    lines = ["_meta: {type: research, id: many}"]
    lines += [f"k{i:05d}: \"point {i} about margins, guidance and the stop level\"" for i in range(n)]
    return "\n".join(lines) + "\n"


def settings_for(url: str, home: Path, roots: list[Path] | None = None, **nested: dict) -> Settings:
    # nested dicts (not the new settings classes), so the same test runs against older code too
    return Settings(database_url=url, home=home, server={"corpus_roots": roots or [], "upload_dir": home / "up"},
                    **nested)


@pytest.fixture
def graph_db(database_url: str, tmp_path: Path, provider) -> str:
    root = tmp_path / "graphs"
    root.mkdir()
    (root / "complete.yaml").write_text(complete_graph())
    (root / "island.yaml").write_text(ISLAND)
    with KnowledgeBase(settings_for(database_url, tmp_path / ".rag"), provider=provider) as kb:
        report = kb.ingest([root])
    assert {o.status for o in report.outcomes} == {"new"}
    return database_url


def client_for(settings: Settings, provider) -> tuple[TestClient, KnowledgeBase]:
    kb = KnowledgeBase(settings, provider=provider)
    return TestClient(create_app(settings, kb=kb, keys=KeyRing.from_env(settings, KEYS))), kb


@pytest.mark.timeout(300)
def test_graph_path_on_a_complete_graph_is_bounded_over_http(graph_db: str, tmp_path: Path, provider):
    settings = settings_for(graph_db, tmp_path / ".rag", graph={"max_path_rows": 500})
    client, kb = client_for(settings, provider)
    with client, kb:
        r = client.get("/api/rag/graph/n0", params={"to": "island-a"}, headers={"X-API-Key": READ})
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "limit_exceeded"
        assert "graph.max_path_rows=500" in error["message"]
        # a path the limit allows is still found, and is a chain from n0 to n5
        r = client.get("/api/rag/graph/n0", params={"to": "n5"}, headers={"X-API-Key": READ})
        assert r.status_code == 200, r.text
        edges = r.json()["edges"]
        assert r.json()["found"] and 1 <= len(edges) <= 2
        ends = [k for e in edges for k in (e["src"], e["dst"])]
        assert "n0" in ends and "n5" in ends


@pytest.mark.timeout(300)
def test_graph_query_over_its_time_limit_is_504_naming_the_setting(graph_db: str, tmp_path: Path, provider):
    # 1 ms: a depth-3 walk over 1,326 edges (1,000 rows) cannot finish in it
    settings = settings_for(graph_db, tmp_path / ".rag", graph={"query_timeout_ms": 1})
    client, kb = client_for(settings, provider)
    with client, kb:
        r = client.get("/api/rag/graph/n0", params={"depth": 3}, headers={"X-API-Key": READ})
        assert r.status_code == 504, r.text
        error = r.json()["error"]
        assert error["code"] == "query_timeout"
        assert "graph.query_timeout_ms=1" in error["message"]
        assert client.get("/health").status_code == 200  # the connection went back to the pool usable


@pytest.mark.timeout(300)
def test_graph_path_limit_is_a_tool_error_over_mcp(graph_db: str, tmp_path: Path, provider):
    settings = settings_for(graph_db, tmp_path / ".rag", graph={"max_path_rows": 500})
    kb = KnowledgeBase(settings, provider=provider)

    async def call() -> tuple[bool, str]:
        async with Client(create_mcp(lambda: kb)) as client:
            result = await client.call_tool("rag_graph", {"node": "n0", "to": "island-a"})
            return result.is_error, " ".join(getattr(c, "text", "") for c in result.content)

    with kb:
        is_error, text = anyio.run(call)
    assert is_error, text
    assert "limit_exceeded: " in text and "graph.max_path_rows=500" in text


@pytest.mark.timeout(300)
def test_graph_path_limit_is_one_line_in_the_cli(graph_db: str, tmp_path: Path, monkeypatch, rag):
    monkeypatch.setenv("RAG_DATABASE_URL", graph_db)  # the `rag` fixture's fresh database has no graph
    code, out, err = rag("graph", "n0", "--to", "island-a")
    assert code == 0 and "no path" in out  # the default limit lets this one finish: no path exists
    monkeypatch.setenv("RAG_GRAPH__MAX_PATH_ROWS", "500")
    code, out, err = rag("graph", "n0", "--to", "island-a")
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "graph.max_path_rows=500" in err
