"""Pseudo-relevance feedback (`search.feedback_weight`): the query vector takes a Rocchio step towards
the first pass's best sections, so a question worded unlike a document still reaches the document's
other sections that answer it. Fixture corpus written here; real database and model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rag_lib.models import SearchFilters
from rag_lib.search.retrieval import feedback_chunks
from testkit import round_trips

# One streaming company's notes: the first section shares the question's words, the others answer it
# in their own (films, churn, pricing); a bank's and a miner's notes share the odd word.
NOTES = {
    "streamer.md": """# Streaming company notes

## Members
The video streaming service added eleven million paying members last quarter, most of them abroad.

## Content slate
Original films and video series drive sign-ups; the studio budget rises again next year for local-language shows.

## Pricing
The ad-supported tier and the password-sharing crackdown lift revenue per household while churn stays low.
""",
    "bank.md": """# Regional bank notes

## Deposits
Deposit growth slowed as savers moved cash into money-market funds paying more interest.

## Digital
The branch network opened accounts for new customers faster once forms went digital.
""",
    "miner.md": """# Copper miner notes

## Output
The mine added a second shaft; ore grades improved and output rose eleven percent last quarter.

## Costs
Diesel and labour costs climbed; the company hedged half of next year's fuel.
""",
}

QUESTION = "how quickly is the online video platform signing up new members"


def _ingest(kb, tmp_path: Path) -> None:
    root = tmp_path / "notes"
    root.mkdir()
    for name, text in NOTES.items():
        (root / name).write_text(text, encoding="utf-8")
    report = kb.ingest([root], root=root)
    assert report.count("failed") == 0


def _cos(a, b) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_feedback_steps_towards_the_first_units_and_needs_a_shared_document(kb, tmp_path):
    _ingest(kb, tmp_path)
    kb.settings.search.feedback_weight = 0.0
    ranked = kb.search(QUESTION, mode="hybrid", top_k=8, group=False).hits
    space = kb.store.active_space()
    query = kb.provider.embed([QUESTION])[0]
    # the first two units are the streamer's (its members and content sections)
    first = []
    for hit in ranked:
        if hit.unit_id not in {h.unit_id for h in first}:
            first.append(hit)
    assert [Path(h.path).name for h in first[:2]] == ["streamer.md", "streamer.md"]
    toward = feedback_chunks(ranked, 2, shared=True)
    assert toward == [first[0].chunk_id, first[1].chunk_id]
    # the database ranks by query + 0.8 x the mean stored vector of those chunks, and each hit's
    # similarity stays its cosine with the query
    stored = {row["chunk_id"]: vec for row, vec in kb.store.chunk_vectors(kb.settings.collection, space["space"])}
    centroid = np.mean([stored[c] for c in toward], axis=0)
    moved = query + 0.8 * centroid
    assert _cos(moved, centroid) > _cos(query, centroid)
    flt = SearchFilters(collection=kb.settings.collection)
    want = kb.store.semantic_search(moved / np.linalg.norm(moved), space["space"], space["dimensions"], flt, 6)
    got = kb.store.semantic_search(query, space["space"], space["dimensions"], flt, 6, toward=toward, weight=0.8)
    assert [h.chunk_id for h in got] == [h.chunk_id for h in want]
    np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-5)
    np.testing.assert_allclose([h.similarity for h in got], [_cos(query, stored[h.chunk_id]) for h in got], atol=1e-5)
    # no stored vector for any of them: nothing, and the search's first pass stands
    assert kb.store.semantic_search(query, space["space"], space["dimensions"], flt, 6, toward=["nope"], weight=0.8) == []
    # units, not chunks, are counted: a unit's further chunks add nothing
    one_per_doc = [h for h in ranked if h.unit_id in {first[0].unit_id}] + \
        [h for h in ranked if Path(h.path).name != "streamer.md"]
    assert len(feedback_chunks(one_per_doc, 2, shared=False)) == 2
    # the first pass agreeing on no document (every unit from another one) moves nothing
    assert feedback_chunks(one_per_doc, 2, shared=True) == []


def test_feedback_keeps_similarity_the_query_cosine_and_min_similarity(kb, tmp_path):
    _ingest(kb, tmp_path)
    kb.settings.search.feedback_weight = 0.8
    kb.settings.search.feedback_depth = 2
    result = kb.search(QUESTION, mode="hybrid", top_k=8)
    assert "feedback" in result.timings_ms
    space = kb.store.active_space()["space"]
    asked = kb.store.similarities(kb.provider.embed([QUESTION])[0], space, [h.chunk_id for h in result.hits])
    for hit in result.hits:  # the cosine with what was asked, not with the moved vector
        assert abs(hit.similarity - asked[hit.chunk_id]) < 1e-4
    floor = sorted(asked.values())[len(asked) // 2]
    held = kb.search(QUESTION, mode="hybrid", top_k=8, min_similarity=floor).hits
    assert held and all(h.similarity >= floor - 1e-6 for h in held)


def test_feedback_brings_the_answering_documents_other_sections_forward(corpus_kb):
    """Over the shared corpus, a question describing NFLX without naming it: its earnings analysis
    holds the first four sections, and loosely related sections of META's and MSFT's analyses came
    next; the feedback step lifts the analysis's further sections above them."""
    question = "how does the streaming service plan to grow ad revenue"

    def top(weight: float, pool: int = 4) -> list[tuple[str, str]]:
        corpus_kb.settings.search.feedback_weight = weight
        corpus_kb.settings.search.feedback_depth = 4
        corpus_kb.settings.search.feedback_pool = pool
        return [(h.chunk_id, h.path) for h in corpus_kb.search(question, mode="hybrid", top_k=6).hits]

    before, after = top(0.0), top(0.8)
    netflix = lambda hits: [p.endswith("NFLX_20250118T0800.yaml") for _, p in hits]  # noqa: E731
    assert all(netflix(before[:4])) and all(netflix(after[:4]))
    assert sum(netflix(after)) > sum(netflix(before))
    # the corpus (3,325 chunks) is ranked exactly: feedback re-scored the first pass's pool of 200
    # (the default 4 x 50), and finds what ranking every chunk again finds
    assert top(0.8, pool=0) == after


