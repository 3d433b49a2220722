"""SQL for embedding spaces side by side: a 'building' space filled beside the 'active' one,
coverage checks, the one-transaction switch, carrying the documents over to the new space,
rollback and dropping retired spaces."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
from psycopg import sql
from psycopg.types.json import Jsonb

from rag_lib.errors import DimensionMismatchError, NotFoundError, ValidationError
from rag_lib.store.connection import copy_rows
from rag_lib.store.documents import _dicts
from rag_lib.store.vectors import index_name


class SpaceStore:
    """Mixin: needs `self.db` (Connections)."""

    def list_spaces(self) -> list[dict[str, Any]]:
        """Every space with its status, vector count and coverage of the live chunks."""
        with self.db.connection() as conn:
            total = conn.execute("SELECT count(*) FROM rag_chunks").fetchone()[0]
            rows = _dicts(conn.execute(
                """SELECT s.space, s.model, s.dimensions, s.provider, s.status, s.created_at, s.activated_at,
                          s.retired_at, s.chunker, count(v.chunk_id) AS vectors,
                          count(v.chunk_id) FILTER (WHERE vector_dims(v.embedding) <> s.dimensions) AS wrong_dims
                   FROM rag_spaces s LEFT JOIN rag_chunk_vectors v ON v.space = s.space
                   GROUP BY s.space ORDER BY s.created_at"""))
            for row in rows:
                row["chunks"] = total
                row["coverage"] = round(row["vectors"] / total, 6) if total else 1.0
                row["hnsw_index"] = conn.execute("SELECT to_regclass(%s)", (index_name(row["space"]),)).fetchone()[0] is not None
        return rows

    def get_space(self, space: str) -> dict[str, Any] | None:
        return next((s for s in self.list_spaces() if s["space"] == space), None)

    @contextmanager
    def reembed_lock(self, space: str) -> Iterator[bool]:
        """Hold the lock of a re-embed into `space` for the block; yields False (and holds nothing)
        when another process holds it. A transaction-level advisory lock on a connection of its own
        for the block: nothing is held on the session, which PgBouncer's transaction pooling would
        hand to another client, and a process that dies releases it with its connection."""
        with self.db.connection() as conn, conn.transaction():
            yield conn.execute("SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))",
                               (f"reembed\x1f{space}",)).fetchone()[0]

    def begin_building(self, space: str, model: str, dimensions: int, provider: str,
                       chunker: str | None = None) -> str:
        """Register `space` as 'building' (a retired space is reused: its vectors still count), with
        the chunker of its provider (`rag_lib.tokens.chunker_key`) when known. Returns its status
        before the call."""
        with self.db.connection() as conn, conn.transaction():
            conn.execute("LOCK TABLE rag_spaces IN SHARE ROW EXCLUSIVE MODE")
            rows = dict(conn.execute("SELECT space, status FROM rag_spaces").fetchall())
            other = [s for s, st in rows.items() if st == "building" and s != space]
            if other:
                raise ValidationError(
                    f"a re-embed into {other[0]} is in progress; finish it (`rag reembed --to {other[0]}`) "
                    f"or abandon it (`rag reembed --abort`) first"
                )
            before = rows.get(space)
            if before == "active":
                raise ValidationError(f"{space} is already the active space; nothing to re-embed")
            conn.execute(
                """INSERT INTO rag_spaces (space, model, dimensions, provider, status, chunker)
                   VALUES (%s,%s,%s,%s,'building',%s)
                   ON CONFLICT (space) DO UPDATE SET status = 'building', provider = EXCLUDED.provider,
                     chunker = coalesce(EXCLUDED.chunker, rag_spaces.chunker)""",
                (space, model, dimensions, provider, chunker),
            )
        return before or "new"

    def retire_again(self, space: str) -> None:
        """Return `space` from 'building' to 'retired', its retirement time unchanged: a re-embed into
        the space a rollback returns to that did not switch leaves that rollback in place."""
        with self.db.connection() as conn:
            conn.execute("UPDATE rag_spaces SET status = 'retired' WHERE space = %s AND status = 'building'", (space,))

    def note_space_chunker(self, space: str, chunker: str) -> None:
        """Record the chunker of `space`'s provider where none is recorded yet (a space registered
        before chunkers were recorded)."""
        with self.db.connection() as conn:
            conn.execute("UPDATE rag_spaces SET chunker = %s WHERE space = %s AND chunker IS NULL", (chunker, space))

    def missing_chunks(self, space: str, limit: int) -> list[tuple[str, str, str]]:
        """(chunk_id, content_hash, embed_text) of live chunks without a vector in `space`."""
        with self.db.connection() as conn:
            return conn.execute(
                """SELECT c.chunk_id, c.content_hash, c.embed_text FROM rag_chunks c
                   WHERE NOT EXISTS (SELECT 1 FROM rag_chunk_vectors v WHERE v.space = %s AND v.chunk_id = c.chunk_id)
                   ORDER BY c.chunk_id LIMIT %s""",
                (space, limit),
            ).fetchall()

    def write_space_vectors(self, space: str, dimensions: int, rows: Sequence[tuple[str, np.ndarray]]) -> int:
        """Add vectors to a non-active space in one transaction; chunks deleted meanwhile are skipped."""
        bad = [cid for cid, vec in rows if len(vec) != dimensions]
        if bad:
            raise DimensionMismatchError(
                f"{len(bad)} vectors do not have {dimensions} dimensions (first: {bad[0]}); nothing was written"
            )
        if not rows:
            return 0
        with self.db.connection() as conn, conn.transaction(), conn.cursor() as cur:
            status = cur.execute("SELECT status FROM rag_spaces WHERE space = %s FOR SHARE", (space,)).fetchone()
            if status is None or status[0] == "active":
                raise ValidationError(f"space {space} is {'missing' if status is None else 'active'}; fill refused")
            cur.execute("CREATE TEMP TABLE IF NOT EXISTS _space_in (chunk_id text, embedding vector) ON COMMIT DELETE ROWS")
            copy_rows(cur, "_space_in (chunk_id, embedding)", ["text", "vector"], rows)
            cur.execute(
                """INSERT INTO rag_chunk_vectors (chunk_id, space, dimensions, embedding)
                   SELECT i.chunk_id, %s, %s, i.embedding FROM _space_in i
                   JOIN rag_chunks c ON c.chunk_id = i.chunk_id
                   ON CONFLICT (space, chunk_id) DO NOTHING""",
                (space, dimensions),
            )
            return cur.rowcount

    def switch_active(self, space: str) -> str | None:
        """Make `space` active and retire the current one, in one transaction, only if every live
        chunk has a vector of the right size in it. Publishing waits for the few milliseconds this
        takes (SHARE lock on rag_chunks); searches do not. Returns the space that was active."""
        with self.db.connection() as conn, conn.transaction():
            conn.execute("LOCK TABLE rag_spaces IN SHARE ROW EXCLUSIVE MODE")
            conn.execute("LOCK TABLE rag_chunks IN SHARE MODE")  # no chunk can appear or vanish now
            row = conn.execute("SELECT dimensions, status FROM rag_spaces WHERE space = %s", (space,)).fetchone()
            if row is None:
                raise NotFoundError(f"no embedding space {space}; see `rag reembed --status`")
            dims, status = row
            if status == "active":
                return space
            missing = conn.execute(
                """SELECT count(*) FROM rag_chunks c WHERE NOT EXISTS
                   (SELECT 1 FROM rag_chunk_vectors v WHERE v.space = %s AND v.chunk_id = c.chunk_id)""",
                (space,),
            ).fetchone()[0]
            wrong = conn.execute(
                "SELECT count(*) FROM rag_chunk_vectors WHERE space = %s AND vector_dims(embedding) <> %s",
                (space, dims),
            ).fetchone()[0]
            if missing or wrong:
                raise ValidationError(
                    f"cannot switch to {space}: {missing} chunks lack a vector and {wrong} vectors have the wrong "
                    f"size; run `rag reembed --to {space}` to finish filling it"
                )
            old = conn.execute("SELECT space FROM rag_spaces WHERE status = 'active'").fetchone()
            conn.execute(
                "UPDATE rag_spaces SET status = 'retired', retired_at = now() WHERE status IN ('active', 'building')"
                " AND space <> %s", (space,))
            conn.execute(
                "UPDATE rag_spaces SET status = 'active', activated_at = now(), retired_at = NULL WHERE space = %s",
                (space,))
        return old[0] if old else None

    def carry_over(self, old: str, new: str, fingerprints: tuple[str, str],
                   versions: dict[str, tuple[str, str]]) -> dict[str, int]:
        """After a switch from space `old` to `new` whose providers cut the same chunks: what was made
        under fingerprint `fingerprints[0]` (settings naming `old`) is marked as made under
        `fingerprints[1]` (the same settings naming `new`) wherever that holds, in one transaction.
        A document only when every chunk of it has a vector in `new`; the staged vectors of a file
        whose embeddings output has the old fingerprint are replaced by `new`'s vectors of the same
        live chunk text, and that output only once all of them are; a vector_table output once none
        of its documents is live under another fingerprint. `versions`: stage → (its version in
        `old`, in `new`). Returns how many documents, stage outputs and staged vectors changed."""
        with self.db.connection() as conn, conn.transaction():
            spaces = {r[0]: r[1:] for r in conn.execute(
                "SELECT space, model, dimensions, provider FROM rag_spaces WHERE space IN (%s, %s)", (old, new))}
            (old_model, old_dims, _), (model, dims, provider) = spaces[old], spaces[new]
            params = {"fa": fingerprints[0], "fb": fingerprints[1], "new": new, "model": model, "dims": dims,
                      "old_model": old_model, "old_dims": old_dims}
            staged = conn.execute(
                """UPDATE rag_stage_vectors s SET model = %(model)s, dimensions = %(dims)s, embedding = v.embedding,
                          updated_at = now()
                   FROM rag_stage_outputs o, rag_chunks c, rag_chunk_vectors v
                   WHERE o.stage = 'embeddings' AND o.collection = s.collection AND o.path = s.path
                     AND o.payload->>'status' = 'ok' AND o.payload->>'fingerprint' = %(fa)s
                     AND o.payload->>'version' = %(va)s
                     AND s.model = %(old_model)s AND s.dimensions = %(old_dims)s
                     AND c.chunk_id = s.chunk_id AND c.content_hash = s.content_hash
                     AND v.space = %(new)s AND v.chunk_id = c.chunk_id""",
                {**params, "va": versions["embeddings"][0]}).rowcount
            documents = conn.execute(
                """UPDATE rag_documents d SET fingerprint = %(fb)s WHERE d.fingerprint = %(fa)s AND NOT EXISTS (
                     SELECT 1 FROM rag_chunks c WHERE c.collection = d.collection AND c.path = d.path
                       AND NOT EXISTS (SELECT 1 FROM rag_chunk_vectors v WHERE v.space = %(new)s
                                         AND v.chunk_id = c.chunk_id))""", params).rowcount
            conditions = {
                # every staged vector is the new model's, one per chunk the output counts
                "embeddings": """(o.payload->>'status' = 'skipped' OR (
                    NOT EXISTS (SELECT 1 FROM rag_stage_vectors s WHERE s.collection = o.collection
                                  AND s.path = o.path AND (s.model <> %(model)s OR s.dimensions <> %(dims)s))
                    AND (SELECT count(*) FROM rag_stage_vectors s WHERE s.collection = o.collection
                           AND s.path = o.path) = coalesce((o.payload->>'vectors')::int, -1)))""",
                "vector_table": """NOT EXISTS (
                    SELECT 1 FROM jsonb_array_elements_text(coalesce(o.payload->'documents', '[]')) AS p(path)
                    JOIN rag_documents d ON d.collection = o.collection AND d.path = p.path
                    WHERE d.fingerprint <> %(fb)s)""",
            }
            # what an output's metadata says of the space it was made in
            meta = {"embeddings": {"model": model, "dimensions": dims, "provider": provider},
                    "vector_table": {"space": new}}
            outputs = 0
            for stage, (va, vb) in versions.items():
                patch = {"fingerprint": fingerprints[1], "version": vb, **({"space": new} if stage == "embeddings" else {})}
                outputs += conn.execute(
                    f"""UPDATE rag_stage_outputs o SET updated_at = now(), payload = CASE
                          WHEN o.payload->>'status' = 'ok' AND jsonb_typeof(o.payload->'meta') = 'object'
                          THEN jsonb_set(o.payload || %(patch)s, '{{meta}}', (o.payload->'meta') || %(meta)s)
                          ELSE o.payload || %(patch)s END
                        WHERE o.stage = %(stage)s AND o.payload->>'fingerprint' = %(fa)s
                          AND o.payload->>'version' = %(va)s AND o.payload->>'status' IN ('ok', 'skipped')
                          AND {conditions.get(stage, 'TRUE')}""",
                    {**params, "stage": stage, "va": va, "patch": Jsonb(patch),
                     "meta": Jsonb(meta.get(stage, {}))}).rowcount
        return {"documents": documents, "stage_outputs": outputs, "staged_vectors": staged}

    def previous_space(self) -> str | None:
        """The most recently retired space (what a rollback returns to)."""
        with self.db.connection() as conn:
            row = conn.execute(
                "SELECT space FROM rag_spaces WHERE status = 'retired' ORDER BY retired_at DESC NULLS LAST LIMIT 1"
            ).fetchone()
        return row[0] if row else None

    def drop_space(self, space: str) -> int:
        """Delete a non-active space: its HNSW index, its vectors and its row (the cache stays)."""
        with self.db.connection() as conn:
            conn.autocommit = True
            try:
                status = conn.execute("SELECT status FROM rag_spaces WHERE space = %s", (space,)).fetchone()
                if status is None:
                    raise NotFoundError(f"no embedding space {space}")
                if status[0] == "active":
                    raise ValidationError(f"{space} is the active space; it cannot be dropped")
                conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(index_name(space))))
                with conn.transaction():
                    deleted = conn.execute("DELETE FROM rag_chunk_vectors WHERE space = %s", (space,)).rowcount
                    conn.execute("DELETE FROM rag_spaces WHERE space = %s AND status <> 'active'", (space,))
            finally:
                conn.autocommit = False
        return deleted
