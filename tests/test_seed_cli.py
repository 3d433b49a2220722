"""The seeds' CLI (shared/seeds 000 §5.1, 004): `rag search --type/--since`, `rag validate` of the
database, `rag reembed --version V`, `rag reset`, `rag status` index stats, `rag metrics`, and the
search metrics every search records (table and `RAG_METRICS` JSONL)."""

from __future__ import annotations

import json
import re

import psycopg
import pytest

import rag_lib.api

NVDA = "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml"
NFLX = "tradegent/knowledge/analysis/earnings/NFLX_20250118T0800.yaml"
MSFT = "tradegent/knowledge/analysis/stock/MSFT_20260220T1805.yaml"
RESEARCH = "tradegent/knowledge/analysis/research/AI_CAPEX_20250110T0800.yaml"


# These tests are about the CLI, not embedding: their databases start with the shared corpus's
# vectors cached (`reembed --version` still misses: the cache is keyed per embed version).
pytestmark = pytest.mark.warm_cache


@pytest.fixture
def ingested(rag, corpus_copy):
    root = corpus_copy(NVDA, NFLX, MSFT, RESEARCH)
    code, out, err = rag("ingest", str(root), "--json")
    assert code == 0, err
    assert json.loads(out)["new"] == 4
    return root


def _results(rag, *args: str) -> list[dict]:
    code, out, err = rag("search", *args, "--json")
    assert code == 0, err
    return json.loads(out)["results"]


def test_search_type_and_since_as_the_seeds_write_them(rag, ingested):
    # seed 000 §5.1: rag search "QUERY" --type earnings-analysis / --since 2026-01-01 / --ticker / --section
    hits = _results(rag, "earnings guidance and risks", "--type", "earnings-analysis")
    assert hits and {h["doc_type"] for h in hits} == {"earnings-analysis"}
    assert _results(rag, "earnings guidance and risks", "--doc-type", "earnings-analysis") == hits  # today's name
    hits = _results(rag, "cloud growth", "--since", "2026-01-01")
    assert hits and all(h["doc_date"] >= "2026-01-01" for h in hits)
    assert {h["path"] for h in hits} == {MSFT}
    assert _results(rag, "cloud growth", "--from", "2026-01-01") == hits
    assert {h["ticker"] for h in _results(rag, "earnings", "--ticker", "NVDA")} == {"NVDA"}
    assert rag("search", "what could go wrong", "--section", "risks")[0] == 0


def test_research_analysis_is_the_type_name(rag, ingested):
    hits = _results(rag, "AI capital expenditure", "--type", "research-analysis")
    assert hits and {h["doc_type"] for h in hits} == {"research-analysis"}
    assert _results(rag, "AI capital expenditure", "--type", "research") == hits
    code, out, _ = rag("status", "--json")
    assert json.loads(out)["by_type"]["research-analysis"] == 1


def test_status_shows_index_stats(rag, ingested):
    assert rag("reindex")[0] == 0
    code, out, _ = rag("status", "--json")
    data = json.loads(out)
    assert code == 0 and data["index_size_mb"] > 0
    hnsw = data["index"]["hnsw"]
    assert hnsw and hnsw[0]["m"] == 16 and hnsw[0]["ef_construction"] == 256 and hnsw[0]["rows_indexed"] > 0
    code, out, _ = rag("status")
    assert "index size" in out and "HNSW" in out


def test_validate_without_path_checks_the_database(rag, ingested, database_url):
    code, out, _ = rag("validate", "--json")
    report = json.loads(out)
    assert code == 0 and report["problems"] == 0 and report["chunks"] > 0
    with psycopg.connect(database_url, autocommit=True) as conn:  # an embedding goes missing
        chunk = conn.execute("DELETE FROM rag_chunk_vectors WHERE chunk_id = "
                             "(SELECT min(chunk_id) FROM rag_chunk_vectors) RETURNING chunk_id").fetchone()[0]
        conn.execute("UPDATE rag_chunks SET doc_hash = 'stale' WHERE chunk_id = "
                     "(SELECT max(chunk_id) FROM rag_chunks)")
    code, out, _ = rag("validate", "--json")
    report = json.loads(out)
    assert code == 1 and report["problems"] == 2
    assert report["chunks_without_vector"]["ids"] == [chunk]
    assert report["chunks_with_stale_hash"]["count"] == 1
    code, out, _ = rag("validate")
    assert code == 1 and "2 problems" in out


