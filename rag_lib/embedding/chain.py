"""Fallback chain: the next provider is tried only when it makes the same vector space (same model
and dimensions, or declared equivalent), so a fallback can never mix spaces."""

from __future__ import annotations

import numpy as np

from rag_lib.embedding.base import EmbeddingProvider
from rag_lib.embedding.usage import Usage
from rag_lib.metrics import embed_call
from rag_lib.errors import ConfigError, EmbeddingError
from rag_lib.log import get_logger
from rag_lib.tokens import Tokenizer

log = get_logger(__name__)


def same_space(primary: EmbeddingProvider, other: EmbeddingProvider) -> bool:
    """Equal model+dimensions, or one side declares the other's space equivalent."""
    if primary.dimensions != other.dimensions:
        return False  # no declaration can make vectors of different lengths comparable
    declared = set(getattr(getattr(other, "cfg", None), "equivalent_to", []) or []) | set(
        getattr(getattr(primary, "cfg", None), "equivalent_to", []) or []
    )
    return primary.space == other.space or other.space in declared or primary.space in declared


class FallbackProvider(EmbeddingProvider):
    """Tries members in order; its space, name and tokenizer are the primary's."""

    def __init__(self, members: list[EmbeddingProvider]):
        if not members:
            raise ConfigError("a fallback chain needs at least one provider")
        primary = members[0]
        for other in members[1:]:
            if not same_space(primary, other):
                raise ConfigError(
                    f"fallback provider {getattr(other, 'label', other.name)} makes space {other.space}, "
                    f"but the primary makes {primary.space}; fallback is only allowed between equal spaces "
                    f"(same model and dimensions, or list '{primary.space}' in its equivalent_to)"
                )
        self.members = members
        self.name = primary.name
        self.model = primary.model
        self.dimensions = primary.dimensions
        self.label = "fallback(" + ", ".join(getattr(m, "label", m.name) for m in members) + ")"

    @property
    def key(self) -> str:
        return self.members[0].key

    @property
    def space(self) -> str:
        return self.members[0].space

    def tokenizer(self) -> Tokenizer:
        return self.members[0].tokenizer()

    @property
    def max_tokens(self) -> int:
        return min(m.max_tokens for m in self.members)

    def prepare(self) -> None:
        self.members[0].prepare()  # a fallback loads only if it is ever needed

    @property
    def loaded(self) -> bool:
        return self.members[0].loaded

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.embed_counted(texts)[0]

    def embed_counted(self, texts: list[str]) -> tuple[np.ndarray, list[Usage]]:
        with embed_call(self.label, self.model, len(texts)) as call:
            try:
                return self._embed_counted(texts, call)
            finally:
                call.retries = sum(u.retries for u in call.usages) if hasattr(call, "usages") else 0

    def _embed_counted(self, texts: list[str], call) -> tuple[np.ndarray, list[Usage]]:
        usages: list[Usage] = []
        call.usages = usages
        errors: list[str] = []
        for position, member in enumerate(self.members):
            call.provider = getattr(member, "label", member.name)
            call.fallback = position > 0
            try:
                vectors, used = member.embed_counted(texts)
            except EmbeddingError as exc:
                usages.extend(getattr(exc, "usage", []))
                errors.append(str(exc))
                log.warning("%s failed, trying the next provider: %s", getattr(member, "label", member.name), exc)
                continue
            usages.extend(used)
            if vectors.shape != (len(texts), self.dimensions):
                errors.append(f"{getattr(member, 'label', member.name)} returned shape {vectors.shape}")
                continue
            return vectors, usages
        err = EmbeddingError(f"every provider in the chain failed: {' | '.join(errors)}")
        err.usage = usages  # type: ignore[attr-defined]
        raise err
