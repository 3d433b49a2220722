"""Search and embedding metrics, recorded without slowing searches down: callers enqueue a record
(a few microseconds) and one background thread writes batches to the database (and the JSONL log
when `search_metrics.jsonl_path` / `$RAG_METRICS` names a file). `flush()` waits; `close()` drains.
Each JSONL line carries seed 004's `SearchMetrics` fields beside ours (`jsonl_record`), so the old
system's tooling reads it; `MetricsCollector` is seed 004's `get_metrics_collector()` object.

Embedding calls are recorded by the providers into whichever recorder the calling code bound with
`bound(recorder)` (a context variable: the knowledge base binds itself around searches and ingests)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rag_lib.db import database_gone
from rag_lib.log import get_logger
from rag_lib.models import EmbedMetric, SearchMetric, SearchResult, is_number

log = get_logger("metrics")

_SINK: contextvars.ContextVar[MetricsRecorder | None] = contextvars.ContextVar("rag_metrics_sink", default=None)
_IN_EMBED: contextvars.ContextVar[bool] = contextvars.ContextVar("rag_metrics_in_embed", default=False)
BATCH = 500  # records per write
IDLE_SECONDS = 0.5  # the writer wakes at least this often
# After a record arrives the writer waits this long for more (unless flushed or closed): one
# transaction for a busy server's many searches. Written one by one, each search cost the server's
# process ~0.7 ms of CPU and the database ~0.5 ms (a transaction and its commit), measured alone.
LINGER_SECONDS = 0.5


class MetricsRecorder:
    """Queue + one daemon writer thread. `write(searches, embeds)` persists one batch; while `gone()`
    says the database is gone, batches are dropped at once (counted, said in one log line)."""

    def __init__(self, write: Callable[[list[SearchMetric], list[EmbedMetric]], None],
                 jsonl_path: Path | None = None, gone: Callable[[], bool] = lambda: False):
        self._write = write
        self._gone = gone
        self._dropped_gone = 0  # records dropped unwritten since the database went (not logged yet)
        self.jsonl_path = Path(jsonl_path) if jsonl_path else None
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending = 0
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)
        self._closed = False
        self.dropped = 0  # records lost to write errors (logged)
        self._hurry = threading.Event()  # set by flush() and close(): write without lingering
        self._thread = threading.Thread(target=self._run, name="rag-metrics", daemon=True)
        self._thread.start()

    def record(self, item: SearchMetric | EmbedMetric) -> None:
        """Enqueue one record; never blocks on I/O."""
        if self._closed:
            return
        with self._lock:
            self._pending += 1
        self._queue.put(item)

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                continue
            if first is None:
                return
            self._hurry.wait(LINGER_SECONDS)
            self._hurry.clear()  # before draining: a flush during the write hurries the next batch
            batch = [first]
            stop = False
            while len(batch) < BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            self._persist(batch)
            with self._lock:
                self._pending -= len(batch)
                self._done.notify_all()
            if stop:
                return

    def _persist(self, batch: list[Any]) -> None:
        searches = [m for m in batch if isinstance(m, SearchMetric)]
        embeds = [m for m in batch if isinstance(m, EmbedMetric)]
        try:
            if self._gone():  # no 30 s wait per batch for a database known gone
                self.dropped += len(batch)
                self._dropped_gone += len(batch)
            else:
                self._log_dropped_while_gone()
                self._write(searches, embeds)
        except Exception as exc:  # noqa: BLE001 - metrics must never break searching; the loss is logged
            self.dropped += len(batch)
            # a database that went away is said by the command itself: the log only, not stderr
            gone = database_gone(exc)
            log.log(logging.INFO if gone else logging.WARNING, "could not write %d metric records (%s: %s)",
                    len(batch), type(exc).__name__, str(exc).split("\n")[0], exc_info=not gone)
        if self.jsonl_path and searches:
            try:
                self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
                with self.jsonl_path.open("a", encoding="utf-8") as fh:
                    fh.writelines(json.dumps(jsonl_record(m), default=str) + "\n" for m in searches)
            except OSError as exc:
                log.warning("could not append metrics to %s: %s", self.jsonl_path, exc)

    def _log_dropped_while_gone(self) -> None:
        if self._dropped_gone:
            log.info("dropped %d metric records unwritten: the database was gone", self._dropped_gone)
            self._dropped_gone = 0

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued record is written; False on timeout or once the database is gone."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                self._hurry.set()
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive() or self._gone():
                    return False
                self._done.wait(min(left, IDLE_SECONDS))  # woken to see the database go, too
        return True

    def close(self) -> None:
        """Write what is queued and stop the writer; with the database gone, drop it at once."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._queue.put(None)
        self._hurry.set()
        gone = self._gone()
        # a daemon: a writer still waiting for a gone database ends with the process
        self._thread.join(timeout=0.5 if gone else 5)
        if gone:
            with self._lock:
                self._dropped_gone += self._pending  # still queued, or in a write the database never answers
        self._log_dropped_while_gone()


def search_metric(result: SearchResult, collection: str | None, reranked: bool) -> SearchMetric:
    """The record of one finished search."""
    plan = result.plan or {}
    kind = plan.get("kind")
    strategy = result.mode
    if kind in ("comparison", "relationship") and len(plan.get("tickers") or []) > 1:
        strategy += "+per-ticker"
    if "expand" in result.timings_ms:
        strategy += "+expanded"
    if reranked:
        strategy += "+rerank"
    hits = result.hits
    return SearchMetric(
        query=result.query[:500], mode=result.mode, strategy=strategy, results=len(hits),
        latency_ms=float(result.timings_ms.get("total", 0.0)), query_class=kind,
        top_score=max((h.score for h in hits), default=None), reranked=reranked, collection=collection,
        stages_ms={k: v for k, v in result.timings_ms.items() if k != "total"},
        top_similarity=hits[0].similarity if hits else None,
    )