def test_reembed_version_reembeds_documents_of_that_version(rag, ingested, monkeypatch):
    # seed 000: rag reembed --version 1.0.0  ("re-embed docs embedded with older version")
    monkeypatch.setenv("RAG_EMBEDDING__EMBED_VERSION", "2")
    code, out, err = rag("reembed", "--version", "1", "--json")
    data = json.loads(out)
    assert code == 0, err
    assert data["documents"] == 4 and data["reembedded"] == 4 and data["failed"] == 0
    assert data["texts_embedded"] == data["chunks"] > 0 and data["chunks_from_cache"] == 0  # version 2 misses version 1's cache: really re-embedded
    code, out, _ = rag("reembed", "--version", "1", "--json")
    assert json.loads(out)["documents"] == 0  # nothing is left on version 1
    code, out, _ = rag("reembed", "--version", "1.0.0")  # seed 000's runbook spelling: said, not silent
    assert code == 0 and "no document is embedded under embed_version 1.0.0" in out and "today's version is 2" in out
    code, out, _ = rag("reembed", "--version", "2", "--json")
    assert json.loads(out)["documents"] == 4
    code, out, _ = rag("reembed", "--all", "--json")
    assert json.loads(out)["reembedded"] == 4


def test_reembed_cli_does_not_use_the_orchestrator():
    import ast
    from pathlib import Path

    source = Path(rag_lib.api.__file__).parent / "cli" / "reembed.py"
    imported = {n.module for n in ast.walk(ast.parse(source.read_text())) if isinstance(n, ast.ImportFrom)}
    assert not any(m and (m.startswith("pipelines") or m == "rag_lib.cli.dagster") for m in imported)


def test_cli_uses_the_facade_only():
    from pathlib import Path

    modules = sorted((Path(rag_lib.api.__file__).parent / "cli").glob("*.py"))
    assert len(modules) > 1, "rag_lib/cli/ moved: point this test at the CLI's modules"
    for path in modules:
        if path.name == "dagster.py":  # moving to pipelines/ (h14ops)
            continue
        text = path.read_text()
        assert not re.search(r"(kb\(\)|base|STATE\[\"kb\"\])\.(store|provider)\b", text), path.name


def test_reset_drops_and_recreates(rag, ingested, database_url):
    code, _, err = rag("reset")
    assert code == 2 and "--yes" in err
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE INDEX rag_test_marker ON rag_chunks (ordinal)")  # gone only if the table is dropped
    code, out, _ = rag("reset", "--yes")
    assert code == 0 and "recreated" in out
    with psycopg.connect(database_url, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('rag_test_marker')").fetchone()[0] is None
        from rag_lib.store import migration_files

        assert conn.execute("SELECT count(*) FROM rag_schema_migrations").fetchone()[0] == len(migration_files())
    code, out, _ = rag("status", "--json")
    assert json.loads(out)["documents"] == 0


def test_every_search_is_recorded_and_summarised(rag, ingested, tmp_path, monkeypatch):
    log = tmp_path / "logs" / "rag_metrics.jsonl"
    monkeypatch.setenv("RAG_METRICS", str(log))  # seed 004: logs/rag_metrics.jsonl
    first = _results(rag, "NVDA earnings guidance", "--mode", "hybrid")
    _results(rag, "compare NVDA and NFLX earnings", "--mode", "hybrid")
    _results(rag, "zzqqxx unmatched gibberish", "--mode", "lexical")
    _results(rag, "cloud growth", "--since", "2026-01-01")
    code, out, _ = rag("metrics", "--json")
    data = json.loads(out)
    assert code == 0 and data["searches"] == 4
    assert set(data["by_mode"]) == {"hybrid", "lexical", "semantic"}
    assert data["by_mode"]["hybrid"]["searches"] == 2 and data["by_mode"]["hybrid"]["p95_ms"] > 0
    assert data["zero_result_rate"] == 0.25 and data["by_mode"]["lexical"]["zero_result_rate"] == 1.0
    assert data["query_classes"].get("comparison") == 1
    assert any("per-ticker" in s for s in data["strategies"])
    emb = data["embedding"]
    assert emb["calls"] >= 4 and emb["failure_rate"] == 0.0 and emb["fallback_share"] == 0.0  # ingest + 3 embeds
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["query"] for x in lines][0] == "NVDA earnings guidance" and len(lines) == 4
    assert {"query_class", "mode", "strategy", "results", "top_score", "latency_ms", "stages_ms", "at"} <= set(lines[0])
    # seed 004's SearchMetrics fields beside ours, with the seed's meaning, so its tooling reads the log
    seed = {"query", "query_type", "strategy", "retrieval_count", "reranked", "top_similarity", "latency_ms",
            "timestamp", "relevance_feedback", "context_used"}
    for line in lines:
        assert seed <= set(line)
        assert line["query_type"] == line["query_class"] and line["retrieval_count"] == line["results"]
        assert line["timestamp"] == line["at"] and isinstance(line["latency_ms"], int)
        assert line["relevance_feedback"] is None and line["context_used"] is None
    # top_similarity is the first hit's cosine with the query, not the fused score of hybrid mode
    assert lines[0]["top_similarity"] == pytest.approx(first[0]["similarity"], abs=1e-6)
    assert 0 < lines[0]["top_similarity"] <= 1 and lines[0]["top_similarity"] != pytest.approx(lines[0]["top_score"])
    assert lines[1]["query_type"] == "comparison"
    assert lines[2]["retrieval_count"] == 0 and lines[2]["top_similarity"] is None  # no hit, no similarity
    code, out, _ = rag("metrics", "--since", "2999-01-01", "--json")
    assert json.loads(out)["searches"] == 0
    code, out, _ = rag("metrics", "--since", "7d")
    assert code == 0 and "4 searches" in out and "p95" in out
    code, _, err = rag("metrics", "--since", "last tuesday")
    assert code == 1 and "since must be" in err


