"""The API as deployed: `rag serve` in its own process on 127.0.0.1 (random free port), talking to
a database that already holds the shared corpus."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from testkit import RAG, child_env, free_port, start_server

pytestmark = pytest.mark.subprocess

FULL = "proc-full-key-0b1c"
READ = "proc-read-key-9d2e"


@pytest.fixture
def server(corpus_db_url: str, tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    env = child_env(corpus_db_url, tmp_path / ".rag", RAG_API_KEYS=FULL, RAG_API_READ_ONLY_KEYS=READ,
                    RAG_SERVER__CORPUS_ROOTS=json.dumps([str(root)]), RAG_SERVER__MAX_BODY_BYTES="32768")
    proc = start_server(["serve"], env, tmp_path / "server.log")
    yield {"url": proc.url, "root": root, "log": proc.log_path}
    proc.stop()


def test_real_server_end_to_end(server):
    url = server["url"]
    with httpx.Client(base_url=url, timeout=30, headers={"X-API-Key": FULL}) as c:
        assert c.get("/health").json() == {"status": "ok", "database": True, "model": True}
        assert c.post("/api/rag/search", json={"query": "earnings"}, headers={"X-API-Key": "bad"}).status_code == 401
        assert c.post("/api/rag/search", json={"query": "earnings"}, headers={"X-API-Key": ""}).status_code == 401
        r = c.post("/api/rag/search", json={"query": "semiconductor supply chain risk", "top_k": 3},
                   headers={"X-API-Key": READ})
        assert r.status_code == 200 and len(r.json()["results"]) == 3 and r.headers["x-request-id"]
        ro = c.post("/api/rag/embed", json={"name": "n.md", "content": "# n\n\n## a\n\nb\n"}, headers={"X-API-Key": READ})
        assert ro.status_code == 403
        assert c.post("/api/rag/embed", json={"path": "../../etc/passwd"}).status_code == 403
        big = c.post("/api/rag/embed", json={"name": "big.md", "content": "y" * 40_000})
        assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"

        # many clients at once: all served, none blocked behind another
        queries = [f"{w} outlook and guidance" for w in ("NVDA", "AMD", "MSFT", "NFLX", "momentum", "risk",
                                                          "earnings", "options", "sector", "bias", "capex", "gap")]

        def one(q: str) -> int:
            return c.post("/api/rag/search", json={"query": q, "top_k": 5}).status_code

        with ThreadPoolExecutor(12) as pool:
            assert list(pool.map(one, queries * 2)) == [200] * 24

        note = "# Desk note\n\n## Thesis\n\nOrbital tungsten miners rally on the new export quota.\n"
        made = c.post("/api/rag/embed", json={"name": "desk/note.md", "content": note}).json()
        assert made["new"] == 1
        assert c.get("/api/rag/sources/desk/note.md").json()["chunk_count"] >= 1
        assert c.delete("/api/rag/sources/desk/note.md").json()["deleted"] == ["desk/note.md"]
        assert c.get("/api/rag/sources/desk/note.md").status_code == 404
    logs = [json.loads(line) for line in server["log"].read_text().splitlines() if line.startswith("{")]
    access = [line for line in logs if line.get("msg") == "request"]
    assert len(access) >= 30 and all(line.get("request_id") for line in access)
    raw = server["log"].read_text()
    assert FULL not in raw and READ not in raw and "tungsten" not in raw


def test_refuses_public_bind_without_keys(tmp_path: Path):
    env = child_env("postgresql://nobody@127.0.0.1:1/none", tmp_path / ".rag")
    done = subprocess.run([RAG, "serve", "--host", "0.0.0.0", "--port", str(free_port())], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "refusing to listen on 0.0.0.0 without API keys" in done.stderr