def test_an_exact_ranking_hands_feedback_a_pool_of_its_nearest_chunks(kb, tmp_path):
    """A filter leaving few chunks is ranked exactly; that ranking also returns the ids of the
    query's `pool` nearest chunks, for the feedback step to re-score instead of ranking every
    filtered row again. Not after a graph walk, nor when the pool would be over half the rows."""
    _ingest(kb, tmp_path)
    space = kb.store.active_space()
    query = kb.provider.embed([QUESTION])[0]
    flt = SearchFilters(collection=kb.settings.collection)
    rows = len(kb.store.chunk_vectors(kb.settings.collection, space["space"]))
    assert rows >= 8
    ranked = kb.store.semantic_search(query, space["space"], space["dimensions"], flt, rows)
    first = kb.store.semantic_search(query, space["space"], space["dimensions"], flt, 2, pool=4)
    assert [h.chunk_id for h in first] == [h.chunk_id for h in ranked[:2]]  # the hits as without a pool
    assert first.pool == [h.chunk_id for h in ranked[:4]]
    assert kb.store.semantic_search(query, space["space"], space["dimensions"], flt, 2).pool is None
    assert kb.store.semantic_search(query, space["space"], space["dimensions"], flt, 2, pool=rows).pool is None
    # unfiltered, the HNSW walk: it scores only what it visits, so no pool
    walked = kb.store.semantic_search(query, space["space"], space["dimensions"], SearchFilters(), 2, pool=4)
    assert len(walked) == 2 and walked.pool is None


def test_feedback_re_scores_the_pool_and_the_first_units_documents(kb, tmp_path):
    """Feedback after an exact ranking ranks, by the moved vector, only the chunks it is given
    (the first pass's pool and full-text hits) and every chunk of the documents holding the first
    units (a document's other sections are what it is for); filters still apply."""
    _ingest(kb, tmp_path)
    space = kb.store.active_space()
    query = kb.provider.embed([QUESTION])[0]
    flt = SearchFilters(collection=kb.settings.collection)
    rows = {row["chunk_id"]: row for row, _ in kb.store.chunk_vectors(kb.settings.collection, space["space"])}
    by_name = lambda name: [c for c, r in rows.items() if Path(r["path"]).name == name]  # noqa: E731
    streamer, bank = by_name("streamer.md"), by_name("bank.md")
    toward = streamer[:2]
    among = bank[:1]
    everything = kb.store.semantic_search(query, space["space"], space["dimensions"], flt, len(rows), toward=toward,
                                          weight=0.8)
    got = kb.store.semantic_search(query, space["space"], space["dimensions"], flt, len(rows), toward=toward,
                                   weight=0.8, among=among)
    allowed = set(among) | set(streamer)
    assert [h.chunk_id for h in got] == [h.chunk_id for h in everything if h.chunk_id in allowed]
    np.testing.assert_allclose([h.score for h in got],
                               [h.score for h in everything if h.chunk_id in allowed], atol=1e-5)
    np.testing.assert_allclose([h.similarity for h in got],
                               [h.similarity for h in everything if h.chunk_id in allowed], atol=1e-5)
    banks = SearchFilters(collection=kb.settings.collection, path="bank.md")
    assert [h.chunk_id for h in kb.store.semantic_search(query, space["space"], space["dimensions"], banks, len(rows),
                                                         toward=toward, weight=0.8, among=among)] == among
    elsewhere = SearchFilters(collection=kb.settings.collection, path="miner.md")
    assert kb.store.semantic_search(query, space["space"], space["dimensions"], elsewhere, len(rows), toward=toward,
                                    weight=0.8, among=among) == []


