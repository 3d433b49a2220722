"""The seeds' environment variables (shared/seeds 000, 001, 004) as aliases of today's settings;
fallback members without their API key are skipped; `research-analysis` is the type's name."""

from __future__ import annotations

import logging

import pytest

from rag_lib import config
from rag_lib.config import Settings
from rag_lib.embedding import get_provider
from rag_lib.embedding.chain import FallbackProvider
from rag_lib.errors import ConfigError

SEED_VARS = ("EMBED_PROVIDER", "EMBED_MODEL", "EMBED_DIMENSIONS", "LLM_BASE_URL", "LLM_API_KEY", "CHUNK_MAX_TOKENS",
             "CHUNK_OVERLAP", "RAG_RERANKING", "RAG_ADAPTIVE", "RAG_METRICS", "PG_HOST", "PG_PORT", "PG_USER",
             "PG_PASS", "PG_DB", "RAG_CHUNKING__OVERLAP_TOKENS", "RAG_DATABASE_URL", "RAG_EMBEDDING__MODEL",
             "OPENAI_API_KEY", "OPENROUTER_API_KEY", "RAG_CONFIG", "RAG_EMBEDDING__PROVIDER")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in SEED_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(config, "_LOGGED_CONFLICTS", set())
    monkeypatch.setattr(config, "_LOGGED_IGNORED", set(), raising=False)
    monkeypatch.chdir(tmp_path)  # no rag.yaml of the working directory


def test_seed_004_chunking_and_feature_flags(monkeypatch):
    # seed 004: `CHUNK_MAX_TOKENS=768 CHUNK_OVERLAP=150 python -c ...`, `export RAG_RERANKING=false`
    monkeypatch.setenv("CHUNK_MAX_TOKENS", "768")
    monkeypatch.setenv("CHUNK_OVERLAP", "150")
    monkeypatch.setenv("RAG_RERANKING", "false")
    monkeypatch.setenv("RAG_ADAPTIVE", "false")
    s = Settings()
    assert (s.chunking.max_tokens, s.chunking.overlap_tokens) == (768, 150)
    assert s.search.rerank is False
    assert s.search.routing is False


def test_rag_metrics_flag_or_file(monkeypatch, tmp_path):
    monkeypatch.setenv("RAG_METRICS", "false")
    assert Settings().search_metrics.enabled is False
    monkeypatch.setenv("RAG_METRICS", str(tmp_path / "logs/rag_metrics.jsonl"))
    s = Settings()
    assert s.search_metrics.enabled and s.search_metrics.jsonl_path == tmp_path / "logs/rag_metrics.jsonl"


def test_seed_000_embedding_variables(monkeypatch):
    # seed 000's fallback chain: ollama at ${LLM_BASE_URL:-http://localhost:11434}, ${EMBED_MODEL}, ${EMBED_DIMENSIONS}
    monkeypatch.setenv("EMBED_PROVIDER", "ollama")
    monkeypatch.setenv("EMBED_MODEL", "nomic-embed-text")
    monkeypatch.setenv("EMBED_DIMENSIONS", "1536")
    monkeypatch.setenv("LLM_BASE_URL", "http://localhost:11434")
    s = Settings()
    e = s.embedding
    assert (e.provider, e.model, e.dimensions, e.base_url) == ("openai_compatible", "nomic-embed-text", 1536,
                                                             "http://localhost:11434/v1")
    monkeypatch.setenv("EMBED_PROVIDER", "openrouter")
    monkeypatch.delenv("LLM_BASE_URL")
    monkeypatch.setenv("LLM_API_KEY", "sk-or-test")
    e = Settings().embedding
    assert e.base_url == "https://openrouter.ai/api/v1" and e.api_key_env == "LLM_API_KEY"
    monkeypatch.setenv("EMBED_PROVIDER", "openai")  # seed 001: `EMBED_PROVIDER=openai`, key in OPENAI_API_KEY
    e = Settings().embedding
    assert e.provider == "openai" and e.api_key_env == "OPENAI_API_KEY"


