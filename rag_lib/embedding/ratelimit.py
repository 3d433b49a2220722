"""Client-side rate limit: token buckets for requests and tokens per minute, plus a shared pause
that a 429's Retry-After imposes on every worker (not just the one that got it)."""

from __future__ import annotations

import threading
import time


class RateLimiter:
    """Blocks `acquire` until a request carrying `tokens` fits both per-minute budgets."""

    def __init__(self, requests_per_minute: int | None = None, tokens_per_minute: int | None = None,
                 clock=time.monotonic, sleep=time.sleep):
        self.rpm = requests_per_minute
        self.tpm = tokens_per_minute
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        now = clock()
        self._req = float(requests_per_minute or 0)
        self._tok = float(tokens_per_minute or 0)
        self._stamp = now
        self._paused_until = 0.0
        self.waited = 0.0  # seconds spent waiting, for reports

    def _refill(self, now: float) -> None:
        elapsed = now - self._stamp
        self._stamp = now
        if self.rpm:
            self._req = min(float(self.rpm), self._req + elapsed * self.rpm / 60)
        if self.tpm:
            self._tok = min(float(self.tpm), self._tok + elapsed * self.tpm / 60)

    def acquire(self, tokens: int = 0) -> None:
        # a single request larger than the whole budget may still go once the bucket is full
        need_tok = min(float(tokens), float(self.tpm)) if self.tpm else 0.0
        while True:
            with self._lock:
                now = self._clock()
                self._refill(now)
                wait = self._paused_until - now
                if wait <= 0:
                    short_req = (1 - self._req) * 60 / self.rpm if self.rpm and self._req < 1 else 0.0
                    short_tok = (need_tok - self._tok) * 60 / self.tpm if self.tpm and self._tok < need_tok else 0.0
                    wait = max(short_req, short_tok)
                    if wait <= 0:
                        if self.rpm:
                            self._req -= 1
                        if self.tpm:
                            self._tok -= need_tok
                        return
            self.waited += wait
            self._sleep(min(wait, 5.0))

    def pause(self, seconds: float) -> None:
        """Hold every caller for `seconds` (the server asked us to back off)."""
        with self._lock:
            self._paused_until = max(self._paused_until, self._clock() + seconds)