def _statements(monkeypatch) -> list[tuple[str, bool]]:
    """Every statement the process sends from now on, with whether it went in a pipeline (no round
    trip of its own); recorded on the way to the real database."""
    import psycopg
    from psycopg import pq

    sent: list[tuple[str, bool]] = []
    execute = psycopg.Connection.execute

    def recording(conn, query, params=None, **kw):
        text = query if isinstance(query, str) else query.as_string(conn)
        sent.append((" ".join(text.split()), conn.pgconn.pipeline_status != pq.PipelineStatus.OFF))
        return execute(conn, query, params, **kw)

    monkeypatch.setattr(psycopg.Connection, "execute", recording)
    return sent


def test_after_a_walk_feedback_re_scores_what_the_walk_found_instead_of_walking_again(kb, tmp_path, monkeypatch):
    """Over the HNSW walk (a collection or filter over search.exact_max_rows chunks), feedback ranks
    the walk's hits, the full-text hits and the first units' documents by the moved vector, exactly:
    no second walk. `feedback_walk_again` walks the index again instead. Either way the first units'
    document's other sections come forward."""
    _ingest(kb, tmp_path)
    kb.settings.search.exact_max_rows = 0
    kb.settings.search.rank_in_process = False
    kb.settings.search.feedback_depth = 2
    results = {}
    for again in (False, True):
        kb.settings.search.feedback_walk_again = again
        sent = _statements(monkeypatch)
        result = kb.search(QUESTION, mode="hybrid", top_k=8)
        monkeypatch.undo()
        assert "feedback" in result.timings_ms
        moved = [s for s, _ in sent if s.startswith("WITH moved AS")]
        assert len(moved) == 1, moved
        walked = "ORDER BY v.embedding::vector(" in moved[0]  # the index's order: a walk
        assert walked == again and ("candidates AS" in moved[0]) == (not again)
        results[again] = [h.unit_id for h in result.hits]
    for ranked in results.values():
        assert {"streamer.md#Content slate", "streamer.md#Pricing"} <= set(ranked[:5]), ranked


def test_a_filtered_search_decides_its_scan_once_and_reads_similarities_with_feedback(kb, tmp_path, monkeypatch):
    """A filter beside the collection is counted (up to search.exact_max_rows + 1 rows) to choose
    between an exact ranking and the HNSW walk: once per search and filters (for vectors.SCAN_TTL
    seconds), not again for feedback's query, which
    also brings the full-text hits' cosine with the question in its own round trip (no lookup of
    their own at the end). Both for an exact ranking and for the walk; the hits' similarity is
    still their cosine with the question."""
    _ingest(kb, tmp_path)
    kb.settings.search.feedback_weight = 0.8
    kb.settings.search.feedback_depth = 2
    doc_type = kb.search(QUESTION, mode="hybrid", top_k=1).hits[0].doc_type
    space = kb.store.active_space()["space"]
    asked = kb.provider.embed([QUESTION])[0]
    for exact_max_rows in (10_000, 0):  # the notes ranked exactly; then by the walk
        kb.settings.search.exact_max_rows = exact_max_rows
        sent = _statements(monkeypatch)
        result = kb.search(QUESTION, mode="hybrid", top_k=8, doc_type=doc_type)
        monkeypatch.undo()
        assert "feedback" in result.timings_ms and len(result.hits) >= 6
        counts = [s for s, _ in sent if s.startswith("SELECT count(*) FROM (SELECT 1 FROM rag_chunks c WHERE")]
        assert len(counts) == 1, counts
        # at most feedback's own, pipelined (none when every full-text hit already has its cosine:
        # the closeness check of search.lexical_far_ratio gives the first ones theirs from the held vectors)
        cosines = [pipelined for s, pipelined in sent if "1 - (embedding <=> " in s and s.startswith("SELECT chunk_id")]
        assert cosines in ([True], []), cosines
        truth = kb.store.similarities(asked, space, [h.chunk_id for h in result.hits])
        for hit in result.hits:
            assert abs(hit.similarity - truth[hit.chunk_id]) < 1e-4
    # the same filters again within vectors.SCAN_TTL: the decision stands, nothing is counted; other
    # filters, or another exact_max_rows, are counted
    for doc_types, counted in ((doc_type, 0), ([doc_type, "no-such-type"], 1)):
        sent = _statements(monkeypatch)
        kb.search(QUESTION, mode="hybrid", top_k=8, doc_type=doc_types)
        monkeypatch.undo()
        assert len([s for s, _ in sent if s.startswith("SELECT count(*) FROM (SELECT 1 FROM rag_chunks c")]) == counted


