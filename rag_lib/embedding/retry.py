"""Retry policy: exponential backoff with jitter, honouring the server's Retry-After."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping


def parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds the server asked us to wait: `retry-after-ms`, or `Retry-After` (seconds or HTTP date)."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None  # unreadable: fall back to our own backoff
    return max(0.0, parsed.timestamp() - time.time())


def backoff_delay(attempt: int, base: float, cap: float, retry_after: float | None = None,
                  rng: random.Random | None = None) -> float:
    """Delay before retry number `attempt` (0-based): half fixed, half random ("equal jitter") so
    parallel workers spread out; never shorter than Retry-After."""
    rng = rng or random
    ceiling = min(cap, base * (2 ** attempt))
    delay = ceiling / 2 + rng.uniform(0, ceiling / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return delay