def test_seed_001_postgres_variables(monkeypatch):
    monkeypatch.setenv("PG_HOST", "localhost")
    monkeypatch.setenv("PG_PORT", "5433")
    monkeypatch.setenv("PG_USER", "lightrag")
    monkeypatch.setenv("PG_PASS", "p@ss/word")
    monkeypatch.setenv("PG_DB", "lightrag")
    assert Settings().database_url == "postgresql://lightrag:p%40ss%2Fword@localhost:5433/lightrag"


def test_todays_names_win_and_a_conflict_is_logged_once(monkeypatch, caplog):
    monkeypatch.setenv("CHUNK_OVERLAP", "150")
    monkeypatch.setenv("RAG_CHUNKING__OVERLAP_TOKENS", "40")
    monkeypatch.setenv("EMBED_MODEL", "nomic-embed-text")
    monkeypatch.setenv("RAG_EMBEDDING__MODEL", "nomic-embed-text")  # same value: no conflict
    monkeypatch.setenv("PG_HOST", "elsewhere")
    monkeypatch.setenv("RAG_DATABASE_URL", "postgresql://u@here:5432/db")
    with caplog.at_level(logging.WARNING, logger="rag_lib.config"):
        first = Settings()
        Settings()
    assert first.chunking.overlap_tokens == 40
    assert first.database_url == "postgresql://u@here:5432/db"
    conflicts = [r.getMessage() for r in caplog.records if "both $" in r.getMessage()]
    assert len(conflicts) == 2, conflicts
    assert any("CHUNK_OVERLAP" in m for m in conflicts) and any("PG_" in m for m in conflicts)


def test_bad_seed_value_is_a_config_error(monkeypatch):
    monkeypatch.setenv("RAG_RERANKING", "maybe")
    with pytest.raises(Exception, match="RAG_RERANKING"):
        Settings()


def test_a_mistyped_provider_fails_when_settings_are_read(monkeypatch, caplog):
    """Not at the first search, and naming the variable and the seed's own provider names."""
    monkeypatch.setenv("EMBED_PROVIDER", "bogus")
    with pytest.raises(ConfigError, match=r"\$EMBED_PROVIDER='bogus': unknown provider; use ollama, openrouter"):
        Settings()
    monkeypatch.delenv("EMBED_PROVIDER")
    monkeypatch.setenv("RAG_EMBEDDING__PROVIDER", "olama")
    config.get_settings.cache_clear()
    try:
        with pytest.raises(ConfigError, match="embedding.provider: .*unknown embedding provider 'olama'.*ollama"):
            config.get_settings()
    finally:
        config.get_settings.cache_clear()
    monkeypatch.delenv("RAG_EMBEDDING__PROVIDER")
    # seed 004's CHUNK_MIN_TOKENS has no setting to set: said once, not silently dropped
    monkeypatch.setenv("CHUNK_MIN_TOKENS", "50")
    config._LOGGED_CONFLICTS.discard("CHUNK_MIN_TOKENS")
    with caplog.at_level(logging.WARNING, logger="rag_lib.config"):
        Settings()
    assert any("$CHUNK_MIN_TOKENS is ignored" in r.getMessage() for r in caplog.records)


def _chain_settings(primary_key: str, backup_key: str) -> Settings:
    return Settings(embedding={
        "provider": "openai", "model": "text-embedding-3-small", "dimensions": 384, "api_key_env": primary_key,
        "fallback": ["backup"],
        "providers": [{"name": "backup", "provider": "openai", "model": "text-embedding-3-small", "dimensions": 384,
                       "api_key_env": backup_key}],
    })