def test_a_semantic_query_and_its_feedback_query_take_one_round_trip_each(kb, tmp_path):
    """The settings (jit, the HNSW walk's) and the query of a semantic search, and feedback's query
    with the full-text hits' cosines, go to the server together and come back in one round trip
    (they once went inside a transaction in a pipeline: four). The filters' count is one more (once per
    vectors.SCAN_TTL for the same filters), and feedback, handed the first pass's decision, makes none. Exact ranking and the HNSW walk."""
    _ingest(kb, tmp_path)
    store = kb.store
    store.settings.search.rank_in_process = False  # the database's ranking (held copies: test_search_in_process)
    space = store.active_space()
    query = kb.provider.embed([QUESTION])[0]
    flt = SearchFilters(collection=kb.settings.collection, section_contains="e")  # 3 sections; not the collection alone
    rows = {row["chunk_id"]: row for row, _ in store.chunk_vectors(kb.settings.collection, space["space"])}
    streamer = [c for c, r in rows.items() if Path(r["path"]).name == "streamer.md"]
    bank = [c for c, r in rows.items() if Path(r["path"]).name == "bank.md"]
    for exact_max_rows, scan in ((10_000, "exact"), (0, "hnsw")):
        store.settings.search.exact_max_rows = exact_max_rows
        store.semantic_search(query, space["space"], space["dimensions"], flt, 3)  # what is cached is cached
        for key in [k for k in store.scan_decisions if k[0] == "scan"]:  # but the filters' decision
            del store.scan_decisions[key]
        first, trips = round_trips(tmp_path / "first.log", lambda: store.semantic_search(
            query, space["space"], space["dimensions"], flt, 3))
        assert trips == 2 and first.scan[0] == scan and len(first) == 3  # the count, the ranking
        _, trips = round_trips(tmp_path / "decided.log", lambda: store.semantic_search(
            query, space["space"], space["dimensions"], flt, 3))
        assert trips == 1  # the same filters within vectors.SCAN_TTL: decided already
        again, trips = round_trips(tmp_path / "again.log", lambda: store.semantic_search(
            query, space["space"], space["dimensions"], flt, 3, toward=streamer[:2], weight=0.8, scan=first.scan,
            cosines=bank))
        assert trips == 1 and len(again) == 3
        assert again.cosines == pytest.approx(store.similarities(query, space["space"], bank))
        assert set(again.cosines) == set(bank)


def test_re_scoring_reads_each_candidates_vector_once_with_the_cosines_asked_for(kb, tmp_path, monkeypatch):
    """Feedback's re-scoring of a first pass (`among`) returns the query's cosine with the chunks
    asked for (the full-text hits) from the candidates' own rows, in its one statement; a chunk
    asked for that is no candidate still gets its cosine, from a pipelined lookup (same round trip)."""
    _ingest(kb, tmp_path)
    store = kb.store
    store.settings.search.rank_in_process = False
    space = store.active_space()
    query = kb.provider.embed([QUESTION])[0]
    flt = SearchFilters(collection=kb.settings.collection)
    rows = {row["chunk_id"]: row for row, _ in store.chunk_vectors(kb.settings.collection, space["space"])}
    streamer = [c for c, r in rows.items() if Path(r["path"]).name == "streamer.md"]
    bank = [c for c, r in rows.items() if Path(r["path"]).name == "bank.md"]
    others = [c for c in rows if c not in streamer and c not in bank]
    for asked, statements in ((bank, 1), (bank + others[:1], 2)):
        sent = _statements(monkeypatch)
        again = store.semantic_search(query, space["space"], space["dimensions"], flt, 5, toward=streamer[:2],
                                      weight=0.8, among=bank + streamer, cosines=asked)
        monkeypatch.undo()
        assert len([s for s, _ in sent if not s.startswith("SELECT set_config")]) == statements, sent
        assert all(pipelined for _, pipelined in sent)
        assert again.cosines == pytest.approx(store.similarities(query, space["space"], asked))
        assert set(again.cosines) == set(asked) and len(again) == 5
        truth = store.similarities(query, space["space"], [h.chunk_id for h in again])
        assert [h.similarity for h in again] == pytest.approx([truth[h.chunk_id] for h in again])
