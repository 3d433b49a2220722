"""SQL behind search and embedding metrics: batch inserts and the summary `rag metrics` prints."""

from __future__ import annotations

import datetime as dt
from typing import Any

from psycopg.types.json import Jsonb

from rag_lib.models import EmbedMetric, SearchMetric
from rag_lib.store.documents import _dicts


class MetricsStore:
    """Mixin: needs `self.db` (Connections)."""

    def insert_metrics(self, searches: list[SearchMetric], embeds: list[EmbedMetric]) -> None:
        """Write one batch of records (one transaction)."""
        with self.db.connection() as conn, conn.transaction():
            if searches:
                with conn.cursor() as cur:
                    cur.executemany(
                        """INSERT INTO rag_search_metrics (at, collection, query, query_class, mode, strategy, reranked,
                                                           results, top_score, latency_ms, stages_ms)
                           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)""",
                        [(m.at, m.collection, m.query, m.query_class, m.mode, m.strategy, m.reranked, m.results,
                          m.top_score, m.latency_ms, Jsonb(m.stages_ms)) for m in searches])
            if embeds:
                with conn.cursor() as cur:
                    cur.executemany(
                        """INSERT INTO rag_embed_metrics (at, provider, model, inputs, latency_ms, retries, fallback, ok,
                                                          error) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)""",
                        [(m.at, m.provider, m.model, m.inputs, m.latency_ms, m.retries, m.fallback, m.ok, m.error)
                         for m in embeds])

    def metrics_summary(self, since: dt.datetime | None = None) -> dict[str, Any]:
        """p50/p95 latency per mode, zero-result rate, class and strategy mix, embed failure rate and
        fallback share, over records at or after `since` (all when None)."""
        params = {"since": since or dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)}
        with self.db.connection() as conn:
            total = _dicts(conn.execute(
                """SELECT count(*) AS searches, count(*) FILTER (WHERE results = 0) AS zero_results,
                          count(*) FILTER (WHERE reranked) AS reranked, avg(top_score) AS avg_top_score,
                          min(at) AS first_at, max(at) AS last_at
                   FROM rag_search_metrics WHERE at >= %(since)s""", params))[0]
            by_mode = _dicts(conn.execute(
                """SELECT mode, count(*) AS searches,
                          percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) AS p50_ms,
                          percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) AS p95_ms,
                          avg(CASE WHEN results = 0 THEN 1.0 ELSE 0.0 END) AS zero_result_rate
                   FROM rag_search_metrics WHERE at >= %(since)s GROUP BY mode ORDER BY mode""", params))
            classes = conn.execute(
                """SELECT coalesce(query_class, 'unclassified'), count(*) FROM rag_search_metrics
                   WHERE at >= %(since)s GROUP BY 1 ORDER BY 2 DESC, 1""", params).fetchall()
            strategies = conn.execute(
                """SELECT strategy, count(*) FROM rag_search_metrics WHERE at >= %(since)s
                   GROUP BY 1 ORDER BY 2 DESC, 1""", params).fetchall()
            embed = _dicts(conn.execute(
                """SELECT count(*) AS calls, count(*) FILTER (WHERE NOT ok) AS failures,
                          count(*) FILTER (WHERE fallback) AS fallbacks, coalesce(sum(retries), 0) AS retries,
                          percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) AS p50_ms,
                          percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) AS p95_ms
                   FROM rag_embed_metrics WHERE at >= %(since)s""", params))[0]
            providers = conn.execute(
                """SELECT provider, count(*) FROM rag_embed_metrics WHERE at >= %(since)s GROUP BY 1 ORDER BY 2 DESC""",
                params).fetchall()
        n = total["searches"]
        calls = embed["calls"]
        return {
            "since": since.isoformat() if since else None,
            "searches": n,
            "zero_result_rate": round(total["zero_results"] / n, 4) if n else 0.0,
            "rerank_share": round(total["reranked"] / n, 4) if n else 0.0,
            "avg_top_score": round(float(total["avg_top_score"]), 4) if total["avg_top_score"] is not None else None,
            "first_at": total["first_at"].isoformat() if total["first_at"] else None,
            "last_at": total["last_at"].isoformat() if total["last_at"] else None,
            "by_mode": {r["mode"]: {"searches": r["searches"], "p50_ms": round(r["p50_ms"], 2),
                                    "p95_ms": round(r["p95_ms"], 2),
                                    "zero_result_rate": round(float(r["zero_result_rate"]), 4)} for r in by_mode},
            "query_classes": {name: count for name, count in classes},
            "strategies": {name: count for name, count in strategies},
            "embedding": {
                "calls": calls,
                "failures": embed["failures"],
                "failure_rate": round(embed["failures"] / calls, 4) if calls else 0.0,
                "fallback_share": round(embed["fallbacks"] / calls, 4) if calls else 0.0,
                "retries": int(embed["retries"]),
                "p50_ms": round(embed["p50_ms"], 2) if embed["p50_ms"] is not None else None,
                "p95_ms": round(embed["p95_ms"], 2) if embed["p95_ms"] is not None else None,
                "by_provider": {name: count for name, count in providers},
            },
        }