def test_fallback_member_without_key_is_skipped_with_one_warning(monkeypatch, caplog):
    monkeypatch.setenv("RAG_TEST_PRIMARY_KEY", "sk-test")
    monkeypatch.delenv("RAG_TEST_MISSING_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="rag_lib.embedding"):
        provider = get_provider(_chain_settings("RAG_TEST_PRIMARY_KEY", "RAG_TEST_MISSING_KEY"))
    assert not isinstance(provider, FallbackProvider) and provider.label == "openai/text-embedding-3-small:384"
    skipped = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 1 and "RAG_TEST_MISSING_KEY" in skipped[0].getMessage()
    # the primary without its key: the backup serves alone
    monkeypatch.setenv("RAG_TEST_BACKUP_KEY", "sk-test")
    provider = get_provider(_chain_settings("RAG_TEST_MISSING_KEY", "RAG_TEST_BACKUP_KEY"))
    assert provider.label == "backup"


def test_fallback_chain_with_no_key_left_is_an_error(monkeypatch):
    monkeypatch.delenv("RAG_TEST_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match="lacks its API key"):
        get_provider(_chain_settings("RAG_TEST_MISSING_KEY", "RAG_TEST_MISSING_KEY"))


@pytest.mark.parametrize("seed_provider, key_var, model, dims, sends_dims", [
    ("openai", "OPENAI_API_KEY", "text-embedding-3-large", 1536, True),  # seed 000 §2.1: truncated to 1536
    ("openrouter", "OPENROUTER_API_KEY", "openai/text-embedding-3-small", 1536, True),
    ("ollama", None, "nomic-embed-text", 768, False),  # Ollama answers in the model's own size
])
def test_seed_provider_alone_gets_its_model_over_http(monkeypatch, seed_provider, key_var, model, dims, sends_dims):
    """Only EMBED_PROVIDER set (and the server's URL): the provider's own model and size, its key, real HTTP."""
    from openai_stub import OpenAIStub

    monkeypatch.setenv("EMBED_PROVIDER", seed_provider)
    if key_var:
        monkeypatch.setenv(key_var, f"key-of-{seed_provider}")
    with OpenAIStub() as stub:
        monkeypatch.setenv("LLM_BASE_URL", stub.base_url)
        settings = Settings()
        assert (settings.embedding.model, settings.embedding.dimensions) == (model, dims)
        vectors = get_provider(settings).embed(["NVIDIA data center revenue"])
        assert vectors.shape == (1, dims)
        assert stub.models[model] == 1 and stub.sent_dimensions[model] == int(sends_dims)
        if key_var:
            assert stub.keys[f"key-of-{seed_provider}"] == 1


def test_openrouter_reads_openrouter_api_key(monkeypatch):
    monkeypatch.setenv("EMBED_PROVIDER", "openrouter")
    monkeypatch.setenv("OPENROUTER_API_KEY", "sk-or-1")
    monkeypatch.setenv("LLM_API_KEY", "sk-llm-1")
    e = Settings().embedding
    assert (e.api_key_env, e.base_url) == ("OPENROUTER_API_KEY", "https://openrouter.ai/api/v1")
    monkeypatch.delenv("OPENROUTER_API_KEY")
    assert Settings().embedding.api_key_env == "LLM_API_KEY"  # seed 000's config.yaml: ${LLM_API_KEY}
    monkeypatch.setenv("EMBED_MODEL", "openai/text-embedding-3-large")  # a chosen model keeps the size
    assert Settings().embedding.space == "openai/text-embedding-3-large:1536"


SEED_CONFIG = """\
rag_version: "2.0.0"
embedding:
  # EMBED_PROVIDER env var selects default (recommended: openai)
  default_provider: "${EMBED_PROVIDER:-ollama}"
  fallback_chain:
    - ollama           # Try local first ($0)
    - openrouter       # Fallback to cloud if Ollama fails/unavailable
  timeout_seconds: 30
  dimensions: "${EMBED_DIMENSIONS:-1536}"   # All providers must match
  ollama:
    base_url: "${LLM_BASE_URL:-http://localhost:11434}"
    model: "${EMBED_MODEL:-nomic-embed-text}"
  openrouter:
    api_key: "${LLM_API_KEY}"
    model: "${EMBED_MODEL:-openai/text-embedding-3-small}"
    dimensions: "${EMBED_DIMENSIONS:-1536}"
  openai:
    api_key: "sk-literal-secret-123"
    model: "${EMBED_MODEL:-text-embedding-3-large}"
    dimensions: "${EMBED_DIMENSIONS:-1536}"
chunking:
  max_tokens: "${CHUNK_MAX_TOKENS:-768}"
  min_tokens: "${CHUNK_MIN_TOKENS:-50}"
  overlap_tokens: "${CHUNK_OVERLAP:-150}"
  preserve_tables: "${CHUNK_PRESERVE_TABLES:-true}"
features:
  element_aware_chunking: "${RAG_ELEMENT_CHUNKING:-true}"
  reranking_enabled: "${RAG_RERANKING:-false}"
  adaptive_retrieval: "${RAG_ADAPTIVE:-false}"
  metrics_enabled: "${RAG_METRICS:-true}"
  query_expansion_enabled: true
"""


def test_seed_config_yaml_maps_onto_our_settings(monkeypatch, tmp_path, caplog):
    """Seed 000 §2.2's `embedding:` block and seed 004's `chunking:` / `features:` as RAG_CONFIG: what
    maps onto a setting is read; each key that does not is named in a warning, never its value."""
    path = tmp_path / "config.yaml"
    path.write_text(SEED_CONFIG)
    monkeypatch.setenv("RAG_CONFIG", str(path))
    with caplog.at_level(logging.WARNING, logger="rag_lib.config"):
        s = Settings()
    e = s.embedding
    assert (e.provider, e.base_url, e.model, e.dimensions, e.timeout) == (
        "openai_compatible", "http://localhost:11434/v1", "nomic-embed-text", 1536, 30.0)
    assert e.fallback == []  # openrouter makes another space: never a fallback of ollama's
    assert (s.chunking.max_tokens, s.chunking.overlap_tokens) == (768, 150)
    assert s.search.rerank is False and s.search.routing is False and s.search_metrics.enabled is True
    warned = " ".join(r.getMessage() for r in caplog.records)
    for key in ("rag_version", "chunking.preserve_tables", "chunking.min_tokens", "features.element_aware_chunking",
                "features.query_expansion_enabled", "embedding.fallback_chain[openrouter]", "embedding.openai"):
        assert key in warned, key
    assert "sk-literal-secret" not in warned and "search.expansion_model" in warned

    # the environment still chooses: EMBED_PROVIDER=openrouter with its block's key variable
    monkeypatch.setenv("EMBED_PROVIDER", "openrouter")
    monkeypatch.setenv("LLM_API_KEY", "sk-or-2")
    e = Settings().embedding
    assert (e.base_url, e.model, e.dimensions, e.api_key_env) == (
        "https://openrouter.ai/api/v1", "openai/text-embedding-3-small", 1536, "LLM_API_KEY")


def test_seed_config_same_space_fallback_is_kept(monkeypatch, tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text("embedding:\n  default_provider: openai\n  fallback_chain: [openai, openrouter]\n"
                    "  openai: {api_key: sk-literal-secret-456}\n"
                    "  openrouter: {model: text-embedding-3-large, api_key: '${OPENROUTER_API_KEY}'}\n")
    monkeypatch.setenv("RAG_CONFIG", str(path))
    with caplog.at_level(logging.WARNING, logger="rag_lib.config"):
        e = Settings().embedding
    assert e.space == "text-embedding-3-large:1536" and e.fallback == ["openrouter"]
    assert e.providers[0].space == e.space and e.providers[0].api_key_env == "OPENROUTER_API_KEY"
    assert e.api_key_env == "OPENAI_API_KEY"  # a literal key is not a setting: named, never shown
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "embedding.openai.api_key" in warned and "sk-literal-secret" not in warned


def test_unknown_nested_keys_in_the_settings_file_are_errors(monkeypatch, tmp_path):
    """A typo inside a section (ours, a list of them, or a seed-format one) stops loading with the key's
    path, the file and the closest real key, instead of leaving the default in force unannounced."""
    path = tmp_path / "rag.yaml"
    monkeypatch.setenv("RAG_CONFIG", str(path))
    cases = {
        "search:\n  top_k: 5\n  fusionn: convex\n": ("search.fusionn", "search.fusion"),
        "pipeline:\n  schedules: {reconcil: '0 1 * * *'}\n": ("pipeline.schedules.reconcil", "pipeline.schedules.reconcile"),
        "pipeline:\n  roots: [{path: /tmp, colection: x}]\n": ("pipeline.roots[0].colection", "pipeline.roots[0].collection"),
        "embedding:\n  reembed: {batch_sise: 10}\n": ("embedding.reembed.batch_sise", "embedding.reembed.batch_size"),
        "chunking:\n  max_tokns: 300\n": ("chunking.max_tokns", "chunking.max_tokens"),
        "server:\n  zzz_unheard_of: 1\n": ("server.zzz_unheard_of", None),
    }
    for text, (key, near) in cases.items():
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            Settings()
        message = str(caught.value)
        assert str(path) in message and key in message, message
        assert (f"did you mean {near}?" in message) if near else ("did you mean" not in message), message
    path.write_text("search:\n  top_k: 5\n  fusion: rrf\npipeline:\n  roots: [{path: /tmp, collection: x}]\n")
    assert Settings().search.top_k == 5  # known keys still load


def test_a_bad_value_or_a_missing_settings_file_is_a_config_error_naming_it(monkeypatch, tmp_path):
    """What a user sees in `rag`: the setting, where it came from and why, not "1 validation error"."""
    path = tmp_path / "rag.yaml"
    monkeypatch.setenv("RAG_CONFIG", str(path))
    with pytest.raises(ConfigError, match=f"RAG_CONFIG={path}: no such settings file"):
        config.get_settings.__wrapped__()
    path.write_text("search:\n  top_k: lots\n")
    with pytest.raises(ConfigError, match=r"invalid setting search\.top_k: Input should be a valid integer.*RAG_SEARCH__TOP_K"):
        config.get_settings.__wrapped__()
    path.write_text("{}\n")
    monkeypatch.setenv("RAG_LIMITS__MAX_DEPTH", "-1")
    with pytest.raises(ConfigError, match=r"limits\.max_depth: Input should be greater than or equal to 1"):
        config.get_settings.__wrapped__()


def test_a_mistyped_or_unparsable_setting_variable_is_a_config_error(monkeypatch):
    """pydantic-settings ignores RAG_* variables naming no setting: a typo left the default in force."""
    monkeypatch.setenv("RAG_SEARCH__FUSIONN", "rrf")
    with pytest.raises(ConfigError, match=r"unknown setting variable RAG_SEARCH__FUSIONN \(did you mean RAG_SEARCH__FUSION\?\)"):
        config.get_settings.__wrapped__()
    monkeypatch.delenv("RAG_SEARCH__FUSIONN")
    monkeypatch.setenv("RAG_PIPELINE__ROOTS", "notjson")
    with pytest.raises(ConfigError, match="pipeline.*lists and mappings are JSON"):
        config.get_settings.__wrapped__()
    monkeypatch.setenv("RAG_PIPELINE__ROOTS", '[{"path": "/tmp", "collection": "x"}]')
    monkeypatch.setenv("RAG_SEARCH__TOP_K", "3")
    assert config.get_settings.__wrapped__().search.top_k == 3


def test_embedding_client_config_is_read_as_the_settings_file_is(monkeypatch, tmp_path):
    """A mistyped key in `EmbeddingClient`'s seed config is refused with rag.yaml's message (it was a
    warning, leaving the default in force), by the one reader both use."""
    from rag_lib import EmbeddingClient

    seed = {"default_provider": "ollama", "timeout_secnods": 5}
    with pytest.raises(ConfigError) as client:
        EmbeddingClient(seed)
    path = tmp_path / "rag.yaml"
    path.write_text("embedding:\n  default_provider: ollama\n  timeout_secnods: 5\n")
    monkeypatch.setenv("RAG_CONFIG", str(path))
    with pytest.raises(ConfigError) as file:
        Settings()
    problem = ("unknown setting embedding.timeout_secnods (did you mean embedding.timeout_seconds?): "
               "correct or remove it (README, Configuration)")
    assert str(client.value) == f"EmbeddingClient config: {problem}"
    assert str(file.value) == f"{path}: {problem}"
