"""Hostile requests against a real `rag serve` process on 127.0.0.1 (issue 15, serving side): each
case gets its 4xx and stable code, `/health` keeps answering within 100 ms during and after it, the
good documents stay searchable and nothing else in the database changes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from testkit import ServerProcess, child_env, create_database, start_server

pytestmark = pytest.mark.subprocess

FULL = "hostile-full-key-7a1"
READ = "hostile-read-key-3c9"
GOOD = "# Good desk note\n\n## Thesis\n\nZirconium refiners gain from the new reactor build-out.\n"


def alias_bomb(levels: int) -> str:
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"{'abcdefghij'[i]}: &{'abcdefghij'[i]} [{','.join(['*' + 'abcdefghij'[i - 1]] * 9)}]")
    return "\n".join(lines) + "\n"


def serve(db_url: str, home: Path, keys: bool, **extra: str) -> ServerProcess:
    """`rag serve` on 127.0.0.1 over `db_url`, with the test keys or in loopback mode (no keys)."""
    env = child_env(db_url, home, **({"RAG_API_KEYS": FULL, "RAG_API_READ_ONLY_KEYS": READ} if keys else {}), **extra)
    return start_server(["serve"], env, home / "server.log")


def db_state(url: str) -> dict[str, list[tuple]]:
    with psycopg.connect(url) as conn:
        return {
            "documents": conn.execute(
                "SELECT collection, path, content_hash, chunk_count FROM rag_documents ORDER BY 1, 2").fetchall(),
            "chunks": conn.execute("SELECT count(*), md5(string_agg(chunk_id, ',' ORDER BY chunk_id))"
                                   " FROM rag_chunks").fetchall(),
            "vectors": conn.execute("SELECT count(*) FROM rag_chunk_vectors").fetchall(),
        }


@pytest.fixture(scope="module")
def keyed(pg_server: str, tmp_path_factory):
    """A keyed server over its own database, with a corpus root holding one good file."""
    tmp = tmp_path_factory.mktemp("hostile_http")
    root = tmp / "root"
    root.mkdir()
    (root / "good.md").write_text(GOOD)
    url = create_database(pg_server)
    server = serve(url, tmp / ".rag", keys=True, RAG_SERVER__CORPUS_ROOTS=json.dumps([str(root)]))
    client = httpx.Client(base_url=server.url, timeout=120, headers={"X-API-Key": FULL})
    assert client.post("/api/rag/embed", json={"path": "good.md"}).json()["new"] == 1
    yield {"c": client, "url": server.url, "db": url, "root": root, "home": tmp / ".rag", "log": server.log_path,
           "proc": server.proc}
    client.close()
    server.stop()


class HealthProbe:
    """Polls `/health` from its own connection while a hostile request runs; records latencies."""

    def __init__(self, base: str):
        self.base = base
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=5) as c:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = c.get("/health").status_code == 200
                except httpx.HTTPError as exc:
                    self.failures.append(type(exc).__name__)
                    ok = True
                self.latencies.append((time.perf_counter() - t0) * 1000)
                if not ok:
                    self.failures.append("status")
                time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def assert_responsive(server: dict, probe: HealthProbe) -> None:
    """`/health` answered every probe during the case, none frozen (the old failures were seconds
    to minutes, or a dead process): each within 2 s and, over ten probes or more, 95% within 500 ms;
    and after the case each of five probes within 2 s, all but one within 500 ms. Measured at load
    8-12 on the shared 2-core machine: p95 12-31 ms, worst single probe 102 ms; under `make test` the
    other worker shares the two cores (a lone probe during a nesting bomb took 462 ms there, one after
    a case 124 ms, and once on CI 1,140 ms between four of 1-3 ms: a stall of the machine, which a
    server left frozen or slow would not show as a single probe)."""
    assert not probe.failures, probe.failures
    assert server["proc"].poll() is None, "the server process died"
    if probe.latencies:
        lat = sorted(probe.latencies)
        assert lat[-1] < 2000, lat[-5:]
        if len(lat) >= 10:
            p95 = lat[min(len(lat) - 1, int(len(lat) * 0.95))]
            assert p95 < 500, (p95, lat[-5:])
    after = []
    with httpx.Client(base_url=server["url"], timeout=5) as c:  # one client: time the server, not TLS/client setup
        c.get("/health")
        for _ in range(5):
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            after.append((time.perf_counter() - t0) * 1000)
    assert max(after) < 2000 and sorted(after)[-2] < 500, after


def good_still_found(c: httpx.Client) -> None:
    hits = c.post("/api/rag/search", json={"query": "zirconium refiners reactor build-out", "top_k": 3,
                                           "mode": "lexical"}).json()["results"]
    assert hits and hits[0]["path"] == "good.md"


def error_code(r: httpx.Response) -> str:
    body = r.json()
    assert body["error"]["request_id"] == r.headers["x-request-id"]
    return body["error"]["code"]


def uploads_of(server: dict) -> list[str]:
    folder = server["home"] / "uploads"
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


HOSTILE_UPLOADS = {
    "nest50k.yaml": "deep: " + "[" * 50_000 + "]" * 50_000 + "\n",
    "nest5k.yaml": "deep: " + "[" * 5_000 + "]" * 5_000 + "\n",
    "blocknest.yaml": "deep:\n" + "- " * 30_000 + "x\n",
    "alias6.yaml": alias_bomb(6),
    "alias7.yaml": alias_bomb(7),
    "frontnest.md": "---\ntags: " + "[" * 50_000 + "]" * 50_000 + "\n---\n## Body\ntext\n",
    "deep.jsonl": json.dumps({"_id": "d", "text": "x", "meta": 0}).replace("0}", "[" * 50_000 + "]" * 50_000 + "}") + "\n",
    "python.yaml": "x: !!python/object/apply:os.system ['touch /tmp/rag-hostile-pwned']\n",
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(HOSTILE_UPLOADS))
def test_parser_bombs_through_upload_never_take_the_server_down(keyed, name: str):
    c = keyed["c"]
    before = db_state(keyed["db"])
    with HealthProbe(keyed["url"]) as probe:
        r = c.post("/api/rag/embed", json={"name": f"bombs/{name}", "content": HOSTILE_UPLOADS[name]})
    assert_responsive(keyed, probe)
    # refused outright by the sandbox (crash, time or memory), or skipped by the loader with its reason
    if r.status_code == 200:
        out = r.json()
        assert out["new"] == out["changed"] == 0 and out["skipped"] + out["failed"] >= 1, out
    else:
        assert r.status_code == 422 and error_code(r) == "document_rejected", r.text
    assert db_state(keyed["db"]) == before  # nothing published, nothing else changed
    assert not [u for u in uploads_of(keyed) if u.startswith("default/bombs/")]  # nothing left on disk
    assert not Path("/tmp/rag-hostile-pwned").exists()
    good_still_found(c)


@pytest.mark.timeout(300)
def test_long_runs_of_spaces_do_not_freeze_the_server(keyed):
    c = keyed["c"]
    spaces = " " * 60_000
    with HealthProbe(keyed["url"]) as probe:
        r = c.post("/api/rag/embed", json={"name": "spaces/value.yaml",
                                           "content": f"note: start{spaces}end\nother: value\n"})
        k = c.post("/api/rag/embed", json={"name": "spaces/key.yaml",
                                           "content": f"? key{spaces}end\n: value\nnext: text\n"})
    assert_responsive(keyed, probe)
    for resp in (r, k):  # ingested quickly, or refused by the sandbox's time limit: never a frozen server
        assert resp.status_code == 200 or error_code(resp) == "document_rejected", resp.text
    good_still_found(c)
    for name in ("spaces/value.yaml", "spaces/key.yaml"):
        c.delete(f"/api/rag/sources/{name}")


def test_jsonl_ids_cannot_escape_or_replace_other_documents(keyed):
    c = keyed["c"]
    before = c.get("/api/rag/sources/good.md").json()
    records = [{"_id": "../../etc/passwd", "text": "escape the root"}, {"_id": "good.md", "text": "impostor"},
               {"_id": "r1", "text": "a plain record about zebra migration"}]
    body = "\n".join(json.dumps(r) for r in records) + "\n"
    r = c.post("/api/rag/embed", json={"name": "evil.jsonl", "content": body})
    if r.status_code == 200:  # the loader confines records under their file: evil.jsonl#<id>
        assert all(f["path"].startswith("evil.jsonl") for f in r.json()["files"]), r.json()
    elif r.status_code == 409:  # a record claiming good.md's id (issue 29): refused whole
        assert error_code(r) == "document_conflict" and "good.md" in r.json()["error"]["message"]
    else:
        assert r.status_code == 422 and error_code(r) == "document_rejected"
    paths = [i["path"] for i in c.get("/api/rag/sources", params={"limit": 1000}).json()["items"]]
    assert "../../etc/passwd" not in paths and not any(p.startswith("/") or ".." in p for p in paths)
    after = c.get("/api/rag/sources/good.md").json()
    assert (after["doc_id"], after["chunk_count"], after["ingested_at"]) == (
        before["doc_id"], before["chunk_count"], before["ingested_at"])
    good_still_found(c)
    c.delete("/api/rag/sources/evil.jsonl")


def test_upload_cannot_replace_a_document_from_another_root(keyed):
    c = keyed["c"]
    before = db_state(keyed["db"])
    r = c.post("/api/rag/embed", json={"name": "good.md", "content": "# Impostor\n\n## A\n\nReplaced.\n"})
    assert r.status_code == 409 and error_code(r) == "document_conflict"
    assert db_state(keyed["db"]) == before and "default/good.md" not in uploads_of(keyed)
    # content the sandboxed parse finds no document in: the ingest itself finds the conflict, and the
    # answer is the same 409 (it was a 200 with a failed file), with nothing left behind
    r = c.post("/api/rag/embed", json={"name": "good.md", "content": "   \n"})  # empty: skipped by the parse
    assert r.status_code == 409 and error_code(r) == "document_conflict", r.text
    assert db_state(keyed["db"]) == before and "default/good.md" not in uploads_of(keyed)
    good_still_found(c)


def test_nul_characters_are_invalid_input(keyed):
    c = keyed["c"]
    before = db_state(keyed["db"])
    bad = [
        c.post("/api/rag/search", json={"query": "nvda\x00earnings"}),
        c.post("/api/rag/search", json={"query": "nvda", "collection": "de\x00fault"}),
        c.post("/api/rag/search", json={"query": "nvda", "filters": {"ticker": ["NVDA", "A\x00"]}}),
        c.post("/api/rag/context", json={"query": "nvda", "filters": {"section": "x\x00"}}),
        c.post("/api/rag/similar", json={"ref": "good.md\x00"}),
        c.post("/api/rag/embed", json={"name": "n.md", "content": "# N\n\n## A\n\nnul \x00 inside\n"}),
        c.get("/api/rag/sources/good.md%00"),
        c.get("/api/rag/sources", params={"collection": "a\x00b"}),
        c.get("/api/rag/status", params={"collection": "a\x00b"}),
        c.delete("/api/rag/sources/x%00y"),
    ]
    for r in bad:
        assert r.status_code == 422 and error_code(r) == "invalid_character", (r.request.url, r.text)
    # an escaped backslash followed by "u0000" is ordinary text, not a NUL
    ok = c.post("/api/rag/search", json={"query": "literal \\u0000 text", "mode": "lexical"})
    assert ok.status_code == 200
    assert db_state(keyed["db"]) == before


def test_bad_paths_and_upload_names_are_4xx(keyed):
    c = keyed["c"]
    root: Path = keyed["root"]
    (root / "loop").symlink_to(root / "loop")
    (root / "a").symlink_to(root / "b")
    (root / "b").symlink_to(root / "a")
    cases = {
        "loop": ("path_not_allowed",), "loop/x.md": ("path_not_allowed",), "a/x.md": ("path_not_allowed",),
        "x" * 256 + ".md": ("invalid_input",), "sub/" + "y" * 300: ("invalid_input",),
    }
    for path, codes in cases.items():
        r = c.post("/api/rag/embed", json={"path": path})
        assert 400 <= r.status_code < 500 and error_code(r) in codes, (path, r.text)
    for name in (".", "..", "./x.md", "a/./b.md", "a//b.md", "x/..", " ", "z" * 256 + ".md"):
        r = c.post("/api/rag/embed", json={"name": name, "content": "# T\n\n## A\n\ntext\n"})
        assert 400 <= r.status_code < 500 and error_code(r) in ("path_not_allowed", "invalid_input"), (name, r.text)
    r = c.post("/api/rag/embed", json={"name": "", "content": "# T\n"})
    assert r.status_code == 422 and error_code(r) == "invalid_input"
    for name in ("x~1.md", "a\\b.md", "chart 📈.md"):
        r = c.post("/api/rag/embed", json={"name": name, "content": "# T\n\n## A\n\ntext\n"})
        assert error_code(r) == "path_not_allowed" and "any alphabet" in r.json()["error"]["message"], (name, r.text)
    # letters of any alphabet are letters, as in a corpus file's name
    r = c.post("/api/rag/embed", json={"name": "notizen/Übersicht.md", "content": "# Ü\n\n## Zinsen\n\nDie Zinsen steigen.\n"})
    assert r.status_code == 200 and r.json()["new"] == 1, r.text
    good_still_found(c)


def test_failed_upload_leaves_nothing_on_disk(keyed):
    c = keyed["c"]
    listed = uploads_of(keyed)
    for name, content in (("broken/bad.yaml", "a: [unclosed\n"), ("broken/empty.md", "   \n"),
                          ("broken/list.yaml", "- just\n- a list\n")):
        r = c.post("/api/rag/embed", json={"name": name, "content": content})
        assert r.status_code in (200, 422), r.text
        if r.status_code == 200:
            assert r.json()["skipped"] + r.json()["failed"] == 1
    assert uploads_of(keyed) == listed
    # a failed new version keeps the good old one on disk and in the index
    assert c.post("/api/rag/embed", json={"name": "keep/me.md", "content": GOOD.replace("Zirconium", "Hafnium")}
                  ).json()["new"] == 1
    c.post("/api/rag/embed", json={"name": "keep/me.md", "content": "   \n"})
    assert "default/keep/me.md" in uploads_of(keyed)
    assert "Hafnium" in (keyed["home"] / "uploads" / "default" / "keep" / "me.md").read_text()
    assert c.delete("/api/rag/sources/keep/me.md").status_code in (200, 404)


def test_responses_leak_no_paths_or_internal_fields(keyed):
    c = keyed["c"]
    ro = {"X-API-Key": READ}
    doc = c.get("/api/rag/sources/good.md", headers=ro)
    assert doc.status_code == 200
    data = doc.json()
    from rag_lib.server.schemas import SourceDetail

    documented = set(SourceDetail.model_fields)  # the response model is the documentation
    assert set(data) <= documented, set(data) - documented
    assert not {"source_path", "fingerprint", "metadata"} & set(data)
    for text in (doc.text, c.get("/api/rag/status", headers=ro).text,
                 c.post("/api/rag/embed", json={"path": "good.md", "force": True}).text,
                 c.post("/api/rag/embed", json={"name": "leak/bad.yaml", "content": "a: [x\n"}).text):
        assert str(keyed["root"]) not in text and str(keyed["home"]) not in text and "/tmp/" not in text
    assert "source_path" not in doc.text and "fingerprint" not in doc.text


def test_huge_numbers_are_validation_errors(keyed):
    c = keyed["c"]
    for r in (c.get("/api/rag/sources", params={"offset": 10**30}),
              c.get("/api/rag/status", params={"offset": 10**30}),
              c.post("/api/rag/search", json={"query": "nvda", "top_k": 10**30}),
              c.post("/api/rag/context", json={"query": "nvda", "token_budget": 10**30}),
              c.post("/api/rag/similar", json={"ref": "good.md", "top_k": 10**30})):
        assert r.status_code == 422 and error_code(r) == "invalid_input", r.text


def test_keys_scopes_and_read_only_embed_text(keyed):
    c = keyed["c"]
    spec = c.get("/openapi.json").json()
    routes = [(m.upper(), p.replace("{ref}", "good.md")) for p, ops in spec["paths"].items() for m in ops
              if p != "/health"]
    assert len(routes) >= 8
    bodies = {"/api/rag/search": {"query": "x"}, "/api/rag/context": {"query": "x"},
              "/api/rag/similar": {"ref": "good.md"}, "/api/rag/embed": {"path": "good.md"},
              "/api/rag/embed-text": {"text": "x"}}
    for method, path in routes:  # every route with a valid body: no key and a wrong key are 401
        for headers in ({"X-API-Key": ""}, {"X-API-Key": FULL[:-1] + "x"}, {"X-API-Key": "", "Authorization": "Bearer nope"}):
            r = c.request(method, path, headers=headers, json=bodies.get(path, {}) if method == "POST" else None)
            if method == "POST" and path not in bodies:  # a route added later: never served without a key
                assert r.status_code in (401, 422), (method, path)
                continue
            assert r.status_code == 401 and error_code(r) == "unauthorized", (method, path)
    ro = {"X-API-Key": READ}
    for method, path, body in (("POST", "/api/rag/embed", {"path": "good.md"}),
                               ("POST", "/api/rag/embed-text", {"text": "vector please"}),
                               ("DELETE", "/api/rag/sources/good.md", None)):
        r = c.request(method, path, headers=ro, json=body)
        assert r.status_code == 403 and error_code(r) == "forbidden", (path, r.text)
    assert c.post("/api/rag/embed-text", json={"text": "vector please"}).status_code == 200
    good_still_found(c)


def test_status_pages_its_skipped_rows(keyed):
    c = keyed["c"]
    for n in range(3):  # skipped rows of the corpus plus whatever the other cases left
        c.post("/api/rag/embed", json={"name": f"skips/s{n}.yaml", "content": "- a list\n"})
    full = c.get("/api/rag/status", params={"limit": 1000}).json()
    total = full["skipped_total"]
    assert total == len(full["skipped"]) and total >= 1
    page = c.get("/api/rag/status", params={"limit": 1, "offset": 0}).json()
    assert len(page["skipped"]) == 1 and page["skipped_total"] == total
    assert page["skipped_next_offset"] == (1 if total > 1 else None)
    assert c.get("/api/rag/status", params={"limit": 1001}).status_code == 422


def test_limits_413_and_422_still_hold(keyed):
    c = keyed["c"]
    big = c.post("/api/rag/embed", json={"name": "big.md", "content": "y" * 2_000_000})
    assert big.status_code == 413 and error_code(big) == "payload_too_large"
    long_q = c.post("/api/rag/search", json={"query": "q" * 5000})
    assert long_q.status_code == 422 and error_code(long_q) == "invalid_input"
    deep_json = c.post("/api/rag/search", content=b"[" * 100_000, headers={"content-type": "application/json"})
    assert 400 <= deep_json.status_code < 500
    assert keyed["proc"].poll() is None


def test_every_500_carries_its_request_id_and_no_detail(database_url: str, provider, tmp_path: Path):
    """A route failing unexpectedly (an injected fault) answers 500 with the request id in body and
    header, and only the log holds the detail."""
    from fastapi.testclient import TestClient

    from rag_lib.api import KnowledgeBase
    from rag_lib.config import Settings
    from rag_lib.errors import DatabaseError
    from rag_lib.server import create_app
    from rag_lib.server.security import KeyRing

    class Faulty(KnowledgeBase):
        def status(self, collection=None):
            raise RuntimeError("boom at /srv/secret/data.db")

        def list_documents(self, collection=None, limit=1000, offset=0):
            raise DatabaseError('relation "rag_documents" does not exist at /var/lib/pg')

    settings = Settings(database_url=database_url, home=tmp_path / ".rag")
    kb = Faulty(settings, provider=provider)
    app = create_app(settings, kb=kb, keys=KeyRing(write=(), read=()), bind=("127.0.0.1", 8000))
    try:
        with TestClient(app, base_url="http://127.0.0.1:8000", raise_server_exceptions=False) as c:
            r = c.get("/api/rag/status", headers={"X-Request-ID": "req-500-check"})
            assert r.status_code == 500 and r.headers["x-request-id"] == "req-500-check"
            assert r.json()["error"] == {"code": "internal_error", "request_id": "req-500-check",
                                         "message": "internal error; see the server log for this request id"}
            d = c.get("/api/rag/sources")
            assert d.status_code == 503 and error_code(d) == "database_error"
            assert "relation" not in d.text and "/var/lib" not in d.text
    finally:
        kb.close()


@pytest.fixture(scope="module")
def loopback(pg_server: str, tmp_path_factory):
    """A server without keys (loopback mode) on 127.0.0.1."""
    tmp = tmp_path_factory.mktemp("hostile_loopback")
    server = serve(create_database(pg_server), tmp / ".rag", keys=False,
                   RAG_SERVER__ALLOWED_ORIGINS=json.dumps(["https://desk.example"]))
    yield {"url": server.url, "proc": server.proc}
    server.stop()


def test_loopback_mode_refuses_foreign_host_and_origin(loopback):
    base = loopback["url"]
    port = base.rsplit(":", 1)[1]
    q = {"query": "zirconium refiners", "top_k": 1}
    with httpx.Client(base_url=base, timeout=120) as c:
        assert c.post("/api/rag/embed", json={"name": "n.md", "content": GOOD}).json()["new"] == 1
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}", "a@127.0.0.1"):
            r = c.post("/api/rag/search", json=q, headers={"Host": host})
            assert r.status_code == 421 and error_code(r) == "host_not_allowed", host
            assert c.get("/health", headers={"Host": host}).status_code == 421
        for origin in ("http://evil.example", f"http://evil.example:{port}", "null", "file://"):
            r = c.post("/api/rag/search", json=q, headers={"Origin": origin})
            assert r.status_code == 403 and error_code(r) == "origin_not_allowed", origin
        r = c.post("/api/rag/embed", json={"name": "x.md", "content": "# x\n"}, headers={"Origin": "http://evil.example"})
        assert r.status_code == 403
        for host, origin in ((f"127.0.0.1:{port}", None), (f"localhost:{port}", f"http://localhost:{port}"),
                             (f"127.0.0.1:{port}", "http://127.0.0.1:3000"), ("localhost", "https://desk.example")):
            headers = {"Host": host} | ({"Origin": origin} if origin else {})
            assert c.post("/api/rag/search", json=q, headers=headers).status_code == 200, (host, origin)
