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
    """A document of `n` top-level keys of a short sentence each: one chunk per key, and one for its
    `_meta` (a descriptor section): `n + 1` chunks."""
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
        assert r.status_code == 422, r.text[:300]
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
        assert r.status_code == 504, r.text[:300]
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


@pytest.fixture
def upload_client(database_url: str, tmp_path: Path, provider):
    settings = settings_for(database_url, tmp_path / ".rag",
                            limits={"max_chunks_per_document": 50, "max_chunks_per_request": 80})
    client, kb = client_for(settings, provider)
    with client, kb:
        client.headers["X-API-Key"] = FULL
        yield client, settings


@pytest.mark.timeout(300)
def test_upload_over_the_document_chunk_limit_is_refused_with_its_number(upload_client, provider):
    client, settings = upload_client
    calls = provider.calls
    r = client.post("/api/rag/embed", json={"name": "big.yaml", "content": sections_yaml(120)})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "limit_exceeded"
    assert "121 chunks" in error["message"] and "limits.max_chunks_per_document=50" in error["message"]
    assert provider.calls == calls  # refused before anything was embedded
    assert client.get("/api/rag/sources").json()["items"] == []
    assert not (settings.server.upload_dir / "default" / "big.yaml").exists()  # nothing left on disk
    # under the limit: the same kind of document goes in
    r = client.post("/api/rag/embed", json={"name": "small.yaml", "content": sections_yaml(40)})
    assert r.status_code == 200 and r.json()["chunks"] == 41, r.text


@pytest.mark.timeout(300)
def test_upload_over_the_request_chunk_limit_is_refused_with_its_number(upload_client, provider):
    client, _ = upload_client
    # 100 records of one chunk each: every document is under its limit, the request is not
    body = "".join(json.dumps({"_id": f"r{i}", "text": f"record {i} on margins and guidance"}) + "\n"
                   for i in range(100))
    calls = provider.calls
    r = client.post("/api/rag/embed", json={"name": "many.jsonl", "content": body})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "limit_exceeded" and "limits.max_chunks_per_request=80" in error["message"]
    assert "81 chunks" in error["message"]
    assert provider.calls == calls
    assert client.get("/api/rag/sources").json()["items"] == []


@pytest.mark.timeout(300)
def test_mcp_embed_over_the_document_chunk_limit_is_a_tool_error_with_its_number(database_url, tmp_path, provider):
    settings = settings_for(database_url, tmp_path / ".rag", limits={"max_chunks_per_document": 50})
    kb = KnowledgeBase(settings, provider=provider)

    async def call() -> tuple[bool, str]:
        async with Client(create_mcp(lambda: kb)) as client:
            result = await client.call_tool("rag_embed", {"name": "big.yaml", "content": sections_yaml(120)})
            return result.is_error, " ".join(getattr(c, "text", "") for c in result.content)

    with kb:
        calls = provider.calls
        is_error, text = anyio.run(call)
        assert is_error, text
        assert "limit_exceeded: " in text and "121 chunks" in text and "limits.max_chunks_per_document=50" in text
        assert provider.calls == calls and kb.list_documents() == []


@pytest.mark.timeout(300)
def test_cli_ingest_skips_a_document_over_the_chunk_limit_with_the_reason(tmp_path: Path, monkeypatch, rag):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "big.yaml").write_text(sections_yaml(120))
    (root / "good.md").write_text("# Good\n\n## Thesis\n\nZirconium refiners gain from the reactor build-out.\n")
    monkeypatch.setenv("RAG_LIMITS__MAX_CHUNKS_PER_DOCUMENT", "50")
    code, out, err = rag("ingest", str(root), "--json")
    assert code == 0, err
    files = {f["path"]: f for f in json.loads(out)["files"]}
    assert files["good.md"]["status"] == "new"
    assert files["big.yaml"]["status"] == "skipped" and files["big.yaml"]["reason"] == "too_many_chunks"
    assert "121 chunks" in files["big.yaml"]["detail"]
    assert "limits.max_chunks_per_document=50" in files["big.yaml"]["detail"]
    code, out, _ = rag("status", "--json")
    skipped = {s["path"]: s for s in json.loads(out)["skipped"]}
    assert skipped["big.yaml"]["reason"] == "too_many_chunks"


