"""HTTP API through FastAPI's TestClient over a real database holding the shared corpus: every
endpoint, auth and scopes, path confinement, size limits, hostile filters, deletes, logs."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from rag_lib.api import KnowledgeBase
from rag_lib.config import ServerSettings, Settings
from rag_lib.errors import ConfigError
from rag_lib.server import create_app
from rag_lib.log import JsonFormatter
from rag_lib.server.security import KeyRing, check_bind
from conftest import SHARED_CORPUS

FULL = "full-key-7f3a9c1e"
READ = "read-key-52b8d0aa"
NVDA = "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml"
KEYS = {"RAG_API_KEYS": FULL, "RAG_API_READ_ONLY_KEYS": READ}


@pytest.fixture
def roots(tmp_path: Path) -> dict[str, Path]:
    corpus = tmp_path / "root"
    (corpus / "api").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    return {"corpus": corpus, "outside": outside, "uploads": tmp_path / "uploads"}


@pytest.fixture
def api_settings(corpus_db_url: str, tmp_path: Path, roots) -> Settings:
    return Settings(
        database_url=corpus_db_url, home=tmp_path / ".rag",
        server=ServerSettings(corpus_roots=[roots["corpus"]], upload_dir=roots["uploads"], max_body_bytes=64 * 1024),
    )


@pytest.fixture
def client(api_settings: Settings, provider) -> TestClient:
    kb = KnowledgeBase(api_settings, provider=provider)
    app = create_app(api_settings, kb=kb, keys=KeyRing.from_env(api_settings, KEYS))
    with TestClient(app, headers={"X-API-Key": FULL}) as c:
        yield c
    kb.close()


def rows_for(url: str, path: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {
            "documents": conn.execute("SELECT count(*) FROM rag_documents WHERE path = %s", (path,)).fetchone()[0],
            "sections": conn.execute("SELECT count(*) FROM rag_sections WHERE path = %s", (path,)).fetchone()[0],
            "chunks": conn.execute("SELECT count(*) FROM rag_chunks WHERE path = %s", (path,)).fetchone()[0],
            "vectors": conn.execute(
                "SELECT count(*) FROM rag_chunk_vectors v JOIN rag_chunks c USING (chunk_id) WHERE c.path = %s",
                (path,)).fetchone()[0],
            "all_chunks": conn.execute("SELECT count(*) FROM rag_chunks").fetchone()[0],
            "all_vectors": conn.execute("SELECT count(*) FROM rag_chunk_vectors").fetchone()[0],
        }


def test_health_status_and_openapi(client: TestClient):
    health = client.get("/health", headers={"X-API-Key": ""})  # health needs no key
    assert health.status_code == 200 and health.json() == {"status": "ok", "database": True, "model": True}
    status = client.get("/api/rag/status").json()
    assert status["documents"] > 50 and status["chunks"] > 1000
    assert status["active_space"]["space"] == "all-MiniLM-L6-v2:384"
    # the docs pages load their scripts from this server, not a CDN (the machine may be offline)
    for page in ("/docs", "/redoc"):
        html = client.get(page, headers={"X-API-Key": ""}).text
        assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
        assert assets and all(a.startswith("/") for a in assets), (page, assets)
        assert all(client.get(a, headers={"X-API-Key": ""}).status_code == 200 for a in assets)
    spec = client.get("/openapi.json").json()
    expected = {"/health", "/api/rag/search", "/api/rag/context", "/api/rag/embed", "/api/rag/embed-text",
                "/api/rag/status", "/api/rag/sources", "/api/rag/sources/{ref}"}
    assert expected <= set(spec["paths"])
    schemas = spec["components"]["schemas"]
    assert schemas["SearchRequest"]["examples"] and schemas["EmbedRequest"]["examples"]
    assert schemas["SearchFiltersIn"]["additionalProperties"] is False
    for path, ops in spec["paths"].items():
        for op in ops.values():
            assert op.get("description") or op.get("summary"), path
            assert "200" in op["responses"], path


def test_search_returns_scored_units_with_filters(client: TestClient):
    r = client.post("/api/rag/search", json={
        "query": "NVDA data center revenue and earnings expectations", "mode": "semantic", "top_k": 5,
        "filters": {"ticker": "NVDA"},
    }, headers={"X-Request-ID": "req-abc-1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert r.headers["x-request-id"] == "req-abc-1" and body["request_id"] == "req-abc-1"
    assert len(body["results"]) == 5 and body["mode"] == "semantic"
    assert all(h["ticker"] == "NVDA" for h in body["results"])
    scores = [h["score"] for h in body["results"]]
    assert scores == sorted(scores, reverse=True) and 0 < scores[-1] <= 1
    first = body["results"][0]
    assert first["unit_id"] == f"{first['path']}#{first['section']}" and first["excerpt"] and first["text"]
    assert body["timings_ms"]["total"] > 0
    # the default mode is the best the library offers
    assert client.post("/api/rag/search", json={"query": "momentum"}).json()["mode"] in ("hybrid", "semantic")
    # nothing found because the collection holds nothing: the response says which collections do
    empty = client.post("/api/rag/search", json={"query": "momentum", "collection": "nope"}).json()
    assert empty["results"] == [] and empty["note"].startswith("collection 'nope' holds no documents; these do: ")
    typo = client.post("/api/rag/search", json={"query": "momentum", "filters": {"ticker": "NVDX"}}).json()
    assert typo["results"] == [] and "no document with ticker NVDX (did you mean NVDA?)" in typo["note"]
    assert "note" not in body or body["note"] is None
    # `section` as seed 000 and `rag search --section` read it: any section path containing it, any case
    risks = client.post("/api/rag/search", json={"query": "what could go wrong", "ticker": "NVDA",
                                                 "section": "Risk"}).json()["results"]
    assert risks and all("risk" in h["section_path"].lower() and h["ticker"] == "NVDA" for h in risks)


def test_metrics_summary_counts_the_searches_it_served(client: TestClient):
    def summary() -> dict:
        r = client.get("/api/rag/metrics", params={"days": 1}, headers={"X-API-Key": READ})  # read-only is enough
        assert r.status_code == 200, r.text
        return r.json()

    before = summary()
    found = client.post("/api/rag/search", json={"query": "NVDA guidance", "mode": "lexical", "top_k": 3}).json()
    assert found["count"] > 0
    empty = client.post("/api/rag/search", json={"query": "NVDA guidance", "mode": "lexical",
                                                  "filters": {"ticker": "ZZZZ"}}).json()
    assert empty["count"] == 0
    after = summary()
    assert after["searches"] == before["searches"] + 2
    lexical_before = before["by_mode"].get("lexical", {}).get("searches", 0)
    assert after["by_mode"]["lexical"]["searches"] == lexical_before + 2
    assert after["by_mode"]["lexical"]["p95_ms"] >= after["by_mode"]["lexical"]["p50_ms"] > 0
    zero = lambda m: round(m["zero_result_rate"] * m["searches"])  # noqa: E731
    assert zero(after) == zero(before) + 1
    assert set(after["embedding"]) >= {"calls", "failure_rate", "fallback_share", "p95_ms"}
    assert client.get("/api/rag/metrics", params={"days": 0}).status_code == 422
    assert client.get("/api/rag/metrics", headers={"X-API-Key": "wrong"}).status_code == 401


def test_keys_required_and_compared(client: TestClient):
    body = {"query": "earnings"}
    missing = client.post("/api/rag/search", json=body, headers={"X-API-Key": ""})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = client.post("/api/rag/search", json=body, headers={"X-API-Key": FULL + "x"})
    assert wrong.status_code == 401
    assert client.get("/api/rag/sources", headers={"X-API-Key": "", "Authorization": "Bearer nope"}).status_code == 401
    bearer = client.post("/api/rag/search", json=body, headers={"X-API-Key": "", "Authorization": f"Bearer {READ}"})
    assert bearer.status_code == 200


def test_read_only_key_cannot_write(client: TestClient, roots, corpus_db_url: str):
    ro = {"X-API-Key": READ}
    assert client.post("/api/rag/search", json={"query": "risk"}, headers=ro).status_code == 200
    assert client.post("/api/rag/embed-text", json={"text": "risk"}, headers=ro).status_code == 403  # issue 15
    embed = client.post("/api/rag/embed", json={"name": "notes/x.md", "content": "# X\n\n## A\n\ntext\n"}, headers=ro)
    assert embed.status_code == 403 and embed.json()["error"]["code"] == "forbidden"
    delete = client.delete(f"/api/rag/sources/{NVDA}", headers=ro)
    assert delete.status_code == 403
    assert rows_for(corpus_db_url, NVDA)["documents"] == 1
    assert not roots["uploads"].exists()


def test_paths_confined_to_corpus_roots(client: TestClient, roots, corpus_db_url: str):
    secret = roots["outside"] / "secret.md"
    secret.write_text("# Secret\n\n## Keys\n\nthe launch codes\n")
    (roots["corpus"] / "api" / "link.md").symlink_to(secret)
    (roots["corpus"] / "api" / "linkdir").symlink_to(roots["outside"], target_is_directory=True)
    before = client.get("/api/rag/status").json()["documents"]
    attempts = ["../outside/secret.md", "api/../../outside/secret.md", str(secret), "api/link.md",
                "api/linkdir/secret.md", str(roots["corpus"] / "api" / "link.md"), "/etc/passwd"]
    for path in attempts:
        r = client.post("/api/rag/embed", json={"path": path})
        assert r.status_code == 403, (path, r.text)
        assert r.json()["error"]["code"] == "path_not_allowed"
    for name in ["../escape.md", "/abs.md", "a/../../b.md", "..\\win.md"]:
        r = client.post("/api/rag/embed", json={"name": name, "content": "# t\n\n## a\n\nb\n"})
        assert r.status_code == 403, (name, r.text)
    (roots["uploads"] / "default").mkdir(parents=True)
    (roots["uploads"] / "default" / "out").symlink_to(roots["outside"], target_is_directory=True)
    r = client.post("/api/rag/embed", json={"name": "out/new.md", "content": "# t\n\n## a\n\nb\n"})
    assert r.status_code == 422 and not (roots["outside"] / "new.md").exists()
    assert client.get("/api/rag/status").json()["documents"] == before


def test_embed_file_by_path_then_show_and_delete_all_rows(client: TestClient, roots, corpus_db_url: str):
    src = SHARED_CORPUS / NVDA
    (roots["corpus"] / "api" / "nvda.yaml").write_bytes(src.read_bytes())
    r = client.post("/api/rag/embed", json={"path": "api/nvda.yaml"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["new"] == 1 and body["failed"] == 0 and body["chunks"] > 3
    assert body["texts_embedded"] == 0 and body["chunks_from_cache"] == body["chunks"]  # same text: the cache pays
    again = client.post("/api/rag/embed", json={"path": str(roots["corpus"] / "api" / "nvda.yaml")}).json()
    assert again["unchanged"] == 1
    doc = client.get("/api/rag/sources/api/nvda.yaml").json()
    assert doc["path"] == "api/nvda.yaml" and len(doc["chunks"]) == body["chunks"] and doc["sections"]
    before = rows_for(corpus_db_url, "api/nvda.yaml")
    assert before["chunks"] == body["chunks"] == before["vectors"]
    r = client.delete("/api/rag/sources/api/nvda.yaml")
    assert r.status_code == 200 and r.json()["deleted"] == ["api/nvda.yaml"]
    after = rows_for(corpus_db_url, "api/nvda.yaml")
    assert after["documents"] == after["sections"] == after["chunks"] == after["vectors"] == 0
    assert after["all_chunks"] == before["all_chunks"] - before["chunks"]
    assert after["all_vectors"] == before["all_vectors"] - before["vectors"]
    gone = client.get("/api/rag/sources/api/nvda.yaml")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert client.delete("/api/rag/sources/api/nvda.yaml").status_code == 404


def test_embed_uploaded_content(client: TestClient, roots):
    note = "# Fed minutes\n\n## Rates\n\nThe committee held rates at 4.5% and flagged sticky services inflation.\n"
    r = client.post("/api/rag/embed", json={"name": "notes/fed-minutes.md", "content": note, "collection": "uploads"})
    assert r.status_code == 200, r.text
    assert r.json()["new"] == 1 and r.json()["collection"] == "uploads"
    assert (roots["uploads"] / "uploads" / "notes" / "fed-minutes.md").read_text() == note
    hits = client.post("/api/rag/search", json={"query": "fed held rates sticky inflation", "mode": "semantic",
                                                "collection": "uploads"}).json()["results"]
    assert hits and hits[0]["unit_id"] == "notes/fed-minutes.md#Rates"
    both = client.post("/api/rag/embed", json={"name": "a.md", "content": "x", "path": "a.md"})
    assert both.status_code == 422 and both.json()["error"]["code"] == "invalid_input"


def test_embed_text_vector(client: TestClient):
    r = client.post("/api/rag/embed-text", json={"text": "semiconductor export controls"})
    assert r.status_code == 200
    body = r.json()
    assert body["dimensions"] == 384 == len(body["vector"]) and body["space"] == "all-MiniLM-L6-v2:384"
    assert abs(sum(x * x for x in body["vector"]) - 1.0) < 1e-3


def test_sources_paging_and_show(client: TestClient):
    first = client.get("/api/rag/sources", params={"limit": 5}).json()
    second = client.get("/api/rag/sources", params={"limit": 5, "offset": 5}).json()
    assert len(first["items"]) == 5 and first["next_offset"] == 5
    assert not {i["path"] for i in first["items"]} & {i["path"] for i in second["items"]}
    detail = client.get(f"/api/rag/sources/{NVDA}").json()
    assert detail["ticker"] == "NVDA" and detail["chunk_count"] == len(detail["chunks"])
    assert client.get("/api/rag/sources", params={"limit": 5000}).status_code == 422


def test_hostile_filters_are_harmless(client: TestClient, corpus_db_url: str):
    before = rows_for(corpus_db_url, NVDA)
    hostile = [
        {"ticker": "NVDA' OR '1'='1"},
        {"doc_type": ["x'); DROP TABLE rag_chunks; --", "earnings-analysis\" OR 1=1"]},
        {"section": "phase1' UNION SELECT text FROM rag_chunks --"},
        {"path": "%' OR 1=1 --"},
        {"ticker": ["NVDA", "\\'; DELETE FROM rag_documents; --"]},
    ]
    for filters in hostile:
        r = client.post("/api/rag/search", json={"query": "earnings", "mode": "semantic", "filters": filters})
        assert r.status_code == 200, (filters, r.text)
        hits = r.json()["results"]
        if "ticker" in filters and isinstance(filters["ticker"], list):
            assert hits and all(h["ticker"] == "NVDA" for h in hits)  # only the honest value matched
        else:
            assert hits == [], filters
    prefix = "tradegent/knowledge/analysis/earnings/"
    honest = client.post("/api/rag/search", json={"query": "earnings", "mode": "semantic", "filters": {"path": prefix}})
    assert honest.status_code == 200 and honest.json()["results"]
    assert all(h["path"].startswith(prefix) for h in honest.json()["results"])
    unknown = client.post("/api/rag/search", json={"query": "x", "filters": {"embedding": "1; DROP TABLE x"}})
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "invalid_input"
    extra = client.post("/api/rag/search", json={"query": "x", "order_by": "text; --"})
    assert extra.status_code == 422
    assert rows_for(corpus_db_url, NVDA) == before


def test_search_without_top_k_returns_the_configured_number(client: TestClient, api_settings: Settings):
    assert client.post("/api/rag/search", json={"query": "NVDA thesis"}).json()["count"] == 10
    api_settings.search.top_k = 3
    assert client.post("/api/rag/search", json={"query": "NVDA thesis"}).json()["count"] == 3
    assert client.post("/api/rag/search", json={"query": "NVDA thesis", "top_k": 5}).json()["count"] == 5


def test_limits_413_and_422(client: TestClient):
    big = client.post("/api/rag/embed", json={"name": "big.md", "content": "x" * 70_000})
    assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"

    def chunks():  # no Content-Length: the limit applies while the body streams in
        for _ in range(20):
            yield b"x" * 8192

    streamed = client.post("/api/rag/search", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    long_query = client.post("/api/rag/search", json={"query": "q" * 2500})
    assert long_query.status_code == 422 and "2000" in long_query.json()["error"]["message"]
    top = client.post("/api/rag/search", json={"query": "q", "top_k": 500})
    assert top.status_code == 422 and top.json()["error"]["code"] == "invalid_input"
    reversed_range = client.post("/api/rag/search", json={"query": "q", "filters": {
        "date_from": "2026-01-01", "date_to": "2025-01-01"}})
    assert reversed_range.status_code == 422 and reversed_range.json()["error"]["code"] == "invalid_input"
    assert "date_from 2026-01-01 is after date_to 2025-01-01" in reversed_range.json()["error"]["message"]
    broken = client.post("/api/rag/search", content=b"{not json", headers={"Content-Type": "application/json"})
    assert broken.status_code == 422
    # the message says the body is not JSON and where, not "1: JSON decode error"
    assert broken.json()["error"]["message"].startswith("request body is not valid JSON (")
    assert "at character 1)" in broken.json()["error"]["message"]
    # `curl -d '{...}'` sends the JSON as form data: the message says what to send
    form = client.post("/api/rag/search", content=b'{"query": "NVDA thesis"}',
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 422
    assert form.json()["error"]["message"] == ("request body must be a JSON object sent with Content-Type: "
                                               "application/json (this request says application/x-www-form-urlencoded)")


def test_logs_are_json_with_request_id_and_no_secrets(client: TestClient):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("rag_lib")
    server_logger = logging.getLogger("rag_lib.server")
    old_level = server_logger.level
    logger.addHandler(handler)
    server_logger.setLevel(logging.INFO)
    secret_text = "zebra-unicorn-confidential-thesis"
    try:
        client.post("/api/rag/embed", json={"name": "notes/secret.md", "content": f"# S\n\n## A\n\n{secret_text}\n"},
                    headers={"X-Request-ID": "log-test-1"})
        client.post("/api/rag/search", json={"query": secret_text}, headers={"Authorization": f"Bearer {READ}"})
        client.post("/api/rag/search", json={"query": "x"}, headers={"X-API-Key": "wrong-" + FULL})
    finally:
        logger.removeHandler(handler)
        server_logger.setLevel(old_level)
    text = stream.getvalue()
    lines = [json.loads(line) for line in text.splitlines()]
    assert any(line.get("request_id") == "log-test-1" and line.get("status") == 200 for line in lines)
    assert {line.get("status") for line in lines if line["msg"] == "request"} >= {200, 401}
    assert FULL not in text and READ not in text and secret_text not in text


def test_context_and_similar(client: TestClient):
    ctx = client.post("/api/rag/context", json={"query": "What are the risks to the NVDA earnings thesis?",
                                                "token_budget": 400, "filters": {"ticker": "NVDA"}})
    assert ctx.status_code == 200, ctx.text
    body = ctx.json()
    assert body["context"] and body["citations"] and body["token_budget"] == 400
    assert 0 < body["tokens"] <= 400
    for c in body["citations"]:
        assert c["ref"] in body["context"] and c["unit_id"].startswith(c["path"] + "#")
        assert c["ticker"] == "NVDA"
    over = client.post("/api/rag/context", json={"query": "x", "token_budget": 50_000})
    assert over.status_code == 422  # above settings.server.max_token_budget
    sim = client.post("/api/rag/similar", json={"ref": NVDA, "top_k": 5})
    assert sim.status_code == 200, sim.text
    paths = [h["path"] for h in sim.json()["results"]]
    assert 0 < len(paths) <= 5 and NVDA not in paths and len(set(paths)) == len(paths)
    missing = client.post("/api/rag/similar", json={"ref": "no/such/doc.yaml"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_bind_policy(monkeypatch):
    settings = Settings()
    none = KeyRing.from_env(settings, {})
    with pytest.raises(ConfigError, match="refusing"):
        check_bind("0.0.0.0", none)
    with pytest.raises(ConfigError):
        check_bind("192.168.1.10", none)
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        check_bind(host, none)
    check_bind("0.0.0.0", KeyRing.from_env(settings, {"RAG_API_KEYS": "k1, k2"}))
    ring = KeyRing.from_env(settings, {"RAG_API_KEYS": "k1, k2", "RAG_API_READ_ONLY_KEYS": "r1"})
    assert [ring.scope_of(k) for k in ("k1", "k2", "r1", "k", "", None)] == ["write", "write", "read", None, None, None]
    # keys come only from the environment mapping given (the process's by default), never from settings files
    monkeypatch.setenv("RAG_API_KEYS", "from-process-env")
    assert not KeyRing.from_env(settings, {}).enabled
    assert KeyRing.from_env(settings).scope_of("from-process-env") == "write"


# ---- the seeds' HTTP shapes (000: /api/rag/*, 003: /rag/*), called with their own example payloads ----

SEED_NVDA = "trading/knowledge/analysis/earnings/NVDA_20260219T0900.yaml"


def test_seed000_embed_search_status_delete(client: TestClient, roots, corpus_db_url: str):
    target = roots["corpus"] / SEED_NVDA
    target.parent.mkdir(parents=True)
    # its own id: the corpus copy keeps EA-NVDA-Q4-2024, and a delete by an id two documents carry is
    # refused (409 ambiguous_reference), not applied to both
    target.write_bytes((SHARED_CORPUS / NVDA).read_bytes().replace(b"EA-NVDA-Q4-2024", b"EA-NVDA-Q4-2026"))
    r = client.post("/api/rag/embed", json={
        "file_path": "trading/knowledge/analysis/earnings/NVDA_20260219T0900.yaml",
        "force": False,
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "embedded" and body["new"] == 1 and body["chunks"] > 3
    assert body["doc_id"] and body["content_hash"] and body["tokens_processed"] > 100
    # seed 001's EmbedResult names
    assert (body["chunk_count"], body["embed_model"], body["error_message"]) == (body["chunks"], "all-MiniLM-L6-v2", None)
    doc_id = body["doc_id"]
    again = client.post("/api/rag/embed", json={"file_path": SEED_NVDA}).json()
    assert again["status"] == "unchanged" and again["error_message"] == "unchanged"
    assert again["chunk_count"] == body["chunk_count"]

    r = client.post("/api/rag/search", json={
        "query": "AI capex thesis",
        "ticker": "NVDA",
        "doc_type": "earnings-analysis",
        "top_k": 5,
        "min_similarity": 0.4,
    })
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["count"] == len(found["results"]) > 0
    assert all(h["ticker"] == "NVDA" and h["doc_type"] == "earnings-analysis" and h["score"] >= 0.4
               for h in found["results"])
    both = client.post("/api/rag/search", json={"query": "x", "ticker": "NVDA", "filters": {"ticker": "AMD"}})
    assert both.status_code == 422 and "ticker" in both.json()["error"]["message"]

    status = client.get("/api/rag/status").json()
    assert status["documents"] > 50 and status["chunks"] > 1000
    assert "index_size_mb" in status and status["held"] == []  # no file served from an older version
    # seed 001's RAGStats names beside ours
    assert (status["document_count"], status["chunk_count"]) == (status["documents"], status["chunks"])
    assert status["doc_types"] == status["by_type"] and status["last_embed"] == status["last_ingest"]
    assert {"NVDA", "AMD", "MSFT"} <= set(status["tickers"]) and status["tickers"] == sorted(status["tickers"])

    chunks = rows_for(corpus_db_url, SEED_NVDA)["chunks"]
    r = client.delete(f"/api/rag/document/{doc_id}")
    assert r.status_code == 200, r.text
    assert r.json()["doc_id"] == doc_id and r.json()["chunks_deleted"] == chunks > 0
    assert r.json()["status"] == "deleted"
    assert rows_for(corpus_db_url, SEED_NVDA)["documents"] == 0
    assert rows_for(corpus_db_url, NVDA)["documents"] == 1  # the corpus original is untouched
    assert client.delete(f"/api/rag/document/{doc_id}").status_code == 404


def test_seed_hits_carry_the_seeds_names_and_cosine(client: TestClient):
    """Seed 000 §5.6's search payload: each hit has the seeds' names (content, similarity, file_path,
    section_label) beside ours, and min_similarity holds for the cosine of every hit, the full-text
    ones of hybrid (the default) and lexical mode included."""
    seed = {"query": "AI capex thesis", "ticker": "NVDA", "doc_type": "earnings-analysis", "top_k": 5,
            "min_similarity": 0.4}
    r = client.post("/api/rag/search", json=seed)
    assert r.status_code == 200, r.text
    found = r.json()
    assert found["mode"] == "hybrid" and found["results"]
    for h in found["results"]:
        assert (h["content"], h["file_path"], h["section_label"]) == (h["text"], h["path"], h["section"])
        assert h["similarity"] >= 0.4
    hit = client.get("/openapi.json").json()["components"]["schemas"]["SearchHitOut"]["properties"]
    assert {"content", "similarity", "file_path", "section_label", "text", "score", "path", "section"} <= set(hit)

    # a name-only query: full text finds chunks that are not close in meaning; the threshold drops them
    loose = client.post("/api/rag/search", json={"query": "NVDA", "mode": "hybrid", "top_k": 50}).json()["results"]
    exact = {h["chunk_id"]: h["similarity"] for h in client.post("/api/rag/search", json={
        "query": "NVDA", "mode": "semantic", "top_k": 100}).json()["results"]}
    assert all(h["similarity"] is not None for h in loose)
    shared = [h for h in loose if h["chunk_id"] in exact]
    assert shared and all(abs(h["similarity"] - exact[h["chunk_id"]]) < 1e-4 for h in shared)
    cut = min(h["similarity"] for h in loose) + 0.05
    assert any(h["similarity"] < cut for h in loose)
    for mode in ("hybrid", "lexical"):
        kept = client.post("/api/rag/search", json={"query": "NVDA", "mode": mode, "top_k": 50,
                                                    "min_similarity": cut}).json()["results"]
        assert kept and all(h["similarity"] >= cut for h in kept), mode
    # without a threshold, lexical mode does not embed the query (nothing to compare)
    plain = client.post("/api/rag/search", json={"query": "NVDA", "mode": "lexical", "top_k": 3}).json()
    assert "embed" not in plain["timings_ms"] and plain["results"][0]["similarity"] is None


def test_rerank_without_reranker_says_so(client: TestClient):
    r = client.post("/api/rag/search", json={"query": "NVDA competitive position", "rerank": True, "top_k": 3})
    body = r.json()
    assert body["reranked"] is False and "search.rerank_model_path" in body["rerank_note"]
    assert len(body["results"]) == 3 and all(h["rerank_score"] is None for h in body["results"])
    assert client.post("/api/rag/search", json={"query": "NVDA", "top_k": 3}).json()["reranked"] is False


def test_seed000_embed_text_stores_a_document(client: TestClient, corpus_db_url: str):
    r = client.post("/api/rag/embed-text", json={
        "text": "NVIDIA reported strong Q4...",
        "doc_id": "external-001",
        "doc_type": "article",
        "ticker": "NVDA",
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["doc_id"] == "external-001" and body["chunks"] == 1 and body["status"] == "embedded"
    shown = client.get("/api/rag/sources/external-001").json()
    assert shown["doc_type"] == "article" and shown["ticker"] == "NVDA"
    hits = client.post("/api/rag/search", json={"query": "NVIDIA strong Q4", "mode": "lexical",
                                                "doc_type": "article"}).json()["results"]
    assert [h["doc_id"] for h in hits] == ["external-001"]
    assert client.post("/api/rag/embed-text", json={
        "text": "NVIDIA reported strong Q4...", "doc_id": "external-001", "doc_type": "article",
        "ticker": "NVDA"}).json()["status"] == "unchanged"
    # storing needs a full-access key
    ro = client.post("/api/rag/embed-text", json={"text": "x", "doc_id": "ro-1"}, headers={"X-API-Key": READ})
    assert ro.status_code == 403
    # issue 15: read-only keys cannot embed at all (not even a raw vector)
    assert client.post("/api/rag/embed-text", json={"text": "x"}, headers={"X-API-Key": READ}).status_code == 403
    assert "vector" in client.post("/api/rag/embed-text", json={"text": "x"}).json()
    orphan = client.post("/api/rag/embed-text", json={"text": "x", "ticker": "NVDA"})
    assert orphan.status_code == 422 and "doc_id" in orphan.json()["error"]["message"]


def test_seed003_index_retrieve_sources_delete(client: TestClient, roots):
    (roots["corpus"] / "docs").mkdir()
    (roots["corpus"] / "docs" / "ARCHITECTURE.md").write_text(
        "# Architecture\n\n## Backtesting\n\nHow do I configure backtesting splits? Configure backtesting splits "
        "with the TimeSeriesSplitter: expanding or sliding window splits prevent data leakage.\n\n"
        "## Storage\n\nPostgreSQL with pgvector keeps the chunks.\n")
    (roots["corpus"] / "README.md").write_text("# Readme\n\n## Overview\n\nA trading research platform.\n")
    r = client.post("/rag/index", json={
        "source_type": "markdown",
        "source_path": "docs/ARCHITECTURE.md",
        "metadata": {"category": "documentation", "version": "1.0.0"},
    })
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "indexed" and body["chunks_created"] >= 2 and body["tokens_processed"] > 10
    assert body["source_id"] and body["duration_ms"] > 0 and body["content_hash"]
    # the shared corpus's README.md (another root, same path) is a document of this collection already
    taken = client.post("/rag/index", json={"source_type": "markdown", "source_path": "README.md"})
    assert taken.status_code == 409 and taken.json()["error"]["code"] == "document_conflict"
    assert "still exists" in taken.json()["error"]["message"] and "<path>" in taken.json()["error"]["message"]  # no server paths
    (roots["corpus"] / "README.md").rename(roots["corpus"] / "OVERVIEW.md")
    again = client.post("/rag/index", json={
        "source_type": "markdown", "source_path": "OVERVIEW.md", "metadata": {"category": "overview"}})
    assert again.status_code == 200 and again.json()["status"] == "indexed"

    r = client.post("/rag/retrieve", json={
        "query": "How do I configure backtesting splits?",
        "top_k": 5,
        "similarity_threshold": 0.7,
    })
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["results"] and got["results"][0]["source_path"] == "docs/ARCHITECTURE.md"
    assert all(h["relevance_score"] >= 0.7 for h in got["results"])
    assert got["results"][0]["metadata"]["heading"] == "Backtesting"
    assert got["total_chunks_searched"] > 1000 and got["search_time_ms"] >= 0
    # the chunks of the collection searched (settings.collection when none is named), not of every collection
    other = client.post("/rag/index", json={"source_path": "docs/ARCHITECTURE.md", "collection": "other"})
    assert other.status_code == 200 and other.json()["chunks_created"] >= 2, other.text
    for collection in (None, "other"):
        searched = client.post("/rag/retrieve", json={"query": "backtesting splits", "collection": collection})
        counts = client.get("/api/rag/status", params={"collection": collection or "default"}).json()
        assert searched.json()["total_chunks_searched"] == counts["chunks"], collection
    yaml_only = client.post("/rag/retrieve", json={"query": "backtesting splits", "top_k": 5,
                                                   "filters": {"source_type": ["yaml"]}}).json()["results"]
    assert yaml_only and all(h["source_path"].endswith((".yaml", ".yml")) for h in yaml_only)
    # seed 003's request as written: source types and the category given at indexing
    r = client.post("/rag/retrieve", json={
        "query": "How does backtesting prevent data leakage?", "top_k": 5, "similarity_threshold": 0.2,
        "filters": {"source_type": ["markdown", "openapi"], "category": "documentation"}})
    assert r.status_code == 200, r.text
    documentation = r.json()["results"]
    assert documentation and {h["source_path"] for h in documentation} == {"docs/ARCHITECTURE.md"}
    assert documentation[0]["metadata"]["category"] == "documentation"
    overview = client.post("/rag/retrieve", json={"query": "trading research platform", "top_k": 5,
                                                  "filters": {"category": ["overview"]}}).json()["results"]
    assert overview and {h["source_path"] for h in overview} == {"OVERVIEW.md"}
    # tags are kept with the document: a forced re-index without metadata keeps them
    assert client.post("/rag/index", json={"source_path": "OVERVIEW.md", "force": True}).json()["status"] == "indexed"
    tagged = client.post("/rag/retrieve", json={"query": "trading research platform", "top_k": 5,
                                                "filters": {"tags": {"category": "overview"}}}).json()["results"]
    assert {h["source_path"] for h in tagged} == {"OVERVIEW.md"}
    nothing = client.post("/rag/retrieve", json={"query": "backtesting", "filters": {"category": "nope"}})
    assert nothing.status_code == 200 and nothing.json()["results"] == []
    unsupported = client.post("/rag/retrieve", json={"query": "x", "filters": {"version": "1.0.0"}})
    assert unsupported.status_code == 422  # unknown filter keys are refused, not silently ignored
    assert '"tags": {"version"' in unsupported.json()["error"]["message"]  # with the way to say it
    versioned = client.post("/rag/retrieve", json={"query": "backtesting", "top_k": 5,
                                                   "filters": {"tags": {"version": "1.0.0"}}}).json()["results"]
    assert versioned and {h["source_path"] for h in versioned} == {"docs/ARCHITECTURE.md"}
    # the format is a filter of the search, not a cut of its first results: a markdown document ranked
    # below many yaml ones is still found (the shared corpus's notes rank far below its analyses here)
    markdown = client.post("/rag/retrieve", json={"query": "NVDA earnings beat data center revenue", "top_k": 3,
                                                  "filters": {"source_type": "markdown"}}).json()["results"]
    assert len(markdown) == 3 and all(h["source_path"].endswith(".md") for h in markdown)
    dated = client.post("/rag/retrieve", json={"query": "NVDA earnings", "top_k": 5, "filters": {
        "date_range": {"from": "2025-01-01", "to": "2025-01-31"}, "ticker": "NVDA"}}).json()["results"]
    assert dated and all("2025-01" in h["source_path"] or "202501" in h["source_path"] for h in dated), dated
    # a reversed date_range is named as the client sent it, not as the search's date_from/date_to
    reversed_range = client.post("/rag/retrieve", json={"query": "NVDA earnings", "filters": {
        "date_range": {"from": "2026-01-01", "to": "2025-01-01"}}})
    assert reversed_range.status_code == 422 and reversed_range.json()["error"]["code"] == "invalid_input"
    assert reversed_range.json()["error"]["message"] == ("date_range: from 2026-01-01 is after to 2025-01-01, "
                                                         "so no document can match; swap them or drop one")

    shown = client.get("/api/rag/sources/docs/ARCHITECTURE.md").json()
    assert shown["tags"] == {"category": "documentation", "version": "1.0.0"} and "source_path" not in shown

    listing = client.get("/rag/sources").json()
    mine = {s["source_path"]: s for s in listing["sources"]}
    assert mine["docs/ARCHITECTURE.md"]["source_type"] == "markdown"
    assert mine["docs/ARCHITECTURE.md"]["content_hash"] and mine["docs/ARCHITECTURE.md"]["chunk_count"] >= 2
    assert listing["total_sources"] == len(listing["sources"]) and listing["total_chunks"] > 1000

    r = client.delete(f"/rag/sources/{body['source_id']}")
    assert r.status_code == 200, r.text
    assert r.json() == {"source_id": body["source_id"], "chunks_deleted": body["chunks_created"], "status": "deleted"}


def test_compatibility_routes_are_tagged_in_openapi(client: TestClient):
    spec = client.get("/openapi.json").json()
    for path, method in [("/rag/index", "post"), ("/rag/retrieve", "post"), ("/rag/sources", "get"),
                         ("/rag/sources/{source_id}", "delete"), ("/api/rag/document/{doc_id}", "delete")]:
        assert spec["paths"][path][method]["tags"] == ["compatibility"], path
    hit = spec["components"]["schemas"]["SearchHitOut"]["properties"]
    from dataclasses import fields

    from rag_lib.models import SEED_HIT_NAMES, SearchHit
    assert set(hit) == {"rank"} | {f.name for f in fields(SearchHit)} | set(SEED_HIT_NAMES)
    assert Settings().server.port == 8081


def test_published_request_limits_are_the_settings_in_force(client: TestClient, api_settings: Settings, provider):
    """The OpenAPI document and the MCP tools' input schemas advertise the limits settings.server
    enforces (they advertised the schema's ceilings: top_k up to 1000 where 100 was refused), and a
    value at the published limit is accepted, one above it refused."""
    import anyio
    from mcp import Client

    from rag_lib.mcp_server import create_mcp

    server = api_settings.server
    server.max_top_k, server.max_query_chars, server.max_token_budget, server.max_text_chars = 7, 300, 900, 5000
    spec = client.get("/openapi.json").json()["components"]["schemas"]

    def bound(schema: dict, name: str, keyword: str) -> int:
        field = schema["properties"][name]
        return next(part[keyword] for part in [field, *field.get("anyOf", [])] if keyword in part)

    expected = {("RetrieveRequest", "top_k", "maximum"): 7, ("SearchRequest", "top_k", "maximum"): 7,
                ("SimilarRequest", "top_k", "maximum"): 7, ("RetrieveRequest", "query", "maxLength"): 300,
                ("SearchRequest", "query", "maxLength"): 300, ("ContextRequest", "token_budget", "maximum"): 900,
                ("HybridContextRequest", "token_budget", "maximum"): 900,
                ("HybridContextRequest", "query", "maxLength"): 300, ("EmbedTextRequest", "text", "maxLength"): 5000}
    assert {key: bound(spec[key[0]], key[1], key[2]) for key in expected} == expected
    # the published limit is the one in force
    assert client.post("/rag/retrieve", json={"query": "NVDA thesis", "top_k": 7}).status_code == 200
    over = client.post("/rag/retrieve", json={"query": "NVDA thesis", "top_k": 8})
    assert over.status_code == 422 and over.json()["error"]["message"] == "top_k must be at most 7, got 8"
    assert client.post("/api/rag/search", json={"query": "q" * 301}).status_code == 422
    hybrid = client.post("/api/rag/hybrid-context", json={"query": "NVDA risks", "token_budget": 901})
    assert hybrid.status_code == 422 and hybrid.json()["error"]["message"] == "token_budget must be at most 900, got 901"
    assert client.post("/api/rag/hybrid-context", json={"query": "q" * 301}).status_code == 422

    kb = KnowledgeBase(api_settings, provider=provider)

    async def tool_schemas() -> dict[str, dict]:
        async with Client(create_mcp(lambda: kb)) as mcp_client:
            return {t.name: t.input_schema for t in (await mcp_client.list_tools()).tools}
    try:
        tools = anyio.run(tool_schemas)
    finally:
        kb.close()
    assert bound(tools["rag_search"], "top_k", "maximum") == bound(tools["rag_similar"], "top_k", "maximum") == 7
    assert bound(tools["rag_search"], "query", "maxLength") == bound(tools["rag_hybrid_context"], "query", "maxLength") == 300
    assert bound(tools["rag_context"], "token_budget", "maximum") == bound(tools["rag_hybrid_context"], "token_budget",
                                                                           "maximum") == 900
    assert bound(tools["rag_embed_text"], "text", "maxLength") == 5000


def test_search_response_carries_the_plan(client: TestClient, api_settings: Settings, provider):
    """What the query was classified as, and which tickers it routed to, reach HTTP and MCP clients:
    the library's SearchResult carries it, and the response models once dropped it."""
    import anyio
    from mcp import Client

    from rag_lib.mcp_server import create_mcp
    from testkit import payload

    query = {"query": "Compare NVDA vs AMD earnings", "top_k": 3}
    body = client.post("/api/rag/search", json=query).json()
    assert body["plan"]["kind"] == "comparison" and set(body["plan"]["tickers"]) == {"NVDA", "AMD"}
    assert body["results"] and body["count"] == len(body["results"])  # the other fields are unchanged
    spec = client.get("/openapi.json").json()["components"]["schemas"]
    assert {"kind", "tickers", "doc_types", "type_lists"} <= set(spec["SearchPlan"]["properties"])

    kb = KnowledgeBase(api_settings, provider=provider)

    async def over_mcp() -> dict:
        async with Client(create_mcp(lambda: kb)) as mcp_client:
            return payload(await mcp_client.call_tool("rag_search", query))
    try:
        found = anyio.run(over_mcp)
    finally:
        kb.close()
    assert found["plan"] == body["plan"] and found["results"]
