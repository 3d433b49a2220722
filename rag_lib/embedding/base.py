"""The provider interface every embedding backend implements."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable

import numpy as np

from rag_lib.embedding.usage import Usage
from rag_lib.tokens import Tokenizer, chunker_key


class EmbeddingProvider(ABC):
    """Turns texts into L2-normalised float32 vectors of a fixed `dimensions`."""

    name: str
    model: str
    dimensions: int

    @property
    def key(self) -> str:
        """The model's name as its vectors are keyed (embedding cache, space, staged vectors); a
        local model other than the installed one adds the identity of its files."""
        return self.model

    @property
    def space(self) -> str:
        """The vector space identifier: vectors are comparable only within one space."""
        return f"{self.key}:{self.dimensions}"

    @abstractmethod
    def tokenizer(self) -> Tokenizer:
        """The tokenizer whose counts bound chunk sizes for this provider."""

    @property
    def max_tokens(self) -> int:
        return self.tokenizer().limit

    def chunker(self) -> str:
        """What decides the chunks cut for this provider (`rag_lib.tokens.chunker_key`)."""
        return chunker_key(self.tokenizer())

    def prepare(self) -> None:
        """Load what batch embedding needs now (a local model); remote providers need nothing."""

    @property
    def loaded(self) -> bool:
        """True when what encodes queries and batches is in memory (checked without loading it)."""
        return True

    @abstractmethod
    def embed(self, texts: list[str]) -> np.ndarray:
        """Vectors for `texts`, shape (len(texts), dimensions), normalised."""

    def embed_counted(self, texts: list[str]) -> tuple[np.ndarray, list[Usage]]:
        """`embed` plus what it spent (remote providers count requests, retries, real tokens)."""
        vectors = self.embed(texts)
        tokens = sum(self.tokenizer().count_many(texts)) + 2 * len(texts) if texts else 0
        return vectors, [Usage(self.name, self.model, self.dimensions, inputs=len(texts), tokens=tokens)]

    def start_counted(self, texts: list[str], stop: threading.Event | None = None
                      ) -> Callable[[], tuple[np.ndarray, list[Usage]]]:
        """Start embedding `texts` and return what waits for `embed_counted`'s result: an ingest
        starts its next round's texts while the current round's last ones are encoded. A provider
        that cannot encode in the background (this default) does all the work when that is called.
        `stop` (a stopped ingest): a provider that can stop early raises `StoppedError` once it is set."""
        return lambda: self.embed_counted(texts)
