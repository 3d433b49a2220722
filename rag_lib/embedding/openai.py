"""OpenAI (`text-embedding-3-small|large`) and OpenAI-compatible servers (Ollama, vLLM, TEI) through
the `openai` client: batching by count and tokens, a concurrency limit, client-side rate limits,
retries with backoff + jitter honouring Retry-After, and a typed error after the last try."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from rag_lib.config import ProviderSettings
from rag_lib.embedding.base import EmbeddingProvider
from rag_lib.embedding.budget import LimitedTokenizer, TokenBudget
from rag_lib.embedding.ratelimit import RateLimiter
from rag_lib.embedding.retry import backoff_delay, parse_retry_after
from rag_lib.embedding.usage import Usage
from rag_lib.metrics import embed_call
from rag_lib.errors import ConfigError, DimensionMismatchError, EmbeddingError
from rag_lib.log import get_logger
from rag_lib.tokens import Tokenizer, get_tokenizer

if TYPE_CHECKING:
    import openai

log = get_logger(__name__)

OPENAI_MODELS = {"text-embedding-3-small": 1536, "text-embedding-3-large": 3072, "text-embedding-ada-002": 1536}
MAX_INPUTS_PER_REQUEST = 2048  # OpenAI's documented cap on inputs per request
DEFAULT_BATCH_SIZE = 64  # texts per request when embedding.batch_size is unset


class _Malformed(Exception):
    """The server answered 200 with a body we cannot use."""


class OpenAIProvider(EmbeddingProvider):
    """Remote embeddings over the OpenAI API shape; `cfg.provider` is `openai` or `openai_compatible`."""

    def __init__(self, cfg: ProviderSettings, sleep=time.sleep):
        if cfg.provider not in ("openai", "openai_compatible"):
            raise ConfigError(f"OpenAIProvider cannot serve provider '{cfg.provider}'")
        if cfg.provider == "openai_compatible" and not cfg.base_url:
            raise ConfigError(f"embedding provider {cfg.name or cfg.model}: openai_compatible needs base_url")
        if cfg.provider == "openai" and cfg.model in OPENAI_MODELS and cfg.dimensions > OPENAI_MODELS[cfg.model]:
            raise ConfigError(
                f"{cfg.model} makes at most {OPENAI_MODELS[cfg.model]} dimensions, not {cfg.dimensions}"
            )
        self.cfg = cfg
        self.name = cfg.provider
        self.label = cfg.name or f"{cfg.provider}/{cfg.space}"
        self.model = cfg.model
        self.dimensions = cfg.dimensions
        self.limiter = RateLimiter(cfg.requests_per_minute, cfg.tokens_per_minute)
        self.totals = Usage(self.name, self.model, self.dimensions)  # since start, for benchmarks
        self._sleep = sleep

    # ---- tokens ------------------------------------------------------------------------

    def tokenizer(self) -> Tokenizer:
        """The remote model's tokenizer when given, else the local model's (the chunker's, so chunks
        are the same in every space and a re-embed never re-chunks)."""
        if self.cfg.tokenizer_path:
            try:
                tok = get_tokenizer(self.cfg.tokenizer_path)
            except ConfigError as exc:
                raise ConfigError(
                    f"embedding.tokenizer_path of {self.label} ({self.cfg.tokenizer_path}): no tokenizer.json readable "
                    f"there ({exc.__cause__ or exc}); point it at the folder of the remote model's Hugging Face "
                    "tokenizer, or remove it to count tokens with the local model's tokenizer (an estimate)") from exc
        else:
            from rag_lib.embedding.local import default_model_path

            tok = get_tokenizer(default_model_path())
        return LimitedTokenizer(tok, self.cfg.max_input_tokens, bool(self.cfg.tokenizer_path))  # type: ignore[return-value]

    @property
    def max_tokens(self) -> int:
        return self.cfg.max_input_tokens

    @cached_property
    def budget(self) -> TokenBudget:
        return TokenBudget(self.tokenizer(), self.cfg.max_input_tokens, bool(self.cfg.tokenizer_path), self.label)

    # ---- client ------------------------------------------------------------------------

    @cached_property
    def client(self) -> openai.OpenAI:
        import openai  # ~1 s: not for what needs only the tokenizer (the pipeline fingerprint, `rag status`)

        key = os.environ.get(self.cfg.api_key_env)
        if not key:
            if self.cfg.provider == "openai":
                raise ConfigError(f"{self.label}: set the API key in ${self.cfg.api_key_env}")
            key = "unused"  # many self-hosted servers need no key; the client insists on one
        return openai.OpenAI(
            api_key=key, base_url=self.cfg.base_url or None, timeout=self.cfg.timeout, max_retries=0
        )

    # ---- embedding ---------------------------------------------------------------------

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.embed_counted(texts)[0]

    def embed_counted(self, texts: list[str]) -> tuple[np.ndarray, list[Usage]]:
        """All vectors or an EmbeddingError (carrying `.usage`): never a partial result."""
        usage = Usage(self.name, self.model, self.dimensions)
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32), [usage]
        with embed_call(self.label, self.model, len(texts)) as call:
            try:
                return self._embed_counted(texts, usage)
            finally:
                call.retries = usage.retries

    def _embed_counted(self, texts: list[str], usage: Usage) -> tuple[np.ndarray, list[Usage]]:
        try:
            self.budget.check(texts)
            batches = self._batches(texts)
            # token estimates feed only the tokens-per-minute limiter; skip the tokenizer otherwise
            counts = self.budget.count(texts) if self.cfg.tokens_per_minute else [0] * len(texts)
            out = np.empty((len(texts), self.dimensions), dtype=np.float32)
            failed = threading.Event()  # one batch out of retries: the others stop retrying too

            def run(batch: list[int]) -> None:
                try:
                    out[batch] = self._request([texts[i] for i in batch], sum(counts[i] for i in batch), usage, failed)
                except EmbeddingError:
                    failed.set()
                    raise

            workers = min(self.cfg.concurrency, len(batches))
            if workers <= 1:
                for batch in batches:
                    run(batch)
            else:
                with ThreadPoolExecutor(workers, thread_name_prefix="embed") as pool:
                    futures = [pool.submit(run, b) for b in batches]
                    errors = [f.exception() for f in futures]
                    first = next((e for e in errors if e is not None), None)
                    if first is not None:
                        raise first
        except EmbeddingError as exc:
            exc.usage = [usage]  # type: ignore[attr-defined]
            self.totals.merge(usage)
            raise
        self.totals.merge(usage)
        return out, [usage]

    def _batches(self, texts: list[str]) -> list[list[int]]:
        """Index batches within the count and per-request token limits; a text's UTF-8 bytes (+2)
        bound its tokens, so a batch can never exceed the provider's real cap."""
        max_n = max(1, min(self.cfg.batch_size or DEFAULT_BATCH_SIZE, MAX_INPUTS_PER_REQUEST))
        batches: list[list[int]] = []
        current: list[int] = []
        weight = 0
        for i, text in enumerate(texts):
            w = len(text.encode("utf-8")) + 2
            if current and (len(current) >= max_n or weight + w > self.cfg.max_batch_tokens):
                batches.append(current)
                current, weight = [], 0
            current.append(i)
            weight += w
        if current:
            batches.append(current)
        return batches

    def _request(self, texts: list[str], tokens: int, usage: Usage,
                 failed: threading.Event | None = None) -> np.ndarray:
        client = self.client  # a missing key is a ConfigError, not a retryable failure
        attempt = 0
        while True:
            if failed is not None and failed.is_set() and attempt:
                raise EmbeddingError(f"{self.label}: stopped retrying because another batch of this call failed")
            self.limiter.acquire(tokens)
            usage.add(requests=1)
            try:
                kwargs = {"dimensions": self.dimensions} if self.cfg.send_dimensions else {}
                resp = client.embeddings.create(
                    input=texts, model=self.model, encoding_format="float", **kwargs
                )
                vectors = self._parse(resp, len(texts))
                reported = getattr(getattr(resp, "usage", None), "total_tokens", None)
                counted = int(reported) if reported else (tokens or sum(self.budget.count(texts)))
                usage.add(inputs=len(texts), tokens=counted)
                if not reported:
                    usage.tokens_estimated = True
                return vectors
            except DimensionMismatchError:
                usage.add(failures=1)
                raise
            except Exception as exc:  # classified below; anything unknown is not retried
                kind, retryable, retry_after = self._classify(exc)
                if not retryable or attempt >= self.cfg.max_retries:
                    usage.add(failures=1)
                    tries = f"after {attempt + 1} attempt{'s' if attempt else ''}"
                    raise EmbeddingError(
                        f"{self.label}: embedding request failed {tries} ({kind}: {_short(exc)})"
                        + ("" if retryable else "; not retried")
                    ) from exc
                delay = backoff_delay(attempt, self.cfg.backoff_base, self.cfg.backoff_max, retry_after)
                if retry_after is not None:
                    self.limiter.pause(retry_after)  # everyone backs off, not only this worker
                log.info("%s: %s, retry %d in %.2fs", self.label, kind, attempt + 1, delay)
                usage.add(retries=1)
                attempt += 1
                self._sleep(delay)

    @staticmethod
    def _classify(exc: Exception) -> tuple[str, bool, float | None]:
        """(kind, retryable, retry_after seconds)."""
        import openai

        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            retry_after = parse_retry_after(exc.response.headers) if exc.response is not None else None
            retryable = status in (408, 409, 429) or status >= 500
            return f"HTTP {status}", retryable, retry_after
        if isinstance(exc, openai.APITimeoutError):
            return "timeout", True, None
        if isinstance(exc, openai.APIConnectionError):
            return "connection error", True, None
        if isinstance(exc, (_Malformed, json.JSONDecodeError, openai.APIResponseValidationError)):
            return "malformed response", True, None
        return type(exc).__name__, False, None

    def _parse(self, resp, n: int) -> np.ndarray:
        try:
            data = sorted(resp.data, key=lambda d: d.index)
            vectors = np.asarray([d.embedding for d in data], dtype=np.float32)
        except (AttributeError, TypeError, ValueError) as exc:
            raise _Malformed(f"cannot read embeddings: {exc}") from exc
        if len(data) != n or vectors.ndim != 2:
            raise _Malformed(f"expected {n} embeddings, got {len(data)}")
        if vectors.shape[1] != self.dimensions:
            raise DimensionMismatchError(
                f"{self.label}: server returned {vectors.shape[1]}-dimensional vectors for {self.model}, "
                f"expected {self.dimensions}; nothing was written (check the model and `dimensions`)"
            )
        if not np.isfinite(vectors).all():
            raise _Malformed("embeddings contain NaN or infinity")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if (norms == 0).any():
            raise _Malformed("an embedding is all zeros")
        return vectors / norms  # some compatible servers do not normalise


def _short(exc: Exception) -> str:
    text = str(exc).strip().replace("\n", " ")
    return text[:200] or type(exc).__name__
