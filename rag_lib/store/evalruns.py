"""SQL for the retrieval-quality history: each run of the configured eval set and its baseline."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from rag_lib.store.documents import _dicts


class EvalRunStore:
    """Mixin: needs `self.db` (Connections)."""

    def record_eval_run(self, eval_set: str, ndcg: float, metrics: dict[str, Any], outcome: str, accepted: bool) -> int:
        with self.db.connection() as conn, conn.transaction():
            return conn.execute(
                "INSERT INTO rag_eval_runs (eval_set, ndcg, metrics, outcome, accepted) VALUES (%s, %s, %s, %s, %s)"
                " RETURNING id", (eval_set, ndcg, Jsonb(metrics), outcome, accepted)).fetchone()[0]

    def last_accepted_eval(self, eval_set: str) -> dict[str, Any] | None:
        """The newest accepted run of this set (the baseline), or None."""
        rows = self.eval_history(eval_set, 1, accepted_only=True)
        return rows[0] if rows else None

    def eval_history(self, eval_set: str, limit: int = 10, accepted_only: bool = False) -> list[dict[str, Any]]:
        """The newest runs of this set first."""
        with self.db.connection() as conn:
            cur = conn.execute(
                "SELECT id, at, ndcg, metrics, outcome, accepted FROM rag_eval_runs WHERE eval_set = %s"
                + (" AND accepted" if accepted_only else "") + " ORDER BY at DESC, id DESC LIMIT %s",
                (eval_set, limit))
            return _dicts(cur)

    def held_units(self, collection: str, units: Sequence[str], unit: str) -> tuple[set[str], set[str]]:
        """Of judged `units` (unit ids `<path>#<section>`, or document ids for `unit` 'document'): those
        some chunk of `collection` carries, and what the others may have meant (held units equal to one
        ignoring case, or sections of the same document)."""
        column = "unit_id" if unit == "section" else "doc_id"
        paths = [u.rsplit("#", 1)[0] for u in units if "#" in u] if unit == "section" else []
        with self.db.connection() as conn:
            rows = conn.execute(
                f"SELECT DISTINCT {column} FROM rag_chunks WHERE collection = %s"
                f" AND (lower({column}) = ANY(%s) OR path = ANY(%s))",
                (collection, [u.lower() for u in units], paths)).fetchall()
        found = {r[0] for r in rows}
        return found & set(units), found - set(units)
