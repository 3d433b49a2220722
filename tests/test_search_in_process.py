"""Exact rankings of a whole collection in the server process (`search.rank_in_process`): a
collection of at most `search.exact_max_rows` chunks is ranked from a copy of its vectors held by
the process, and the database only reads the rows kept. Same hits, scores and feedback as the
database's ranking; never stale after another process's writes. Real database and model."""

from __future__ import annotations

import time
from pathlib import Path

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.models import SearchFilters
from rag_lib.store import vectors

QUESTIONS = ["data center revenue guidance", "how does the streaming service plan to grow ad revenue",
             "What are the risks of the AMD position?", "momentum strategy entry rules"]


def _same(a: list[tuple[str, float, float]], b: list[tuple[str, float, float]], tol: float = 1e-5) -> bool:
    """Same rankings up to float rounding (pgvector sums in another order: ~1e-7) and the order of
    exact ties (chunks with the same vector; the database orders those arbitrarily too)."""
    if len(a) != len(b):
        return False
    for (id_a, score_a, sim_a), (id_b, score_b, sim_b) in zip(a, b):
        if abs(score_a - score_b) > tol or abs(sim_a - sim_b) > tol:
            return False
        if id_a != id_b and not any(i == id_b and abs(s - score_a) <= tol for i, s, _ in a):
            return False
    return True


def test_a_whole_collection_is_ranked_in_the_process_as_the_database_ranks_it(corpus_kb):
    store = corpus_kb.store
    space = store.active_space()
    everything = SearchFilters(collection="default")

    def ranked(in_process: bool, vector, **kw):
        corpus_kb.settings.search.rank_in_process = in_process
        hits = store.semantic_search(vector, space["space"], space["dimensions"], everything, 50, **kw)
        return [(h.chunk_id, h.score, h.similarity) for h in hits], hits.pool

    for question in QUESTIONS:
        vector = corpus_kb.embed_text(question)
        (db, db_pool), (mem, mem_pool) = ranked(False, vector, pool=500), ranked(True, vector, pool=500)
        assert len(mem) == 50 and _same(db, mem)
        # the pool feedback re-scores: the same 500 nearest (but for a tie at its very end)
        assert len(mem_pool) == 500 and len(set(db_pool[:490]) - set(mem_pool)) == 0
        toward = [cid for cid, _, _ in mem[:3]]
        for among in (mem_pool, None):  # feedback re-scoring the pool, or ranking every row again
            db_moved, _ = ranked(False, vector, toward=toward, weight=0.8, among=among)
            mem_moved, _ = ranked(True, vector, toward=toward, weight=0.8, among=among)
            assert len(mem_moved) == 50 and _same(db_moved, mem_moved)
            assert [c for c, _, _ in mem_moved] != [c for c, _, _ in mem]  # feedback moved it
        # a threshold holds as in the database
        floor = (mem[20][2] + mem[21][2]) / 2  # between two hits: float rounding cannot move one across
        db_held, _ = ranked(False, vector, min_similarity=floor)
        mem_held, _ = ranked(True, vector, min_similarity=floor)
        assert len(mem_held) == 21 and _same(db_held, mem_held)
        assert ranked(True, vector, toward=["no such chunk"], weight=0.8)[0] == []

    # whole searches: the same results in every mode
    for question in QUESTIONS:
        for mode in ("hybrid", "semantic"):
            results = []
            for in_process in (False, True):
                corpus_kb.settings.search.rank_in_process = in_process
                hits = corpus_kb.search(question, mode=mode, top_k=10).hits
                results.append([(h.chunk_id, h.score, h.similarity) for h in hits])
            assert _same(*results), (question, mode)

    # held: the collection's vectors only (one copy, read once)
    assert list(store.held_vectors.entries) == [(("collection", "default"), space["space"])]
    held = store.held_vectors.entries[(("collection", "default"), space["space"])]
    assert held.matrix.shape == (len(held.ids), space["dimensions"]) == (3325, 384)


def test_the_chunks_a_filter_leaves_are_held_and_ranked_as_the_database_ranks_them(corpus_kb):
    """A filter beside the collection (a ticker, a document type) that leaves at most
    `search.exact_max_rows` chunks: from its second search within `vectors.REPEAT_SECONDS`, its
    chunks' vectors and rows are held as a collection's are, and both passes of a hybrid search are
    ranked in the process, as the database ranks them. Filters on client tags (which change without
    rewriting chunks) are ranked by the database."""
    store = corpus_kb.store
    space = store.active_space()
    nvda = SearchFilters(collection="default", ticker="NVDA")
    vector = corpus_kb.embed_text("data center revenue guidance")

    def ranked(in_process: bool, **kw):
        corpus_kb.settings.search.rank_in_process = in_process
        hits = store.semantic_search(vector, space["space"], space["dimensions"], nvda, 30, **kw)
        return [(h.chunk_id, h.score, h.similarity) for h in hits], hits.pool

    with store.db.connection() as conn:
        nvda_chunks = conn.execute("SELECT count(*) FROM rag_chunks WHERE collection = 'default' AND ticker = 'NVDA'"
                                   ).fetchone()[0]
    pool = nvda_chunks // 2  # a larger pool is no pool (it would save feedback little)
    key = (("filters", repr(nvda)), space["space"])
    db, db_pool = ranked(False, pool=pool)
    once, _ = ranked(True, pool=pool)  # a filter's first search: ranked by the database, nothing read
    assert key not in store.held_vectors.entries and _same(db, once)
    mem, mem_pool = ranked(True, pool=pool)  # its second within vectors.REPEAT_SECONDS: its chunks are held
    assert key in store.held_vectors.entries
    assert len(mem) == 30 and _same(db, mem) and len(mem_pool) == pool and mem_pool[:-5] == db_pool[:-5]
    toward = [cid for cid, _, _ in mem[:3]]
    db_moved, _ = ranked(False, toward=toward, weight=0.8, among=mem_pool)
    mem_moved, _ = ranked(True, toward=toward, weight=0.8, among=mem_pool)
    assert _same(db_moved, mem_moved) and [c for c, _, _ in mem_moved] != [c for c, _, _ in mem]
    held = store.held_vectors.entries[key]
    assert len(held.ids) == nvda_chunks and {r[9] for r in held.rows} == {"NVDA"}

    for question in QUESTIONS:  # whole searches with the filter: the same results
        results = []
        for in_process in (False, True):
            corpus_kb.settings.search.rank_in_process = in_process
            hits = corpus_kb.search(question, mode="hybrid", top_k=10, ticker="NVDA").hits
            results.append([(h.chunk_id, h.score, h.similarity) for h in hits])
        assert results[1] and _same(*results), question

    before = set(store.held_vectors.entries)
    for _ in range(2):
        tagged = corpus_kb.search("data center revenue guidance", mode="hybrid", tags={"desk": "semis"})
    assert set(store.held_vectors.entries) == before and tagged.hits == []


