"""Hostile tool calls against `rag mcp` through the official MCP client, over stdio and streamable HTTP
(issue 15): HTTP's limits apply to tool inputs, bad input is a tool error with a stable code, parser
bombs never take the server down, and loopback mode refuses DNS-rebinding Host/Origin headers."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters

from testkit import RAG, child_env, error_text, payload, start_server

pytestmark = pytest.mark.subprocess

GOOD = "# Good\n\n## Thesis\n\nZirconium refiners gain from the new reactor build-out.\n"


def env_for(db_url: str, tmp_path: Path) -> dict[str, str]:
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    (root / "good.md").write_text(GOOD)
    return child_env(db_url, tmp_path / ".rag", RAG_SERVER__CORPUS_ROOTS=json.dumps([str(root)]))


async def hostile_calls(client: Client, tmp_path: Path) -> None:
    """The same cases over any transport."""
    assert payload(await client.call_tool("rag_embed", {"path": "good.md"}))["new"] == 1
    before = payload(await client.call_tool("rag_status", {}))
    too_big = [
        ("rag_list", {"offset": 10**30}), ("rag_list", {"limit": 10**30}),
        ("rag_status", {"offset": 10**30}), ("rag_search", {"query": "x", "top_k": 10**30}),
        ("rag_search", {"query": "x", "section": "s" * 300}),
        ("rag_search", {"query": "x", "ticker": [f"T{n}" for n in range(51)]}),
        ("rag_search", {"query": "x", "ticker": ["t" * 201]}), ("rag_search", {"query": "x", "doc_type": ""}),
        ("rag_search", {"query": "q" * 4001}), ("rag_similar", {"ref": "r" * 513}),
        ("rag_context", {"query": "x", "token_budget": 10**30}), ("rag_list", {"collection": "c" * 201}),
    ]
    for tool, args in too_big:  # validation errors, not crashes
        text = error_text(await client.call_tool(tool, args))
        assert "validation" in text.lower() or "invalid" in text.lower(), (tool, args, text)
    # one line per argument, as the HTTP API says it, not pydantic's report with its model name and link
    text = error_text(await client.call_tool("rag_search", {"query": "x", "top_k": 0}))
    assert "invalid_input: top_k: Input should be greater than or equal to 1" in text and "pydantic" not in text, text
    # the ticker a stored text may carry is the HTTP API's (it was accepted here and silently dropped)
    text = error_text(await client.call_tool("rag_embed_text", {"text": "x", "doc_id": "t1", "ticker": "123"}))
    assert "invalid_input: ticker: String should match pattern" in text, text
    for tool, args in (("rag_search", {"query": "nvda\x00"}), ("rag_search", {"query": "x", "collection": "a\x00"}),
                       ("rag_search", {"query": "x", "ticker": ["NV\x00DA"]}), ("rag_similar", {"ref": "good.md\x00"}),
                       ("rag_embed", {"name": "n.md", "content": "# N\n\n## A\n\nnul\x00\n"})):
        assert "invalid_character" in error_text(await client.call_tool(tool, args)), (tool, args)
    for name, content in (("bombs/nest.yaml", "deep: " + "[" * 50_000 + "]" * 50_000 + "\n"),
                          ("bombs/alias.yaml", "\n".join(
                              ['a: &a ["l","l","l","l","l","l","l","l","l"]'] +
                              [f"{c}: &{c} [{','.join(['*' + p] * 9)}]" for p, c in zip("abcdef", "bcdefg")]) + "\n")):
        result = await client.call_tool("rag_embed", {"name": name, "content": content})
        if result.is_error:
            assert "document_rejected" in error_text(result)
        else:
            out = payload(result)
            assert out["new"] == out["changed"] == 0 and out["skipped"] + out["failed"] >= 1
    for name in (".", "..", "a/./b.md", "x" * 256 + ".md"):
        text = error_text(await client.call_tool("rag_embed", {"name": name, "content": "# T\n"}))
        assert "path_not_allowed" in text or "invalid_input" in text, (name, text)
    assert "document_conflict" in error_text(await client.call_tool(
        "rag_embed", {"name": "good.md", "content": "# Impostor\n\n## A\n\nreplaced\n"}))
    for text in (error_text(await client.call_tool("rag_embed", {"path": "missing/none.md"})),
                 json.dumps(payload(await client.call_tool("rag_status", {})))):
        assert str(tmp_path) not in text
    hits = payload(await client.call_tool("rag_search", {"query": "zirconium reactor build-out", "mode": "lexical",
                                                         "top_k": 2}))["results"]
    assert hits and hits[0]["path"] == "good.md"
    after = payload(await client.call_tool("rag_status", {"limit": 1}))
    assert (after["documents"], after["chunks"]) == (before["documents"], before["chunks"])
    assert len(after["skipped"]) <= 1 and after["skipped_total"] >= len(after["skipped"])


@pytest.mark.timeout(600)
def test_mcp_stdio_hostile_inputs(database_url: str, tmp_path: Path):
    params = StdioServerParameters(command=RAG, args=["mcp"], env=env_for(database_url, tmp_path))

    async def run() -> None:
        async with Client(params, read_timeout_seconds=180) as client:
            await hostile_calls(client, tmp_path)

    anyio.run(run)


@pytest.mark.timeout(600)
def test_mcp_http_loopback_refuses_rebinding_and_survives_hostile_calls(database_url: str, tmp_path: Path):
    """`rag mcp --transport http` on 127.0.0.2 without keys: a foreign Host or Origin is refused (the
    SDK's default would protect only 127.0.0.1/localhost/::1), the real client works."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    host = "127.0.0.2"
    server = start_server(["mcp", "--transport", "http"], env_for(database_url, tmp_path), tmp_path / "mcp.log",
                          host=host, health=None)
    port, proc = server.url.rsplit(":", 1)[1], server.proc
    url = f"{server.url}/mcp"
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    try:
        for bad_host in ("evil.example", f"evil.example:{port}", f"127.0.0.2.nip.io:{port}"):
            r = httpx.post(url, json=init, headers={**accept, "Host": bad_host}, timeout=30)
            assert r.status_code == 421, (bad_host, r.status_code, r.text)
        for origin in ("http://evil.example", f"http://evil.example:{port}", "null"):
            r = httpx.post(url, json=init, headers={**accept, "Origin": origin}, timeout=30)
            assert r.status_code == 403, (origin, r.status_code)
        ok = httpx.post(url, json=init, headers={**accept, "Origin": f"http://{host}:{port}"}, timeout=60)
        assert ok.status_code == 200, ok.text

        async def run() -> None:
            http = httpx2.AsyncClient(timeout=180)
            async with http, Client(streamable_http_client(url, http_client=http), read_timeout_seconds=180) as client:
                await hostile_calls(client, tmp_path)

        anyio.run(run)
        assert proc.poll() is None
    finally:
        server.stop(timeout=5)
