"""Embedding providers behind one interface; `get_provider(settings)` builds the configured one."""

from __future__ import annotations

from rag_lib.config import Settings
from rag_lib.embedding.base import EmbeddingProvider
from rag_lib.errors import ConfigError


def get_provider(settings: Settings) -> EmbeddingProvider:
    cfg = settings.embedding
    if cfg.provider == "local":
        from rag_lib.embedding.local import LocalProvider

        return LocalProvider(cfg.model, cfg.dimensions, cfg.batch_size, cfg.model_path)
    raise ConfigError(f"unknown embedding provider '{cfg.provider}' (embedding.provider); use 'local'")


__all__ = ["EmbeddingProvider", "get_provider"]
