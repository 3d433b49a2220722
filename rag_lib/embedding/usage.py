"""Per-call usage of a provider (requests, retries, inputs, tokens) and its estimated cost."""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Usage:
    """What one provider spent on one call (or, summed, on one run)."""

    provider: str
    model: str
    dimensions: int
    requests: int = 0
    retries: int = 0
    failures: int = 0
    inputs: int = 0
    tokens: int = 0
    tokens_estimated: bool = False  # True when the server did not report its own count
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.provider, self.model, self.dimensions)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def merge(self, other: Usage) -> None:
        self.add(requests=other.requests, retries=other.retries, failures=other.failures,
                 inputs=other.inputs, tokens=other.tokens)
        self.tokens_estimated = self.tokens_estimated or other.tokens_estimated

    def cost(self, prices: dict[str, float]) -> float:
        """Estimated USD: tokens × the model's price per million (unknown/local models cost 0)."""
        return self.tokens * prices.get(self.model, 0.0) / 1_000_000

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("_lock")
        return out
