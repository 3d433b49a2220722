"""The settings reference: every setting documented with its default, docs/settings.md current, and
`rag config` showing the value in force and where it came from."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rag_lib.cli import app
from rag_lib.settings_doc import reference_markdown, setting_docs

ROOT = Path(__file__).resolve().parents[1]


def test_every_setting_has_a_description():
    """A new setting needs a comment in rag_lib/config.py: it is the setting's documentation."""
    undocumented = [doc.name for doc in setting_docs() if not doc.description]
    assert not undocumented, f"describe these in rag_lib/config.py: {undocumented}"
    names = {doc.name for doc in setting_docs()}
    assert {"search.top_k", "search.link_margin", "pipeline.roots[].collection", "limits.max_depth"} <= names


def test_docs_settings_md_is_current():
    """docs/settings.md is generated from the code; `make settings-doc` writes it again."""
    text = (ROOT / "docs" / "settings.md").read_text()
    assert text.strip() == reference_markdown().strip(), "docs/settings.md is stale: run `make settings-doc`"
    assert "| `search.top_k` | `RAG_SEARCH__TOP_K` | int | `10` |" in text


def test_rag_config_shows_value_source_and_redacts(tmp_path, monkeypatch):
    (tmp_path / "rag.yaml").write_text("search:\n  convex_alpha: 0.6\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAG_CONFIG", raising=False)
    monkeypatch.delenv("RAG_HOME", raising=False)  # the suite's workers set it
    monkeypatch.setenv("RAG_SEARCH__TOP_K", "7")
    monkeypatch.setenv("RAG_DATABASE_URL", "postgresql://reader:s3cret@db.example/rag")
    from rag_lib.config import get_settings

    get_settings.cache_clear()
    try:
        out = CliRunner().invoke(app, ["config", "--changed", "--json"])
        assert out.exit_code == 0, out.output
        rows = {r["name"]: r for r in json.loads(out.output)}
        assert rows["search.top_k"]["value"] == 7 and rows["search.top_k"]["source"] == "$RAG_SEARCH__TOP_K"
        assert rows["search.convex_alpha"]["value"] == 0.6 and rows["search.convex_alpha"]["source"] == "rag.yaml"
        assert rows["search.convex_alpha"]["default"] == 0.5
        assert "s3cret" not in out.output and rows["database_url"]["value"] == "postgresql://reader:***@db.example/rag"
        assert "search.link_margin" not in rows  # --changed: defaults left out

        out = CliRunner().invoke(app, ["config", "search.link_margin"])
        assert out.exit_code == 0 and "0.1" in out.output and "(default)" in out.output
        assert "hubness" in out.output  # the description

        out = CliRunner().invoke(app, ["config", "serch"])
        assert out.exit_code == 2 and "did you mean 'search'" in out.output
        # a value another setting chose (the provider's model and size) is not called a default
        get_settings.cache_clear()
        monkeypatch.setenv("EMBED_PROVIDER", "ollama")
        rows = {r["name"]: r for r in json.loads(CliRunner().invoke(app, ["config", "--changed", "--json"]).output)}
        assert rows["embedding.dimensions"]["value"] == 768 and rows["embedding.dimensions"]["default"] == 384
        assert rows["embedding.dimensions"]["source"] == "embedding.provider's default"
        assert "home" not in rows  # a path default is compared as the value it is
    finally:
        get_settings.cache_clear()


def test_seed_min_tokens_is_named_not_silently_kept(tmp_path, monkeypatch, caplog):
    """chunking.min_tokens did nothing; a settings file giving it is told so instead of being obeyed in name only."""
    import logging

    from rag_lib.config import Settings

    (tmp_path / "rag.yaml").write_text("chunking:\n  max_tokens: 180\n  min_tokens: 50\n")
    monkeypatch.setenv("RAG_CONFIG", str(tmp_path / "rag.yaml"))
    with caplog.at_level(logging.WARNING, logger="rag_lib.config"):
        s = Settings()
    assert s.chunking.max_tokens == 180 and not hasattr(s.chunking, "min_tokens")
    assert any("chunking.min_tokens is ignored" in r.getMessage() for r in caplog.records)