@pytest.mark.timeout(300)
def test_an_upload_is_parsed_once_in_the_sandbox_not_again_in_the_server(upload_client, caplog):
    client, _ = upload_client
    logger = logging.getLogger("rag_lib")  # it does not propagate to the root logger caplog listens on
    caplog.set_level(logging.DEBUG, logger="rag_lib")
    # an earlier server in this process may have set the request log's own level (setup_server_logging)
    caplog.set_level(logging.DEBUG, logger="rag_lib.server")
    logger.addHandler(caplog.handler)
    try:
        r = client.post("/api/rag/embed", json={"name": "once.yaml", "content": sections_yaml(10)})
    finally:
        logger.removeHandler(caplog.handler)
    assert r.status_code == 200 and r.json()["chunks"] == 11, r.text
    parses = [getattr(rec, "where", None) for rec in caplog.records if rec.getMessage() == "document parsed"]
    assert parses == ["sandbox"]
    # and what the sandbox parsed is what got published
    shown = client.get("/api/rag/sources/once.yaml").json()
    assert [s["name"] for s in shown["sections"]] == ["_meta"] + [f"k{i:05d}" for i in range(10)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dagster_skips_a_file_over_the_chunk_limit_and_publishes_the_others(database_url, provider, tmp_path,
                                                                            monkeypatch):
    import warnings

    from dagster import instance_for_test, materialize

    warnings.filterwarnings("ignore", category=Warning, module="dagster")
    from pipelines.assets import ASSETS
    from pipelines.partitions import CORPUS_FILES, PartitionMap, range_tags
    from pipelines.resources import RagResource, preload_provider
    from rag_lib.models import CorpusRoot

    monkeypatch.setenv("RAG_LIMITS__MAX_CHUNKS_PER_DOCUMENT", "50")
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "big.yaml").write_text(sections_yaml(120))
    (root / "good.md").write_text("# Good\n\n## Thesis\n\nZirconium refiners gain from the reactor build-out.\n")
    home = tmp_path / ".rag"
    settings = Settings(database_url=database_url, home=home)
    preload_provider(settings, provider)
    with KnowledgeBase(settings, provider=provider) as kb:
        kb.add_root(root)
    with instance_for_test() as instance:
        keys = list(PartitionMap([CorpusRoot(root.resolve(), "default", root.name)]).files())
        instance.add_dynamic_partitions(CORPUS_FILES, keys)
        result = materialize(ASSETS, instance=instance, tags=range_tags(keys[0], keys[-1]),
                             resources={"rag": RagResource(database_url=database_url, home=str(home))})
        assert result.success
        meta = {(ev.step_materialization_data.materialization.asset_key.to_user_string(), ev.partition):
                ev.step_materialization_data.materialization.metadata for ev in result.get_asset_materialization_events()}
    assert meta[("chunks", "corpus/big.yaml")]["status"].value == "skipped"
    assert meta[("chunks", "corpus/big.yaml")]["skip_reason"].value == "too_many_chunks"
    assert "limits.max_chunks_per_document=50" in meta[("chunks", "corpus/big.yaml")]["skip_detail"].value
    assert meta[("vector_table", "corpus/big.yaml")]["status"].value == "skipped"
    assert meta[("vector_table", "corpus/good.md")]["status"].value == "ok"
    with KnowledgeBase(settings, provider=provider) as kb:
        assert [d["path"] for d in kb.list_documents()] == ["good.md"]
        assert {s["path"]: s["reason"] for s in kb.status()["skipped"]} == {"big.yaml": "too_many_chunks"}


@pytest.mark.timeout(600)
def test_a_search_query_does_not_wait_for_a_running_ingest_batch(provider):
    """A query is encoded while a large batch (an upload's chunks) is still encoding: before, the
    query took the model's lock the batch held for its whole length and waited minutes."""
    import threading

    texts = [f"batch text {i} about margins, guidance and stop levels in the quarter" for i in range(600)]
    calls = provider.calls
    batch = threading.Thread(target=provider.embed, args=(texts,), daemon=True)
    batch.start()
    while provider.calls == calls:  # the batch has started encoding
        threading.Event().wait(0.01)
    vector = provider.embed(["which trades hit their stop?"])
    assert vector.shape == (1, 384)
    assert batch.is_alive()  # the query did not wait for the batch to finish
    batch.join()
