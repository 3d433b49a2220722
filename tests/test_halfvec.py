"""`search.vector_type: halfvec`: the HNSW index is built on `halfvec(d)` with `halfvec_cosine_ops`,
semantic search uses it, and switching the setting back rebuilds a `vector` index."""

from __future__ import annotations

import psycopg
import pytest

from rag_lib.api import KnowledgeBase
from rag_lib.models import SearchFilters
from rag_lib.store.vectors import index_name

TRADE = "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml"

# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


def _index_def(url: str, name: str) -> str:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT pg_get_indexdef(to_regclass(%s))", (name,)).fetchone()[0]


def test_halfvec_index_serves_search_and_switches_back(settings, provider, corpus_copy):
    settings.search.vector_type = "halfvec"
    root = corpus_copy(TRADE)
    with KnowledgeBase(settings, provider=provider) as kb:
        assert kb.ingest([root], "default").count("new") == 1
        space = kb.store.active_space()
        name = index_name(space["space"])
        definition = _index_def(settings.database_url, name)
        assert "halfvec(384)" in definition and "halfvec_cosine_ops" in definition

        # The store's query (no filters: the HNSW path) casts to halfvec and finds the trade.
        query = kb.embed_text("why did the NVDA trade enter at support")
        hits = kb.store.semantic_search(query, space["space"], 384, SearchFilters(), 3)
        assert hits and hits[0].path == TRADE
        assert kb.search("why did the NVDA trade enter at support", top_k=3).hits[0].path == TRADE
        with psycopg.connect(settings.database_url) as conn:
            # one document's rows, analyzed after the load: only a sort-free plan is the index's
            conn.execute("SET enable_seqscan = off")
            conn.execute("SET enable_sort = off")
            plan = "\n".join(r[0] for r in conn.execute(
                "EXPLAIN SELECT chunk_id FROM rag_chunk_vectors WHERE space = %s"
                " ORDER BY embedding::halfvec(384) <=> %s::halfvec(384) LIMIT 5", (space["space"], str(query.tolist()))))
        assert name in plan

        # Back to float32: the next ensure sees the other opclass and rebuilds.
        settings.search.vector_type = "vector"
        assert kb.store.ensure_hnsw_index(space["space"], 384)["created"] is True
        assert "vector_cosine_ops" in _index_def(settings.database_url, name)
        assert kb.store.ensure_hnsw_index(space["space"], 384)["created"] is False
        hits = kb.store.semantic_search(query, space["space"], 384, SearchFilters(), 3)
        assert hits and hits[0].path == TRADE


def test_two_builders_of_one_space_index_at_once_build_it_once(settings, provider, corpus_copy):
    """Two first ingests finishing together both ask for the index: the one that waited finds it built
    (the name is looked up again after the lock, not in a catalog cache from before it) instead of
    failing with DuplicateTable."""
    import threading

    root = corpus_copy(TRADE)
    with KnowledgeBase(settings, provider=provider) as kb:
        kb.ingest([root], "default")
        space = kb.store.active_space()["space"]
        assert kb.store.drop_hnsw_index(space)
        outcomes: list[object] = []
        with psycopg.connect(settings.database_url) as holder:
            # Hold the builders' lock so both look the index up (missing) before either builds it.
            holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"hnsw\x1f{space}",))

            def build() -> None:
                try:
                    outcomes.append(kb.store.ensure_hnsw_index(space, 384)["created"])
                except Exception as exc:  # noqa: BLE001 - the assertion names it
                    outcomes.append(exc)

            threads = [threading.Thread(target=build) for _ in range(2)]
            for t in threads:
                t.start()
            waiting = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            for _ in range(500):
                if holder.execute(waiting).fetchone()[0] == 2:
                    break
                threading.Event().wait(0.01)
            holder.commit()  # releases the lock: one builds, the other must find it
        for t in threads:
            t.join(60)
        assert sorted(map(str, outcomes)) == ["False", "True"], outcomes
