"""The resource that carries settings, the database and the stage runner to assets and checks."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.embedding import EmbeddingProvider, get_provider
from rag_lib.quality import preload_great_expectations

from pipelines.stage_runner import StageRunner

# Loading a model costs seconds: one provider per embedding configuration per process.
_PROVIDERS: dict[str, EmbeddingProvider] = {}


def _provider_key(settings: Settings) -> str:
    return settings.embedding.model_dump_json()


def preload_provider(settings: Settings, provider: EmbeddingProvider) -> None:
    """Use an already loaded provider for this embedding configuration (tests, benchmarks)."""
    _PROVIDERS[_provider_key(settings)] = provider


def provider_for(settings: Settings) -> EmbeddingProvider:
    key = _provider_key(settings)
    if key not in _PROVIDERS:
        _PROVIDERS[key] = get_provider(settings)
    return _PROVIDERS[key]


class RagResource(ConfigurableResource):
    """Settings come from `rag.yaml`/`RAG_*` (as for the CLI); fields here override them per run.
    Corpus roots are not config: they come from the registry (`rag roots`)."""

    config_file: str | None = None  # a rag.yaml other than $RAG_CONFIG / ./rag.yaml
    database_url: str | None = None  # overrides RAG_DATABASE_URL
    home: str | None = None  # overrides RAG_HOME (embedded server location)
    force: bool = False  # redo stages even for files that are already current
    embed_version: str | None = None  # re-embed under a new embed_version

    _kb: KnowledgeBase | None = PrivateAttr(default=None)

    def settings(self) -> Settings:
        if self.config_file:
            os.environ["RAG_CONFIG"] = self.config_file
        overrides: dict[str, Any] = {}
        if self.database_url:
            overrides["database_url"] = self.database_url
        if self.home:
            overrides["home"] = Path(self.home)
        settings = Settings(**overrides)
        if self.embed_version:
            settings.embedding.embed_version = self.embed_version
        return settings

    def kb(self) -> KnowledgeBase:
        if self._kb is None:
            settings = self.settings()
            self._kb = KnowledgeBase(settings, provider=provider_for(settings))
        return self._kb

    def partition_map(self) -> "PartitionMap":
        """Partition keys ↔ files for the registered corpus roots (the registry, merged with
        rag.yaml's pipeline.roots): read per run/tick, so UI-launched runs need no run config."""
        from pipelines.partitions import PartitionMap

        return PartitionMap(self.kb().roots())

    def runner(self) -> StageRunner:
        return StageRunner(self.kb(), force=self.force)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        from pipelines.instance import tune_event_writes

        if context.instance is not None:  # the run worker's instance: pooled connections
            tune_event_writes(context.instance)
        if context.run is not None:  # a run (not a sensor tick): chunk_sizes runs last
            # (priority -1), by when the validation process has imported Great Expectations
            preload_great_expectations()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._kb is not None:
            self._kb.close()
            self._kb = None
