"""Semantic search over the whole shared corpus: relevance, filters, scores and result fields."""

from __future__ import annotations

import datetime as dt

import pytest

from rag_lib.errors import ValidationError
from rag_lib.models import SearchFilters


def test_finds_the_right_document_for_a_ticker_question(corpus_kb):
    result = corpus_kb.search("Pfizer dividend yield and oversold RSI", top_k=5)
    assert result.hits[0].ticker == "PFE"
    hit = result.hits[0]
    assert 0.0 <= hit.score <= 1.0
    assert hit.unit_id == f"{hit.path}#{hit.section}"
    assert hit.doc_id and hit.text and hit.doc_type == "stock-analysis"
    assert set(result.timings_ms) >= {"embed", "search", "total"}
    scores = [h.score for h in result.hits]
    assert scores == sorted(scores, reverse=True)


def test_filters_restrict_every_result(corpus_kb):
    by_type = corpus_kb.search("position sizing and stop loss", doc_type="trade-journal", top_k=20)
    assert by_type.hits and {h.doc_type for h in by_type.hits} == {"trade-journal"}
    by_ticker = corpus_kb.search("earnings expectations", ticker="nvda", top_k=20)
    assert by_ticker.hits and {h.ticker for h in by_ticker.hits} == {"NVDA"}
    by_section = corpus_kb.search("decision", section="phase7_decision", top_k=20)
    assert by_section.hits and {h.section for h in by_section.hits} == {"phase7_decision"}
    dated = corpus_kb.search("analysis", date_from=dt.date(2026, 1, 1), date_to=dt.date(2026, 12, 31), top_k=20)
    assert dated.hits and all(dt.date(2026, 1, 1) <= h.doc_date <= dt.date(2026, 12, 31) for h in dated.hits)
    several = corpus_kb.search("valuation", ticker=["MSFT", "META"], top_k=30)
    assert {h.ticker for h in several.hits} == {"MSFT", "META"}


def test_filtered_search_still_fills_top_k(corpus_kb):
    # Iterative index scans keep going past the first ef_search candidates.
    corpus_kb.settings.search.exact_max_rows = 0  # force the HNSW path for every filter
    corpus_kb.settings.search.ef_search = 40  # fewer candidates than asked for: the scan must go on
    hits = corpus_kb.search("options flow scanner", doc_type="stock-analysis", top_k=60).hits
    assert len(hits) == 60


def test_selective_filters_are_ranked_exactly(corpus_kb):
    store = corpus_kb.store
    space = store.active_space()
    nvda = SearchFilters(collection="default", ticker="NVDA")
    assert store.semantic_scan(nvda) == "exact"
    assert store.semantic_scan(SearchFilters()) == "hnsw"  # no filter: always the index
    vector = corpus_kb.embed_text("data center revenue guidance")
    served = store.semantic_search(vector, space["space"], space["dimensions"], nvda, 20)
    exact = store.semantic_search(vector, space["space"], space["dimensions"], nvda, 20, exact=True)
    assert [h.chunk_id for h in served] == [h.chunk_id for h in exact] and len(served) == 20
    assert all(h.ticker == "NVDA" for h in served)
    store.settings.search.exact_max_rows = 10  # NVDA has more chunks than that: the graph walk
    assert store.semantic_scan(nvda) == "hnsw"
    assert {h.ticker for h in store.semantic_search(vector, space["space"], space["dimensions"], nvda, 20)} == {"NVDA"}


def test_hnsw_walk_scales_with_the_index(corpus_kb, monkeypatch):
    """search.ef_search 0 (the default): a filtered search over the HNSW index walks 200 candidates
    up to 100k vectors and 100 more per tenfold (300 at 1M, where 200 gave recall@10 0.943 and 300
    0.971, docs/scale.md); `rag status` shows what searches use; a set value stands."""
    import psycopg

    from rag_lib.store import vectors

    sent: list[str] = []
    execute = psycopg.Connection.execute

    def spy(self, query, params=None, **kw):  # what the search sets on the real server
        sent.extend(params[i + 1] for i, p in enumerate(params or ()) if isinstance(p, str) and p == "hnsw.ef_search")
        return execute(self, query, params, **kw)

    monkeypatch.setattr(psycopg.Connection, "execute", spy)
    corpus_kb.settings.search.exact_max_rows = 0  # the filter goes through the graph walk

    def walked() -> str:
        sent.clear()
        assert corpus_kb.search("data center revenue", mode="semantic", doc_type="stock-analysis").hits
        return sent[-1]

    assert walked() == "200"  # 3,325 vectors (before: 300 at every size)
    assert corpus_kb.settings.search.ef_search == 0
    assert corpus_kb.status()["index"]["ef_search"] == 200
    assert [vectors.scaled_ef_search(n) for n in (3_325, 100_000, 316_228, 1_000_000, 10_000_000)] == \
        [200, 200, 250, 300, 400]
    # the index's own size decides: the same index read as ten times the base size (as 1M is to 100k)
    monkeypatch.setattr(vectors, "EF_SEARCH_BASE_ROWS", 332)
    assert walked() == "300" and corpus_kb.status()["index"]["ef_search"] == 300
    corpus_kb.settings.search.ef_search = 120  # a configured value applies at every size
    assert walked() == "120" and corpus_kb.status()["index"]["ef_search"] == 120


