"""The resource that carries settings, the database and the stage runner to assets and checks."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from dagster import AssetKey, ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.embedding import EmbeddingProvider, get_provider
from rag_lib.log import get_logger
from rag_lib.quality import preload_great_expectations
from rag_lib.shutdown import skip_final_collections

from pipelines.stage_runner import StageRunner

log = get_logger(__name__)

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
    _preparing: threading.Thread | None = PrivateAttr(default=None)

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
        if context.run is None:  # a sensor tick or schedule: no stages, no checks
            return
        skip_final_collections()  # a run worker's exit is part of the run's wall time
        if _embeds(context.run):
            # The model loads (seconds) on the other core while the first stages run; then the
            # validation process starts (chunk_sizes runs last, priority -1).
            self._preparing = threading.Thread(target=_prepare, args=(self.kb(),), name="rag-prepare", daemon=True)
            self._preparing.start()
        else:
            preload_great_expectations()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._preparing is not None:  # never close the knowledge base under a loading model
            self._preparing.join()
            self._preparing = None
        if self._kb is not None:
            self._kb.close()
            self._kb = None


def _prepare(kb: KnowledgeBase) -> None:
    try:
        kb.prepare_embedding()
    except Exception:  # noqa: BLE001 - the embeddings stage loads it again and records the failure per file
        log.warning("loading the embedding model ahead of the embeddings stage failed", exc_info=True)
    preload_great_expectations()


def _embeds(run) -> bool:
    """True when the run will embed: its asset selection (UI launches), else its steps (runs of
    a job), else its job has `embeddings`."""
    if run.asset_selection:  # empty for runs of a whole job
        return AssetKey("embeddings") in run.asset_selection
    if run.step_keys_to_execute is not None:
        return "embeddings" in run.step_keys_to_execute
    from pipelines.jobs import INGEST_JOB, REEMBED_JOB  # jobs.py imports this module

    return run.job_name in (INGEST_JOB, REEMBED_JOB)
