"""Searching across a re-embed switch: each search pins the active space once and embeds its
query with that space's provider, so the query vector and the vectors it is compared with always
come from the same space, even when a re-embed switches spaces mid-search."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from rag_lib.config import Settings
from rag_lib.embedding.base import EmbeddingProvider
from rag_lib.errors import ConfigError


def settings_naming(space: dict[str, Any]) -> str:
    """The embedding settings that name a space row of `rag_spaces` (its provider, model, dimensions)."""
    remote = "" if space["provider"] == "local" else " (and its base_url)"
    return f"embedding.provider {space['provider']}, model {space['model']}, dimensions {space['dimensions']}{remote}"


class PinnedStore:
    """A view of a store whose `active_space()` is fixed; everything else is the store's."""

    def __init__(self, store: Any, space: dict[str, Any] | None):
        self._store = store
        self._space = space

    def active_space(self) -> dict[str, Any] | None:
        return self._space

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class SpaceProviders:
    """Providers per space: the configured one for its own space, others built on demand from
    `embedding.providers` (after a switch, until the process restarts with the new settings)."""

    def __init__(self, settings: Settings, default: Callable[[], EmbeddingProvider]):
        self.settings = settings
        self._default = default
        self._built: dict[str, EmbeddingProvider] = {}
        self._lock = threading.Lock()

    def for_space(self, space: str) -> EmbeddingProvider:
        default = self._default()
        if space == default.space:
            return default
        with self._lock:
            if space not in self._built:
                from rag_lib.embedding import provider_for_space

                try:
                    self._built[space] = provider_for_space(self.settings, space)
                except ConfigError as exc:
                    raise ConfigError(
                        f"the database's vectors are in space {space} (its active space) but this process is "
                        f"configured for {default.space} (embedding settings, or $EMBED_PROVIDER / $EMBED_MODEL): "
                        f"{exc}; configure {space}'s provider (`rag reembed --status` lists each space's), or move the vectors with "
                        f"`rag reembed --to` (README, Embedding providers)"
                    ) from exc
            return self._built[space]

    def pinned(self, store: Any) -> tuple[PinnedStore, EmbeddingProvider]:
        """(store view, provider) for one search, both bound to the space active right now."""
        space = store.active_space()
        provider = self.for_space(space["space"]) if space else self._default()
        return PinnedStore(store, space), provider
