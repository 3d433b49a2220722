"""Embedding providers behind one interface. `get_provider(settings)` builds the configured one
(with its fallback chain); `provider_for_space` builds whatever serves another space, e.g. a
re-embed target, from the `embedding.providers` registry. In rag.yaml:

    embedding:
      provider: openai_compatible        # local | openai | openai_compatible
      base_url: http://gpu-box:8080/v1   # TEI / vLLM / Ollama
      model: all-MiniLM-L6-v2
      dimensions: 384
      api_key_env: TEI_API_KEY           # the variable's name, never the key
      requests_per_minute: 3000
      tokens_per_minute: 1000000
      fallback: [local-minilm]           # only providers of the same space (or declared equivalent)
      providers:
        - {name: local-minilm, provider: local, model: all-MiniLM-L6-v2, dimensions: 384}
        - {name: oai-large, provider: openai, model: text-embedding-3-large, dimensions: 1024}
      prices: {text-embedding-3-large: 0.13}   # USD per 1M tokens
      reembed: {eval_set: ../shared/eval/tradegent-dev, ndcg_tolerance: 0.02}

Then `rag reembed --to text-embedding-3-large:1024` fills that space beside the active one."""

from __future__ import annotations

from rag_lib.config import PROVIDERS, ProviderSettings, Settings
from rag_lib.embedding.base import EmbeddingProvider
from rag_lib.errors import ConfigError
from rag_lib.log import get_logger
from rag_lib.tokens import Tokenizer

log = get_logger("embedding")

OPENAI_DEFAULT_DIMS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}


def build_provider(cfg: ProviderSettings) -> EmbeddingProvider:
    """One provider (no fallbacks) from its settings."""
    if cfg.provider == "local":
        from rag_lib.embedding.local import LOCAL_BATCH_SIZE, LocalProvider

        return LocalProvider(cfg.model, cfg.dimensions, cfg.batch_size or LOCAL_BATCH_SIZE, cfg.model_path,
                             cfg.query_runtime, cfg.onnx_cache_dir, cfg.batch_runtime)
    if cfg.provider in ("openai", "openai_compatible"):
        from rag_lib.embedding.openai import OpenAIProvider

        return OpenAIProvider(cfg)
    raise ConfigError(f"unknown embedding provider '{cfg.provider}'; use one of {', '.join(PROVIDERS)}")


def _primary(settings: Settings) -> ProviderSettings:
    """The configured provider's own settings (the `embedding` fields a provider reads)."""
    return ProviderSettings(**settings.embedding.model_dump(include=set(ProviderSettings.model_fields)))


def configured_chunker(settings: Settings) -> str:
    """What decides the chunks an ingest under `settings` cuts: the configured provider's chunker
    key (`EmbeddingProvider.chunker`; a fallback chain cuts with its primary's tokenizer)."""
    return build_provider(_primary(settings)).chunker()


def configured_tokenizer(settings: Settings) -> Tokenizer:
    """The tokenizer an ingest under `settings` cuts chunks with (the configured provider's, as
    `configured_chunker`), without a model, a key or a request: what `rag validate` chunks with."""
    return build_provider(_primary(settings)).tokenizer()


def _named(settings: Settings, name: str) -> ProviderSettings:
    for entry in settings.embedding.providers:
        # an unnamed entry by its space, or by model:dimensions as spaces were named before model identities
        if name in ((entry.name,) if entry.name else (entry.space, f"{entry.model}:{entry.dimensions}")):
            return entry
    known = ", ".join(e.name or e.space for e in settings.embedding.providers) or "none"
    raise ConfigError(f"embedding.fallback names '{name}', which is not in embedding.providers (known: {known})")


def get_provider(settings: Settings) -> EmbeddingProvider:
    """The configured provider; with `embedding.fallback`, a chain that only falls back within the space."""
    cfg = settings.embedding
    primary = build_provider(_primary(settings))
    if not cfg.fallback:
        return primary
    from rag_lib.embedding.chain import FallbackProvider

    entries = [_primary(settings), *(_named(settings, n) for n in cfg.fallback)]
    usable = [e for e in entries if not missing_key(e)]
    if not usable:
        names = ", ".join(f"{e.name or e.space} (${e.api_key_env})" for e in entries)
        raise ConfigError(f"every embedding provider in the chain lacks its API key: {names}; set one of them")
    for e in entries:
        if missing_key(e):
            log.warning("embedding provider %s skipped: its API key $%s is not set", e.name or e.space, e.api_key_env)
    members = [primary if e is entries[0] else build_provider(e) for e in usable]
    return members[0] if len(members) == 1 else FallbackProvider(members)


def missing_key(cfg: ProviderSettings) -> bool:
    """An `openai` provider needs a key; self-hosted compatible servers often do not."""
    import os

    return cfg.provider == "openai" and not os.environ.get(cfg.api_key_env)


def parse_spec(spec: str) -> tuple[str, int | None]:
    """'MODEL[:DIMS]' → (model, dims or None)."""
    model, sep, dims = spec.strip().rpartition(":")
    if sep and dims.isdigit():
        return model, int(dims)
    return spec.strip(), None


def resolve_space(settings: Settings, spec: str) -> list[ProviderSettings]:
    """Provider settings able to make the space `MODEL[:DIMS]`, preferred first: the configured
    provider, then registry entries; a known OpenAI model and the installed local one need no entry."""
    model, dims = parse_spec(spec)
    candidates = [_primary(settings), *settings.embedding.providers]
    # by key: a local model other than the installed one serves only its own space (`model@identity`)
    found = [c for c in candidates if c.key == model and (dims is None or c.dimensions == dims)]
    spaces = {c.space for c in found}
    if len(spaces) > 1:
        raise ConfigError(f"'{spec}' is ambiguous ({', '.join(sorted(spaces))}); say MODEL:DIMS")
    if found:
        return found
    if model in OPENAI_DEFAULT_DIMS:
        return [ProviderSettings(provider="openai", model=model, dimensions=dims or OPENAI_DEFAULT_DIMS[model])]
    installed = ProviderSettings()  # the local model the default settings name, installed with rag-kb
    if model == installed.model and dims in (None, installed.dimensions):
        # the space embedding.* named before it was edited: searching it, comparing a new space
        # with it and rolling back to it need no entry in embedding.providers
        return [installed]
    raise ConfigError(
        f"no provider for '{spec}': add an entry with model {model}"
        + (f" and dimensions {dims}" if dims else "") + " to embedding.providers"
    )


def provider_for_space(settings: Settings, spec: str) -> EmbeddingProvider:
    """A provider (chain when several entries serve it) for space `MODEL[:DIMS]`."""
    entries = resolve_space(settings, spec)
    if len(entries) == 1:
        return build_provider(entries[0])
    from rag_lib.embedding.chain import FallbackProvider

    return FallbackProvider([build_provider(e) for e in entries])


__all__ = ["EmbeddingProvider", "build_provider", "configured_chunker", "configured_tokenizer", "get_provider", "parse_spec", "provider_for_space", "resolve_space"]
