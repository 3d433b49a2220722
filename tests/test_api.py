"""The Python API: module-level functions on a default knowledge base, and KnowledgeBase methods."""

from __future__ import annotations

import numpy as np
import pytest

import rag_lib
import rag_lib.api
from rag_lib.config import get_settings
from rag_lib.errors import NotFoundError, ValidationError

TRADE = "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml"


@pytest.fixture
def default_kb(monkeypatch, database_url, provider, tmp_path):
    monkeypatch.setenv("RAG_DATABASE_URL", database_url)
    monkeypatch.setenv("RAG_HOME", str(tmp_path / ".rag"))
    monkeypatch.setattr(rag_lib.api, "get_provider", lambda settings: provider)
    monkeypatch.setattr(rag_lib.api, "_default", None)
    get_settings.cache_clear()
    yield
    if rag_lib.api._default is not None:
        rag_lib.api._default.close()
    get_settings.cache_clear()


def test_module_level_api_round_trip(default_kb, corpus_copy):
    root = corpus_copy(TRADE)
    report = rag_lib.embed_document(root / TRADE, root=root)
    assert report.count("new") == 1 and report.outcomes[0].path == TRADE
    vector = rag_lib.embed_text("NVDA earnings trade")
    assert vector.shape == (384,) and np.isclose(np.linalg.norm(vector), 1.0, atol=1e-4)
    hits = rag_lib.search("why did the NVDA trade enter at support", top_k=3).hits
    assert hits and hits[0].path == TRADE
    status = rag_lib.status()
    assert status["documents"] == 1 and status["active_space"]["dimensions"] == 384
    assert rag_lib.delete_document("TRD-2025-001") == [TRADE]
    assert rag_lib.status()["documents"] == 0
    again = rag_lib.ingest([root])
    assert again.count("new") == 1 and again.embedded == 0  # vectors come from the cache


def test_api_errors_are_typed(default_kb, tmp_path):
    with pytest.raises(ValidationError):
        rag_lib.embed_text("  ")
    with pytest.raises(ValidationError):
        rag_lib.embed_document(tmp_path)
    with pytest.raises(NotFoundError):
        rag_lib.delete_document("nope")
