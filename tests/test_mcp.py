"""The MCP server through the SDK's own client over stdio (`rag mcp` as a subprocess), against a
database holding the shared corpus: list tools, call each one, and the error paths."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
from mcp import Client, StdioServerParameters


RAG = str(Path(sys.executable).with_name("rag"))
NVDA = "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml"
TOOLS = {"rag_search", "rag_similar", "rag_context", "rag_embed", "rag_status", "rag_list", "rag_hybrid_context", "rag_graph"}


def params(db_url: str, tmp_path: Path, *extra: str) -> StdioServerParameters:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    (root / "ok.md").write_text("# Ok\n\n## Body\n\nQuartz futures spread widened after the storage report.\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(RAG_DATABASE_URL=db_url, RAG_HOME=str(tmp_path / ".rag"), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", RAG_SERVER__CORPUS_ROOTS=json.dumps([str(root)]))
    return StdioServerParameters(command=RAG, args=["mcp", *extra], env=env)


def payload(result) -> dict:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    assert result.is_error
    return " ".join(getattr(c, "text", "") for c in result.content)


def test_mcp_tools_over_stdio(corpus_db_url: str, tmp_path: Path):
    async def run() -> None:
        async with Client(params(corpus_db_url, tmp_path), read_timeout_seconds=120) as client:
            listed = (await client.list_tools()).tools
            by_name = {t.name: t for t in listed}
            assert set(by_name) == TOOLS
            for tool in listed:
                assert len(tool.description or "") > 60, tool.name
                assert tool.input_schema["type"] == "object"
                for name, prop in tool.input_schema.get("properties", {}).items():
                    assert prop.get("description"), (tool.name, name)
            assert by_name["rag_search"].input_schema["required"] == ["query"]
            assert "ctx" not in by_name["rag_embed"].input_schema["properties"]

            found = payload(await client.call_tool("rag_search", {"query": "NVDA earnings guidance", "top_k": 4,
                                                                  "ticker": "NVDA", "mode": "semantic"}))
            assert len(found["results"]) == 4 and all(h["ticker"] == "NVDA" for h in found["results"])
            assert found["results"][0]["unit_id"].startswith(found["results"][0]["path"] + "#")

            status = payload(await client.call_tool("rag_status", {"collection": "default"}))
            assert status["documents"] > 50
            page = payload(await client.call_tool("rag_list", {"limit": 3}))
            assert len(page["items"]) == 3 and page["next_offset"] == 3

            made = payload(await client.call_tool("rag_embed", {"path": "ok.md", "collection": "mcp"}))
            assert made["new"] == 1 and made["collection"] == "mcp"
            up = payload(await client.call_tool("rag_embed", {"name": "n/up.md", "collection": "mcp",
                                                              "content": "# Up\n\n## A\n\nUploaded by an agent.\n"}))
            assert up["new"] == 1
            assert payload(await client.call_tool("rag_list", {"collection": "mcp"}))["items"][0]["path"] == "n/up.md"

            sim = payload(await client.call_tool("rag_similar", {"ref": NVDA, "top_k": 3}))
            assert sim["results"] and NVDA not in [h["path"] for h in sim["results"]]
            ctx = payload(await client.call_tool("rag_context", {"query": "NVDA earnings risks", "token_budget": 300}))
            assert ctx["context"] and ctx["citations"] and ctx["tokens"] <= 300
            assert "not_found" in error_text(await client.call_tool("rag_similar", {"ref": "no/such.yaml"}))

            # errors come back as tool errors and the server keeps serving
            assert "path_not_allowed" in error_text(await client.call_tool("rag_embed", {"path": "../../etc/passwd"}))
            assert "invalid_input" in error_text(await client.call_tool("rag_embed", {"name": "x.md"}))
            assert error_text(await client.call_tool("rag_search", {"query": ""}))
            assert error_text(await client.call_tool("rag_search", {"query": "x", "mode": "telepathic"}))
            assert error_text(await client.call_tool("rag_search", {"query": "x", "top_k": 500}))
            assert error_text(await client.call_tool("rag_list", {"collection": "x", "limit": 0}))
            assert payload(await client.call_tool("rag_search", {"query": "x' OR 1=1 --", "ticker": "N' OR '1'='1",
                                                                 "mode": "semantic"}))["results"] == []
            assert payload(await client.call_tool("rag_status", {"collection": "default"}))["documents"] == status["documents"]

    anyio.run(run)


def test_mcp_read_only_hides_embed(corpus_db_url: str, tmp_path: Path):
    async def run() -> None:
        async with Client(params(corpus_db_url, tmp_path, "--read-only"), read_timeout_seconds=60) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == TOOLS - {"rag_embed"}
            assert error_text(await client.call_tool("rag_embed", {"path": "ok.md"}))

    anyio.run(run)


def test_mcp_streamable_http_needs_keys(corpus_db_url: str, tmp_path: Path):
    """`rag mcp --transport http`: no key is refused with 401; a read-only key may search but
    `rag_embed` answers with a tool error."""
    import socket
    import subprocess
    import time

    import httpx
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = params(corpus_db_url, tmp_path)
    env = {**p.env, "RAG_API_KEYS": "mcp-full-1", "RAG_API_READ_ONLY_KEYS": "mcp-read-1"}
    proc = subprocess.Popen([RAG, "mcp", "--transport", "http", "--port", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 240  # model import + load is slow on a busy 2-core box
        while True:
            try:
                refused = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"}, timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, "MCP HTTP server did not start"
                time.sleep(0.3)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"

        async def run() -> None:
            http = httpx2.AsyncClient(headers={"X-API-Key": "mcp-read-1"}, timeout=60)
            async with http, Client(streamable_http_client(url, http_client=http), read_timeout_seconds=60) as client:
                found = payload(await client.call_tool("rag_search", {"query": "AMD guidance", "mode": "semantic",
                                                                      "top_k": 2}))
                assert len(found["results"]) == 2
                denied = error_text(await client.call_tool("rag_embed", {"path": "ok.md"}))
                assert "forbidden" in denied

        anyio.run(run)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # an idle SSE stream can hold graceful shutdown open
            proc.kill()
            proc.wait()
