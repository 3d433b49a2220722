"""SQL for embedding accounting (per run and provider) and the embedding cache's stats and pruning."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag_lib.embedding.usage import Usage
from rag_lib.store.documents import _dicts


class UsageStore:
    """Mixin: needs `self.db` (Connections)."""

    def record_embedding(self, run_id: str, kind: str, space: str | None, cache_hits: int, cache_misses: int,
                         usages: Sequence[Usage], prices: dict[str, float]) -> None:
        """Add one embed call's counts to its run (rows are created on first use)."""
        with self.db.connection() as conn, conn.transaction():
            conn.execute(
                """INSERT INTO rag_embedding_runs (run_id, kind, space, cache_hits, cache_misses)
                   VALUES (%s,%s,%s,%s,%s)
                   ON CONFLICT (run_id) DO UPDATE SET cache_hits = rag_embedding_runs.cache_hits + EXCLUDED.cache_hits,
                     cache_misses = rag_embedding_runs.cache_misses + EXCLUDED.cache_misses, updated_at = now()""",
                (run_id, kind, space, cache_hits, cache_misses),
            )
            for u in usages:
                if not (u.requests or u.inputs or u.tokens or u.failures):
                    continue
                conn.execute(
                    """INSERT INTO rag_embedding_usage AS t (run_id, provider, model, dimensions, requests, retries,
                           failures, inputs, tokens, tokens_estimated, cost_usd)
                       VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)
                       ON CONFLICT (run_id, provider, model, dimensions) DO UPDATE SET
                         requests = t.requests + EXCLUDED.requests, retries = t.retries + EXCLUDED.retries,
                         failures = t.failures + EXCLUDED.failures, inputs = t.inputs + EXCLUDED.inputs,
                         tokens = t.tokens + EXCLUDED.tokens,
                         tokens_estimated = t.tokens_estimated OR EXCLUDED.tokens_estimated,
                         cost_usd = t.cost_usd + EXCLUDED.cost_usd, updated_at = now()""",
                    (run_id, u.provider, u.model, u.dimensions, u.requests, u.retries, u.failures, u.inputs,
                     u.tokens, u.tokens_estimated, u.cost(prices)),
                )

    def run_usage(self, run_id: str) -> dict[str, Any] | None:
        """One run: cache hits/misses and per-provider tokens, requests, retries and cost."""
        with self.db.connection() as conn:
            runs = _dicts(conn.execute("SELECT * FROM rag_embedding_runs WHERE run_id = %s", (run_id,)))
            if not runs:
                return None
            providers = _dicts(conn.execute(
                """SELECT provider, model, dimensions, requests, retries, failures, inputs, tokens,
                          tokens_estimated, cost_usd FROM rag_embedding_usage WHERE run_id = %s
                   ORDER BY provider, model""", (run_id,)))
        return _run_dict(runs[0], providers)

    def usage_summary(self, recent: int = 5) -> dict[str, Any]:
        """Totals per provider/model since the start, and the most recent runs."""
        with self.db.connection() as conn:
            totals = _dicts(conn.execute(
                """SELECT provider, model, dimensions, sum(requests)::bigint AS requests,
                          sum(retries)::bigint AS retries, sum(failures)::bigint AS failures,
                          sum(tokens)::bigint AS tokens, sum(cost_usd) AS cost_usd, count(*) AS runs
                   FROM rag_embedding_usage GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"""))
            runs = _dicts(conn.execute(
                """SELECT r.run_id, r.kind, r.space, r.cache_hits, r.cache_misses, r.started_at,
                          coalesce(sum(u.requests), 0)::bigint AS requests, coalesce(sum(u.retries), 0)::bigint AS retries,
                          coalesce(sum(u.tokens), 0)::bigint AS tokens, coalesce(sum(u.cost_usd), 0) AS cost_usd
                   FROM rag_embedding_runs r LEFT JOIN rag_embedding_usage u USING (run_id)
                   GROUP BY r.run_id ORDER BY r.started_at DESC LIMIT %s""", (recent,)))
        for row in runs:
            looked = row["cache_hits"] + row["cache_misses"]
            row["cache_hit_rate"] = round(row["cache_hits"] / looked, 4) if looked else None
        return {"by_provider": totals, "recent_runs": runs}

    # ---- cache ---------------------------------------------------------------------------

    def cache_stats(self) -> dict[str, Any]:
        """Entries per model/dims, how many live chunks still use them, age, size on disk."""
        with self.db.connection() as conn:
            rows = _dicts(conn.execute(
                """SELECT e.model, e.dimensions, count(*) AS entries,
                          count(*) FILTER (WHERE EXISTS (SELECT 1 FROM rag_chunks c
                                                         WHERE c.content_hash = e.content_hash)) AS referenced,
                          min(e.created_at) AS oldest, max(e.last_used_at) AS last_used
                   FROM rag_embedding_cache e GROUP BY 1, 2 ORDER BY 1, 2"""))
            size = conn.execute("SELECT pg_total_relation_size('rag_embedding_cache')").fetchone()[0]
        return {"models": rows, "entries": sum(r["entries"] for r in rows), "bytes": int(size)}

    def cache_prune(self, older_than_days: float = 30.0, include_referenced: bool = False,
                    model: str | None = None) -> int:
        """Delete entries unused for `older_than_days`; entries live chunks still use are kept
        (they make rollbacks and re-chunking free) unless `include_referenced`."""
        with self.db.connection() as conn:
            cur = conn.execute(
                """DELETE FROM rag_embedding_cache e
                   WHERE e.last_used_at < now() - make_interval(secs => %(s)s)
                     AND (%(m)s::text IS NULL OR e.model = %(m)s)
                     AND (%(all)s OR NOT EXISTS (SELECT 1 FROM rag_chunks c WHERE c.content_hash = e.content_hash))""",
                {"s": older_than_days * 86400, "m": model, "all": include_referenced},
            )
            return cur.rowcount


def _run_dict(run: dict[str, Any], providers: list[dict[str, Any]]) -> dict[str, Any]:
    looked = run["cache_hits"] + run["cache_misses"]
    return {
        **run,
        "cache_hit_rate": round(run["cache_hits"] / looked, 4) if looked else None,
        "providers": providers,
        "requests": sum(p["requests"] for p in providers),
        "retries": sum(p["retries"] for p in providers),
        "tokens": sum(p["tokens"] for p in providers),
        "cost_usd": sum(p["cost_usd"] for p in providers),
    }