def test_top_k_and_min_similarity(corpus_kb):
    assert len(corpus_kb.search("market regime", top_k=3).hits) == 3
    loose = corpus_kb.search("market regime", mode="semantic", top_k=50).hits
    assert len(loose) == 50
    cut = sorted((h.similarity for h in loose), reverse=True)[9]  # the 10th best similarity
    strict = corpus_kb.search("market regime", mode="semantic", top_k=50, min_similarity=cut).hits
    # the best ones pass the threshold, nothing below it does (a fixed 0.5 let an empty list pass)
    assert strict and all(h.similarity >= cut for h in strict)
    assert len(strict) < len(loose)


def test_other_collections_are_not_searched(corpus_kb):
    assert corpus_kb.search("NVDA", collection="nothing-here").hits == []


def test_bad_queries_get_clear_errors(corpus_kb):
    with pytest.raises(ValidationError, match="empty"):
        corpus_kb.search("   ")
    with pytest.raises(ValidationError, match="mode"):
        corpus_kb.search("x", mode="telepathic")
    with pytest.raises(ValidationError, match="top_k"):
        corpus_kb.search("x", top_k=0)


def _hashed_tables(node: dict, under_hash: bool = False) -> set[str]:
    """Tables read beneath a Hash node of an EXPLAIN (FORMAT JSON) plan."""
    under_hash = under_hash or node.get("Node Type") == "Hash"
    found = {node["Relation Name"]} if under_hash and "Relation Name" in node else set()
    for child in node.get("Plans", []):
        found |= _hashed_tables(child, under_hash)
    return found


def test_exact_ranking_over_most_of_the_space_never_hashes_the_vectors(corpus_kb, monkeypatch):
    """A collection that is (most of) the space is ranked by computing each distance as its vector is
    read; joined to the filtered rows first, PostgreSQL hashed every vector (5 MB copied per query on
    this corpus, twice per hybrid search). A selective filter still joins first. Both shapes rank
    the same chunks with the same scores, the feedback query's as well."""
    from psycopg import sql

    from rag_lib.store import vectors

    store = corpus_kb.store
    corpus_kb.settings.search.rank_in_process = False  # the database's own ranking (the process's: test_search_in_process)
    space = store.active_space()
    vector = corpus_kb.embed_text("data center revenue guidance")
    everything = SearchFilters(collection="default")
    nvda = SearchFilters(collection="default", ticker="NVDA")

    def ranked(filters: SearchFilters, ratio: int, **feedback) -> list[tuple[str, float]]:
        monkeypatch.setattr(vectors, "SPACE_SCAN_RATIO", ratio)  # 0: always join first; huge: always scan
        store.scan_decisions.clear()
        hits = store.semantic_search(vector, space["space"], space["dimensions"], filters, 30, **feedback)
        return [(h.chunk_id, h.score, h.similarity) for h in hits]

    for filters in (everything, nvda):
        joined = ranked(filters, 0)
        assert len(joined) == 30 and joined == ranked(filters, 10**6)
    toward = [cid for cid, _, _ in ranked(everything, 0)[:3]]
    moved = ranked(everything, 0, toward=toward, weight=0.8)
    assert moved and moved == ranked(everything, 10**6, toward=toward, weight=0.8)
    assert [cid for cid, _, _ in moved] != [cid for cid, _, _ in ranked(everything, 0)]  # feedback moved it

    # the default ratio scans the whole space for the whole collection, and its plan hashes no vector
    monkeypatch.setattr(vectors, "SPACE_SCAN_RATIO", 4)
    store.scan_decisions.clear()
    with store.db.connection() as conn:
        rows = store._scan_for(conn, *vectors._filter_sql(everything))[1]
        assert store._scans_whole_space(conn, space["space"], rows)
        assert not store._scans_whole_space(conn, space["space"], store._scan_for(conn, *vectors._filter_sql(nvda))[1])
        where, params = vectors._filter_sql(everything)
        query, args = vectors.nearest_sql(sql.SQL("v.embedding <=> %s::vector"), [vector], space["space"], where,
                                          params, 50, True, False)
        plan = conn.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + query, args).fetchone()[0][0]["Plan"]
    assert "rag_chunk_vectors" not in _hashed_tables(plan)


def test_long_id_lists_reach_the_database_intact(corpus_kb):
    """Feedback's candidate ids travel as one string the server splits (dumping a list of 550 ids
    cost 0.9 ms of the server's CPU per search); ids holding the separator, and no ids, arrive as sent."""
    from psycopg import sql

    from rag_lib.store.vectors import text_array

    for values in (["a1b2", "c3d4", "e5f6"], ["plain", "with,comma"], [""], ["a", ""], []):
        fragment, arg = text_array(values)
        with corpus_kb.store.db.connection() as conn:
            got = conn.execute(sql.SQL("SELECT ARRAY(SELECT unnest({}))").format(fragment), [arg]).fetchone()[0]
        assert got == values
