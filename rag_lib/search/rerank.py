"""Optional second-stage providers: query expansion by an OpenAI-compatible chat model and reranking
by a sentence-transformers CrossEncoder. Both are off unless configured."""

from __future__ import annotations

import math
import os
import re
from typing import Protocol

from rag_lib.errors import ConfigError
from rag_lib.log import get_logger

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


def reranker_from_settings(settings) -> Reranker | None:
    path = settings.search.rerank_model_path
    return CrossEncoderReranker(path) if path else None


def expander_from_settings(settings) -> QueryExpander | None:
    s = settings.search
    if not s.expansion_model:
        return None
    return ChatQueryExpander(s.expansion_model, s.expansion_base_url, os.environ.get(s.expansion_api_key_env))