def test_metrics_can_be_switched_off(rag, ingested, monkeypatch):
    monkeypatch.setenv("RAG_METRICS", "false")
    _results(rag, "NVDA earnings guidance")
    monkeypatch.delenv("RAG_METRICS")
    code, out, _ = rag("metrics", "--json")
    assert json.loads(out)["searches"] == 0


def test_metrics_on_write_no_file_that_is_not_named(rag, ingested, tmp_path, monkeypatch):
    """Seed 004 appended to logs/rag_metrics.jsonl in the working directory whenever metrics were on
    (its RAG_METRICS defaults to true); here `true` (or nothing) records to the table only."""
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    for value in ("true", None):
        if value is None:
            monkeypatch.delenv("RAG_METRICS")
        else:
            monkeypatch.setenv("RAG_METRICS", value)
        _results(rag, "NVDA earnings guidance")
    code, out, _ = rag("metrics", "--json")
    assert code == 0 and json.loads(out)["searches"] == 2
    assert list(workdir.iterdir()) == []


def test_embed_dir_and_section_as_seed_000_writes_them(rag, corpus_copy):
    # seed 000 §5.1: `rag embed --dir DIR`, `rag search "QUERY" --section risks` (section_label ILIKE '%risk%')
    root = corpus_copy(NVDA, NFLX)
    code, out, err = rag("embed", "--dir", str(root), "--json")
    assert code == 0, err
    assert json.loads(out)["new"] == 2
    code, _, err = rag("embed", "--dir", str(root / NVDA))
    assert code == 2 and "not a directory" in err
    hits = _results(rag, "what could go wrong", "--section", "RISK", "--chunks")
    assert hits and all("risk" in h["section_path"].lower() for h in hits)
    assert {h["section"] for h in hits} != {"RISK"}  # a part of the name matches, in any case


def test_mcp_help_lists_every_tool_it_serves(rag):
    import anyio

    from rag_lib.mcp_server import create_mcp

    served = [t.name for t in anyio.run(create_mcp(lambda: None).list_tools)]
    assert len(served) == 15
    code, out, _ = rag("mcp", "--help")
    assert code == 0
    assert all(re.search(rf"^\W*{name}\b", out, re.M) for name in served), out
    assert re.search(r"rag_embed \(not with --read-only\)", out)


@pytest.mark.subprocess
def test_python_m_mcp_server_serves_the_tools(tmp_path, database_url):
    """`python -m rag_lib.mcp_server` is an entry point: it speaks MCP over stdio like `rag mcp`."""
    import os
    import sys
    from pathlib import Path

    import anyio
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    from testkit import child_env

    env = child_env(database_url, tmp_path / ".rag", PYTHONPATH=os.pathsep.join(
        [str(Path(rag_lib.api.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    params = StdioServerParameters(command=sys.executable, args=["-m", "rag_lib.mcp_server"], env=env)

    async def run() -> set[str]:
        with open(tmp_path / "mcp.err", "w") as errlog:  # pytest's captured stderr has no file descriptor
            async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=60) as client:
                return {t.name for t in (await client.list_tools()).tools}

    assert {"rag_search", "rag_search_rerank", "rag_embed", "rag_evaluate"} <= anyio.run(run)