def test_a_collection_over_exact_max_rows_is_not_held(corpus_kb):
    """A collection above `search.exact_max_rows` chunks is walked with HNSW in the database: the
    process holds at most that many vectors per collection."""
    corpus_kb.settings.search.exact_max_rows = 3000
    hits = corpus_kb.search("data center revenue guidance", mode="hybrid", top_k=10).hits
    assert len(hits) == 10
    assert corpus_kb.store.held_vectors.entries == {}


def _note(tmp_path: Path, name: str, text: str) -> Path:
    """A markdown note alone in a new folder `notes` (ingested as its own root)."""
    note = tmp_path / "notes" / name
    note.parent.mkdir()
    note.write_text(text, encoding="utf-8")
    return note


def _found(kb: KnowledgeBase, question: str) -> list[str]:
    """File names of the top 3 semantic hits."""
    return [Path(h.path).name for h in kb.search(question, mode="semantic", top_k=3).hits]


def test_held_vectors_follow_other_processes_writes_at_once(corpus_kb, tmp_path):
    """Another process (here another knowledge base on the same database) publishes and deletes a
    document: a search of the process holding the collection's vectors, or the chunks a filter
    leaves, sees it as soon as their generation is checked again (at most `vectors.RECHECK_SECONDS`, 0.1 s, after the last check)."""
    note = _note(tmp_path, "zz_glacier.md", "# Glacier notes\n\n## Ice\nThe glacier retreated four kilometres, "
                 "exposing lichen-covered bedrock that tourists photograph from the ferry.\n")
    question = "glacier retreat exposing lichen bedrock seen from the ferry"

    def found() -> list[str]:
        time.sleep(vectors.RECHECK_SECONDS)  # a search this soon after the last check reuses it
        return _found(corpus_kb, question)

    def filtered() -> list[str]:  # the chunks a filter leaves are held alike (none yet)
        time.sleep(vectors.RECHECK_SECONDS)
        return [Path(h.path).name for h in corpus_kb.search(question, mode="semantic", top_k=3, path="zz_").hits]

    assert "zz_glacier.md" not in found()  # the vectors are held now
    assert filtered() == [] and filtered() == []  # held from the filter's second search
    assert len(corpus_kb.store.held_vectors.entries) == 2
    other = KnowledgeBase(Settings(database_url=corpus_kb.settings.database_url, home=tmp_path / "other"),
                          provider=corpus_kb.provider)
    try:
        assert other.ingest([note.parent], root=note.parent).count("failed") == 0
        assert found()[0] == "zz_glacier.md"
        assert set(filtered()) == {"zz_glacier.md"}
        held = corpus_kb.store.held_vectors.entries[(("collection", "default"), corpus_kb.store.active_space()["space"])]
        assert len(held.ids) > 3325  # read again, with the new document's chunks
        hybrid = corpus_kb.search(question, mode="hybrid", top_k=3).hits
        assert Path(hybrid[0].path).name == "zz_glacier.md"
        other.delete_document("zz_glacier.md")
        assert "zz_glacier.md" not in found()
        assert filtered() == []
    finally:
        other.close()


def test_a_process_sees_its_own_writes_at_once(corpus_kb, tmp_path, monkeypatch):
    """The process that publishes or deletes a document searches the change right after, however
    recently its held copy was checked (the re-check interval only bounds other processes' writes)."""
    monkeypatch.setattr(vectors, "RECHECK_SECONDS", 3600.0)
    note = _note(tmp_path, "zz_fjord.md", "# Fjord notes\n\n## Water\nThe fjord's meltwater turned turquoise, "
                 "and the kayak guide counted seals hauled out on the moraine.\n")
    question = "turquoise fjord meltwater seals on the moraine kayak guide"

    def found() -> list[str]:
        return _found(corpus_kb, question)

    assert "zz_fjord.md" not in found()  # held and just checked
    assert corpus_kb.ingest([note.parent], root=note.parent).count("failed") == 0
    assert found()[0] == "zz_fjord.md"
    corpus_kb.delete_document("zz_fjord.md")
    assert "zz_fjord.md" not in found()
