"""Second security review (issue 29), findings 7-12: no secrets in logs, ids nobody can take over,
names that cannot collide, 422 (not 500) for text and numbers PostgreSQL cannot store, no server
paths in status, one log record per event, X-Forwarded-For only from trusted proxies, deletes that
remove the uploaded file, and an upload quota. Real PostgreSQL and the real model throughout."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from rag_lib.api import KnowledgeBase
from rag_lib.config import ServerSettings, Settings
from rag_lib.server import create_app
from rag_lib.server.security import KeyRing
from testkit import child_env, create_database, start_server

FULL = "hygiene-full-key-5d2"
READ = "hygiene-read-key-9e4"
KEYS = KeyRing.from_env(Settings(), {"RAG_API_KEYS": FULL, "RAG_API_READ_ONLY_KEYS": READ})
GOOD = "# Good desk note\n\n## Thesis\n\nZirconium refiners gain from the new reactor build-out.\n"
CORPUS_YAML = """_meta:
  id: {id}
  type: research
  title: {title}
summary: {text}
"""


def corpus_root(tmp: Path) -> Path:
    root = tmp / "root"
    root.mkdir()
    (root / "good.md").write_text(GOOD)
    (root / "nvda.yaml").write_text(CORPUS_YAML.format(id="RES-001", title="NVDA research",
                                                       text="Hafnium supply for accelerator packaging."))
    (root / "twin_a.yaml").write_text(CORPUS_YAML.format(id="TWIN", title="Twin A", text="Yttrium lasers."))
    (root / "twin_b.yaml").write_text(CORPUS_YAML.format(id="TWIN", title="Twin B", text="Scandium alloys."))
    (root / "fresh.md").write_text("# Fresh\n\n## Body\n\nNiobium magnets for fusion.\n")
    return root


def make_client(url: str, home: Path, root: Path, provider, **server: object) -> tuple[TestClient, KnowledgeBase]:
    settings = Settings(database_url=url, home=home,
                        server=ServerSettings(corpus_roots=[root], **server))  # uploads under <home>/uploads
    kb = KnowledgeBase(settings, provider=provider)
    app = create_app(settings, kb=kb, keys=KEYS)
    return TestClient(app, headers={"X-API-Key": FULL}, raise_server_exceptions=False), kb


@pytest.fixture(scope="module")
def hy(pg_server: str, provider, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hygiene")
    root = corpus_root(tmp)
    url = create_database(pg_server)
    client, kb = make_client(url, tmp / ".rag", root, provider)
    with client:
        for name in ("good.md", "nvda.yaml", "twin_a.yaml", "twin_b.yaml"):
            r = client.post("/api/rag/embed", json={"path": name})
            assert r.status_code == 200 and r.json()["new"] == 1, r.text
        yield {"c": client, "kb": kb, "db": url, "root": root, "home": tmp / ".rag", "tmp": tmp}
    kb.close()


def code(r: httpx.Response) -> str:
    return r.json()["error"]["code"]


def uploads(hy: dict) -> list[str]:
    folder = hy["home"] / "uploads"
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def db_state(url: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT collection, path, doc_id, content_hash, tags::text FROM rag_documents"
                            " ORDER BY 1, 2").fetchall()


# ---- 7. secrets in logs ------------------------------------------------------------------------

def test_conflicting_seed_variables_log_names_never_values(monkeypatch):
    """A `RAG_*` variable and its seed alias set to different values: the warning names both variables
    and shows neither value (keys, URLs with passwords)."""
    from rag_lib import config

    secrets = {"RAG_SEARCH__DATABASE_URL": "postgresql://reader:pw-primary-61@db1/rag",
               "RAG_SEARCH_DATABASE_URL": "postgresql://reader:pw-seed-62@db2/rag",
               "LLM_API_KEY": "sk-live-hygiene-63", "RAG_EMBEDDING__API_KEY_ENV": "MY_PROVIDER_KEY",
               "LLM_BASE_URL": "https://user:pw-llm-64@llm.example/v1",
               "RAG_EMBEDDING__BASE_URL": "https://user:pw-ours-65@llm.example/v1",
               "RAG_DATABASE_URL": "postgresql://app:pw-db-66@db1/rag", "PG_HOST": "db2", "PG_PASS": "pw-pg-67"}
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(config, "_LOGGED_CONFLICTS", set())
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("rag_lib.config")
    logger.addHandler(handler)
    try:
        Settings()
    finally:
        logger.removeHandler(handler)
    text = "\n".join(logging.Formatter("%(message)s").format(r) for r in records)
    for name in ("RAG_SEARCH__DATABASE_URL", "RAG_SEARCH_DATABASE_URL", "LLM_API_KEY", "LLM_BASE_URL", "PG_"):
        assert name in text, (name, text)
    for n in range(61, 68):
        assert f"-{n}" not in text, text
    assert "sk-live" not in text and "pw-" not in text


@pytest.mark.subprocess
def test_no_secret_reaches_a_cli_process_output(tmp_path: Path):
    """A `rag` process with conflicting variables and an unparsable database URL that holds a password:
    its log and its error line name the variables, never a key or a password."""
    import subprocess

    from testkit import RAG

    env = child_env("postgresq://app:pw-bad-url-71@db1/rag", tmp_path / ".rag", RAG_LOG_LEVEL="DEBUG",
                    LLM_API_KEY="sk-live-hygiene-72", RAG_EMBEDDING__API_KEY_ENV="MY_PROVIDER_KEY",
                    RAG_SEARCH__DATABASE_URL="postgresql://r:pw-search-73@db1/rag",
                    RAG_SEARCH_DATABASE_URL="postgresql://r:pw-seed-74@db2/rag", PG_HOST="db2", PG_PASS="pw-pg-75")
    done = subprocess.run([RAG, "status"], env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "RAG_DATABASE_URL" in out and "LLM_API_KEY" in out, out
    assert "pw-" not in out and "sk-live" not in out, out


# ---- 8. a document cannot claim another's id ------------------------------------------------

def test_upload_cannot_take_a_corpus_documents_id(hy):
    c = hy["c"]
    before = db_state(hy["db"])
    evil = CORPUS_YAML.format(id="RES-001", title="Impostor", text="Takeover of the research note.")
    r = c.post("/api/rag/embed", json={"name": "claims/evil.yaml", "content": evil})
    assert r.status_code == 409 and code(r) == "document_conflict", r.text
    assert "RES-001" in r.json()["error"]["message"] and "nvda.yaml" in r.json()["error"]["message"]
    assert db_state(hy["db"]) == before and not [u for u in uploads(hy) if "claims" in u]
    # the id still names the corpus document only, for reads, similar and delete
    assert c.get("/api/rag/sources/RES-001").json()["path"] == "nvda.yaml"
    assert c.post("/api/rag/similar", json={"ref": "RES-001", "top_k": 3}).status_code == 200
    text = c.post("/api/rag/embed-text", json={"text": "impostor text", "doc_id": "RES-001"})
    assert text.status_code == 409 and code(text) == "document_conflict", text.text


def test_lookups_and_deletes_by_an_ambiguous_id_refuse(hy):
    """Two corpus files carrying one id: a lookup or delete by that id is a 409 naming both paths, and
    deletes nothing; by path each is still reachable."""
    c = hy["c"]
    before = db_state(hy["db"])
    for r in (c.get("/api/rag/sources/TWIN"), c.post("/api/rag/similar", json={"ref": "TWIN"}),
              c.delete("/api/rag/document/TWIN"), c.delete("/api/rag/sources/TWIN"), c.delete("/rag/sources/TWIN")):
        assert r.status_code == 409 and code(r) == "ambiguous_reference", (r.request.url, r.text)
        assert "twin_a.yaml" in r.json()["error"]["message"] and "twin_b.yaml" in r.json()["error"]["message"]
    assert db_state(hy["db"]) == before
    assert c.get("/api/rag/sources/twin_b.yaml").json()["title"] == "Twin B"


# ---- 9. names that cannot collide --------------------------------------------------------------

def test_collection_names_are_one_safe_folder(hy):
    c = hy["c"]
    before = db_state(hy["db"])
    for coll in ("ca/b", "default/texts", "../x", ".hidden", "a b", "x\\y"):
        for r in (c.post("/api/rag/embed", json={"name": "x.md", "content": GOOD, "collection": coll}),
                  c.post("/api/rag/embed-text", json={"text": "t", "doc_id": "ext-1", "collection": coll}),
                  c.post("/api/rag/search", json={"query": "zirconium", "collection": coll}),
                  c.get("/api/rag/sources", params={"collection": coll})):
            assert r.status_code == 422 and code(r) == "invalid_input", (coll, r.request.url, r.text)
            assert "collection" in r.json()["error"]["message"]
    assert db_state(hy["db"]) == before
    # `ca` + `b/x.md` and `cab` + `x.md`: different collections, different files
    assert c.post("/api/rag/embed", json={"name": "b/x.md", "content": GOOD, "collection": "ca"}).status_code == 200
    assert c.post("/api/rag/embed", json={"name": "x.md", "content": GOOD.replace("Good", "Other"),
                                          "collection": "cab"}).status_code == 200
    assert {"ca/b/x.md", "cab/x.md"} <= set(uploads(hy))
    assert "Good" in (hy["home"] / "uploads" / "ca" / "b" / "x.md").read_text()


def test_stored_text_ids_map_to_distinct_files(hy):
    c = hy["c"]
    a = c.post("/api/rag/embed-text", json={"text": "Colon id text about tungsten.", "doc_id": "ext:001"})
    b = c.post("/api/rag/embed-text", json={"text": "Underscore id text about cobalt.", "doc_id": "ext_001"})
    assert a.status_code == b.status_code == 200, (a.text, b.text)
    assert a.json()["path"] != b.json()["path"]
    first = c.get("/api/rag/sources/ext:001").json()
    second = c.get("/api/rag/sources/ext_001").json()
    assert (first["doc_id"], second["doc_id"]) == ("ext:001", "ext_001") and first["path"] != second["path"]
    files = {u: (hy["home"] / "uploads" / u).read_text() for u in uploads(hy) if u.startswith("default/texts/")}
    assert any("tungsten" in t for t in files.values()) and any("cobalt" in t for t in files.values())


def test_text_stored_under_the_old_name_is_replaced_in_place(hy):
    """A text stored before names were one-to-one (`ext:002` kept as `texts/ext_002.yaml`) is replaced
    where it is; `ext_002` may not overwrite it."""
    c = hy["c"]
    legacy = "_meta:\n  id: ext:002\n  doc_type: note\ntext: Old text about gallium.\n"
    assert c.post("/api/rag/embed", json={"name": "texts/ext_002.yaml", "content": legacy}).status_code == 200
    again = c.post("/api/rag/embed-text", json={"text": "New text about gallium arsenide.", "doc_id": "ext:002"})
    assert again.status_code == 200 and again.json()["path"] == "texts/ext_002.yaml", again.text
    clash = c.post("/api/rag/embed-text", json={"text": "Another text.", "doc_id": "ext_002"})
    assert clash.status_code == 409 and code(clash) == "document_conflict", clash.text
    assert "arsenide" in (hy["home"] / "uploads" / "default" / "texts" / "ext_002.yaml").read_text()


# ---- 10. 422, never 500, for what PostgreSQL cannot store ---------------------------------------

SURROGATE = "\\ud800"  # a JSON escape of a lone surrogate, sent as raw JSON text


def post_raw(c: TestClient, path: str, body: str) -> httpx.Response:
    return c.post(path, content=body.encode(), headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("path,body", [
    ("/api/rag/search", '{"query": "x", "filters": {"ticker": "%s"}}' % SURROGATE),
    ("/api/rag/search", '{"query": "x", "filters": {"doc_type": ["note", "%s"]}}' % SURROGATE),
    ("/api/rag/search", '{"query": "x", "ticker": "A%sB"}' % SURROGATE),
    ("/api/rag/search", '{"query": "tungsten %s"}' % SURROGATE),
    ("/api/rag/embed", '{"name": "s/sur.md", "content": "# S\\n\\n## A\\n\\nbad %s text\\n"}' % SURROGATE),
    ("/api/rag/embed-text", '{"text": "t %s", "doc_id": "sur-1"}' % SURROGATE),
    ("/rag/retrieve", '{"query": "x", "filters": {"category": "%s"}}' % SURROGATE),
    ("/rag/retrieve", '{"query": "x", "filters": {"tags": {"%s": "v"}}}' % SURROGATE),
    ("/rag/retrieve", '{"query": "x", "filters": {"tags": {"a": NaN}}}'),
    ("/rag/retrieve", '{"query": "x", "filters": {"tags": {"a": [1, Infinity]}}}'),
    ("/rag/index", '{"source_path": "fresh.md", "metadata": {"score": NaN}}'),
    ("/rag/index", '{"source_path": "fresh.md", "metadata": {"score": -Infinity}}'),
    ("/rag/index", '{"source_path": "fresh.md", "metadata": {"category": "%s"}}' % SURROGATE),
    ("/api/rag/hybrid-context", '{"query": "x %s"}' % SURROGATE),
])
def test_unstorable_text_and_numbers_are_422_and_write_nothing(hy, path: str, body: str):
    c = hy["c"]
    before, files = db_state(hy["db"]), uploads(hy)
    r = post_raw(c, path, body)
    assert r.status_code == 422 and code(r) == "invalid_input", r.text
    assert db_state(hy["db"]) == before and uploads(hy) == files  # refused before anything was written


def test_mcp_tools_refuse_lone_surrogates(hy):
    """The MCP tools give the same answer (a tool error naming the problem), and write nothing."""
    import anyio
    from mcp import Client

    from rag_lib.mcp_server import create_mcp

    async def run() -> list[str]:
        texts = []
        async with Client(create_mcp(lambda: hy["kb"])) as client:
            for tool, args in (("rag_search", {"query": "x", "ticker": "\ud800"}),
                               ("rag_search", {"query": "tungsten \udfff"}),
                               ("rag_embed", {"name": "m/sur.md", "content": "# S\n\n## A\n\n\ud800\n"})):
                result = await client.call_tool(tool, args)
                assert result.is_error, (tool, result.content)
                texts.append(" ".join(getattr(x, "text", "") for x in result.content))
        return texts

    before = db_state(hy["db"])
    for text in anyio.run(run):
        # refused by the tool's argument schema (pydantic: string_unicode) or by `_call` before any
        # service runs; never a crash
        assert ("surrogate" in text or "unicode" in text) and "internal_error" not in text, text
    assert db_state(hy["db"]) == before


# ---- 11. leaks and log hygiene ------------------------------------------------------------------

def test_status_shows_no_absolute_paths_to_a_read_only_key(hy):
    c, kb, root = hy["c"], hy["kb"], hy["root"]
    kb.store.record_failure("ingest:load", f"{root}/broken/deep.md: cannot read {root.resolve()}/broken/deep.md",
                      partition="broken/deep.md")
    kb.store.record_failure("dagster:chunks", "OSError: [Errno 13] Permission denied: '/srv/private/keys/x.md'")
    for headers in ({"X-API-Key": READ}, {}):
        r = c.get("/api/rag/status", headers=headers)
        assert r.status_code == 200
        assert str(root) not in r.text and str(hy["tmp"]) not in r.text and "/srv/private" not in r.text, r.text
        messages = [f["message"] for f in r.json()["failures"]]
        assert any(m.startswith("broken/deep.md: cannot read broken/deep.md") for m in messages), messages


@pytest.fixture(scope="module")
def live(pg_server: str, tmp_path_factory):
    """A real `rag serve` process (uvicorn, the one logger setup) with keys, logging at INFO."""
    tmp = tmp_path_factory.mktemp("hygiene_live")
    env = child_env(create_database(pg_server), tmp / ".rag", RAG_API_KEYS=FULL, RAG_API_READ_ONLY_KEYS=READ,
                    RAG_LOG_LEVEL="INFO")
    server = start_server(["serve"], env, tmp / "server.log")
    yield server
    server.stop()


@pytest.mark.subprocess
def test_server_log_records_once_and_ignores_untrusted_forwarded_for(live):
    with httpx.Client(base_url=live.url, timeout=60, headers={"X-API-Key": FULL}) as c:
        start = len(live.log_path.read_text().splitlines())
        for n in range(3):
            r = c.get("/api/rag/status", headers={"X-Request-ID": f"once-{n}", "X-Forwarded-For": "203.0.113.7"})
            assert r.status_code == 200
        c.post("/api/rag/search", json={"query": "x", "collection": "a/b"}, headers={"X-Request-ID": "once-bad"})
    # a request's access line is written once its response is sent, so it may follow the client's read
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in live.log_path.read_text().splitlines()[start:] if line.strip()]
        records = [json.loads(line) for line in lines]  # every line is one JSON record (no plain-text copies)
        access = [r for r in records if r.get("msg") == "request"]
        if len(access) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sorted(r["request_id"] for r in access) == ["once-0", "once-1", "once-2", "once-bad"], lines
    assert {r["client"] for r in access} == {"127.0.0.1"}, access  # not the forged 203.0.113.7
    assert "203.0.113.7" not in "\n".join(lines)


def test_proxy_headers_follow_the_trusted_proxies_setting():
    from rag_lib.server import proxy_options

    assert proxy_options(Settings()) == {"proxy_headers": False, "forwarded_allow_ips": ""}
    trusted = Settings(server=ServerSettings(trusted_proxies=["10.0.0.5", "10.1.0.0/16"]))
    assert proxy_options(trusted) == {"proxy_headers": True, "forwarded_allow_ips": "10.0.0.5,10.1.0.0/16"}


def test_one_handler_however_often_logging_is_set_up():
    from rag_lib.log import setup_logging, setup_server_logging

    setup_server_logging("INFO")
    for _ in range(3):
        setup_logging("WARNING")
        setup_server_logging("INFO")
    for name in ("rag_lib", "uvicorn", "uvicorn.error", "mcp"):
        ours = [h for h in logging.getLogger(name).handlers if type(h).__name__ == "_OurHandler"]
        assert len(ours) == 1, (name, logging.getLogger(name).handlers)
    setup_logging(None)


# ---- 12. deletes remove the upload; quotas ----------------------------------------------------

def test_delete_removes_the_uploaded_file_and_never_a_corpus_file(hy):
    c = hy["c"]
    assert c.post("/api/rag/embed", json={"name": "del/one.md", "content": GOOD}).status_code == 200
    assert c.post("/api/rag/embed-text", json={"text": "Text to delete.", "doc_id": "del-text"}).status_code == 200
    assert {"default/del/one.md", "default/texts/del-text.yaml"} <= set(uploads(hy))
    r = c.delete("/api/rag/sources/del/one.md")
    assert r.status_code == 200 and r.json()["files_removed"] == ["default/del/one.md"], r.text
    r = c.delete("/api/rag/document/del-text")
    assert r.status_code == 200 and r.json()["files_removed"] == ["default/texts/del-text.yaml"], r.text
    assert not {"default/del/one.md", "default/texts/del-text.yaml"} & set(uploads(hy))
    assert not (hy["home"] / "uploads" / "default" / "del").exists()  # emptied folders go too
    # a corpus document's file stays where it is
    assert c.post("/api/rag/embed", json={"path": "fresh.md"}).status_code == 200
    r = c.delete("/api/rag/sources/fresh.md")
    assert r.status_code == 200 and r.json()["files_removed"] == [] and (hy["root"] / "fresh.md").is_file()


def test_a_file_that_cannot_be_removed_is_reported(hy):
    c = hy["c"]
    assert c.post("/api/rag/embed", json={"name": "stuck/two.md", "content": GOOD}).status_code == 200
    target = hy["home"] / "uploads" / "default" / "stuck" / "two.md"
    target.unlink()
    target.mkdir()  # unlink() of a directory fails, whoever runs the test
    (target / "keep").write_text("x")
    r = c.delete("/api/rag/sources/stuck/two.md")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["deleted"] == ["stuck/two.md"] and body["files_removed"] == []
    assert len(body["file_errors"]) == 1 and body["file_errors"][0].startswith("default/stuck/two.md")
    assert c.get("/api/rag/sources/stuck/two.md").status_code == 404


def test_upload_quota_refuses_with_the_setting_and_numbers(hy, provider):
    client, kb = make_client(hy["db"], hy["tmp"] / ".rag-quota", hy["root"], provider,
                             upload_quota_files=2, upload_quota_bytes=len(GOOD) * 3)
    try:
        with client as c:
            for n in range(2):
                assert c.post("/api/rag/embed", json={"name": f"q/{n}.md", "content": GOOD,
                                                      "collection": "quota"}).status_code == 200
            r = c.post("/api/rag/embed", json={"name": "q/2.md", "content": GOOD, "collection": "quota"})
            assert r.status_code == 413 and code(r) == "upload_quota_exceeded", r.text
            assert "upload_quota_files" in r.json()["error"]["message"] and " 2 " in r.json()["error"]["message"]
            assert c.get("/api/rag/sources/q/2.md", params={"collection": "quota"}).status_code == 404
            # replacing an upload frees its old size; growing past the byte quota is refused
            assert c.post("/api/rag/embed", json={"name": "q/1.md", "content": GOOD + "More.\n",
                                                  "collection": "quota"}).status_code == 200
            big = c.post("/api/rag/embed", json={"name": "q/1.md", "content": GOOD * 3, "collection": "quota"})
            assert big.status_code == 413 and "upload_quota_bytes" in big.json()["error"]["message"], big.text
            assert re.search(r"\b\d+ bytes\b", big.json()["error"]["message"])
            # a delete frees room for the next upload
            assert c.delete("/api/rag/sources/q/0.md", params={"collection": "quota"}).status_code == 200
            assert c.post("/api/rag/embed", json={"name": "q/2.md", "content": GOOD,
                                                  "collection": "quota"}).status_code == 200
    finally:
        kb.close()