@dataclasses.dataclass
class SearchMetrics:
    """Seed 004's record of one search (`rag.metrics.SearchMetrics`), as `MetricsCollector.record_search`
    returns it and as its fields appear in each line of the JSONL log."""

    query: str
    query_type: str | None  # our query class (retrieval, relationship, trend, comparison, global)
    strategy: str
    retrieval_count: int
    reranked: bool
    top_similarity: float | None  # the first hit's cosine with the query; None when none was measured
    latency_ms: int
    timestamp: str
    relevance_feedback: int | None = None  # the seed's "future" fields: always None
    context_used: bool | None = None

    @classmethod
    def of(cls, metric: SearchMetric) -> SearchMetrics:
        return cls(query=metric.query, query_type=metric.query_class, strategy=metric.strategy,
                   retrieval_count=metric.results, reranked=metric.reranked, top_similarity=metric.top_similarity,
                   latency_ms=int(round(metric.latency_ms)), timestamp=metric.at.isoformat())


def jsonl_record(metric: SearchMetric) -> dict[str, Any]:
    """One line of the JSONL log: our fields (`SearchMetric.to_dict`) and seed 004's `SearchMetrics`
    fields. Of the names both use, `query`, `strategy` and `reranked` hold the same value and
    `latency_ms` the seed's whole milliseconds (the table keeps the fraction)."""
    return {**metric.to_dict(), **dataclasses.asdict(SearchMetrics.of(metric))}


class MetricsCollector:
    """Seed 004's `get_metrics_collector()` object over a knowledge base's metrics: `record_search`
    records a search the caller timed itself (the table, and the JSONL log when one is configured),
    `get_summary(days)` summarises the recorded searches. Searches through the knowledge base are
    recorded already; nothing here writes a file the settings do not name."""

    def __init__(self, kb: Any):
        self.kb = kb

    @property
    def enabled(self) -> bool:
        """Whether searches are recorded (`search_metrics.enabled`, seed 004's `RAG_METRICS`)."""
        return self.kb.metrics is not None

    @property
    def log_path(self) -> Path | None:
        """The JSONL log searches are appended to (`search_metrics.jsonl_path`; None: the table only)."""
        return self.kb.settings.search_metrics.jsonl_path if self.enabled else None

    def record_search(self, query: str, strategy: str, results: list, latency_ms: float,
                      query_type: str | None = None, reranked: bool = False) -> SearchMetrics:
        """Record one search: `results` its hits, best first (their `similarity` and `score`, as
        attributes or keys, when they have them). Returns the seed's `SearchMetrics`; with metrics off
        nothing is written."""
        from rag_lib.errors import ValidationError

        if not isinstance(query, str) or not isinstance(strategy, str) or not strategy.strip():
            raise ValidationError("query and strategy must be strings (strategy not empty)")
        if not is_number(latency_ms) or latency_ms < 0:
            raise ValidationError(f"latency_ms must be a number, 0 or more, got {latency_ms!r}")
        results = list(results or [])
        first = results[0] if results else None
        scores = [s for s in (_field(r, "score") for r in results) if isinstance(s, (int, float))]
        similarity = _field(first, "similarity")
        base = strategy.split("+", 1)[0].strip().lower()
        metric = SearchMetric(
            query=query[:500], mode={"vector": "semantic", "bm25": "lexical"}.get(base, base), strategy=strategy,
            results=len(results), latency_ms=float(latency_ms), query_class=query_type,
            top_score=max(scores, default=None), reranked=bool(reranked), collection=self.kb.settings.collection,
            top_similarity=float(similarity) if isinstance(similarity, (int, float)) else None,
        )
        if self.kb.metrics is not None:
            self.kb.metrics.record(metric)
        return SearchMetrics.of(metric)

    def get_summary(self, days: float = 7) -> dict[str, Any]:
        """The summary of `rag metrics` over the last `days` days: p50/p95 latency per mode,
        zero-result rate, query-class and strategy mix, embedding failure rate and fallback share."""
        from rag_lib.errors import ValidationError

        if not is_number(days) or not 0 < days <= 3650:
            raise ValidationError(f"days must be a number between 0 and 3650, got {days!r}")
        return self.kb.metrics_summary(since=dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=days))


def _field(item: Any, name: str) -> Any:
    if item is None:
        return None
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


@contextlib.contextmanager
def bound(recorder: MetricsRecorder | None) -> Iterator[None]:
    """Embedding calls made inside go to `recorder`."""
    token = _SINK.set(recorder)
    try:
        yield
    finally:
        _SINK.reset(token)


class EmbedCall:
    """Filled in by the provider while it works: who answered, retries, fallback."""

    def __init__(self, provider: str, model: str | None, inputs: int):
        self.provider = provider
        self.model = model
        self.inputs = inputs
        self.retries = 0
        self.fallback = False


@contextlib.contextmanager
def embed_call(provider: str, model: str | None, inputs: int) -> Iterator[EmbedCall]:
    """Time one embedding call and record it (outermost call only: a chain records once, not per member)."""
    call = EmbedCall(provider, model, inputs)
    sink = _SINK.get()
    if sink is None or _IN_EMBED.get():
        yield call
        return
    token = _IN_EMBED.set(True)
    t0 = time.perf_counter()
    error: str | None = None
    try:
        yield call
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
        raise
    finally:
        _IN_EMBED.reset(token)
        sink.record(EmbedMetric(provider=call.provider, model=call.model, inputs=inputs,
                                latency_ms=round((time.perf_counter() - t0) * 1000, 3), retries=call.retries,
                                fallback=call.fallback, ok=error is None, error=error))
