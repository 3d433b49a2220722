"""Document frequencies per collection and lexeme (rag_lexeme_frequencies, sql/021): kept by
publishing and deleting in the document's own transaction, back-filled by the migration, and the
lexical rankings read from them the same as counting through the GIN index gave (issue 32)."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import psycopg
import pytest

from rag_lib.models import Chunk, Document, Section
from rag_lib.search import lexical
from rag_lib.search.lexical import TermStatistics, choose_terms, exact_tokens, plan_terms
from rag_lib.store import apply_migrations

PFE = "tradegent/knowledge/analysis/stock/PFE_20250118T1400.yaml"
TRADE = "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml"
LEARNING = "tradegent/knowledge/learnings/biases/loss-aversion-pre-earnings.yaml"
DEV_SETS = [Path("/work/shared/eval") / name for name in ("tradegent-dev", "tradegent-dev2")]

pytestmark = pytest.mark.warm_cache


def _stored(kb) -> dict[tuple[str, str, str], int]:
    with kb.store.db.connection() as conn:
        rows = conn.execute("SELECT collection, config, lexeme, chunks FROM rag_lexeme_frequencies").fetchall()
    return {(c, cfg, lex): n for c, cfg, lex, n in rows}


def _counted(kb) -> dict[tuple[str, str, str], int]:
    """The same frequencies from Postgres's own ts_stat (ndoc: the vectors holding the word), per
    collection and configuration, over the chunks stored now."""
    out = {}
    with kb.store.db.connection() as conn:
        collections = [r[0] for r in conn.execute("SELECT DISTINCT collection FROM rag_chunks")]
        for collection in collections:
            for config, column in (("english", "tsv"), ("simple", "tsv_simple")):
                inner = f"SELECT {column} FROM rag_chunks WHERE collection = {psycopg.sql.quote(collection)}"
                for word, ndoc in conn.execute("SELECT word, ndoc FROM ts_stat(%s)", (inner,)):
                    out[(collection, config, word)] = ndoc
    return out


def test_frequencies_follow_publish_republish_and_delete(kb, corpus_copy):
    root = corpus_copy(PFE, TRADE, LEARNING)
    kb.ingest([root])
    assert _stored(kb) == _counted(kb) and len(_stored(kb)) > 500
    kb.ingest([root / "tradegent"], collection="other")  # a second collection counts apart
    assert _stored(kb) == _counted(kb)
    assert {c for c, _, _ in _stored(kb)} == {"default", "other"}

    path = root / LEARNING
    text = path.read_text()
    word = next(w for w in ("aversion", "loss") if w in text)
    path.write_text(text.replace(word, "zyzzogeton") + "\nextra_note:\n  lesson: qwertyuiop zyzzogeton twice.\n")
    assert kb.ingest([root]).outcomes[0].status in ("changed", "unchanged")
    after = _stored(kb)
    assert after == _counted(kb)
    assert after[("default", "simple", "zyzzogeton")] >= 1 and ("default", "simple", "qwertyuiop") in after

    kb.delete_document(LEARNING)
    gone = _stored(kb)
    assert gone == _counted(kb)
    assert ("default", "simple", "zyzzogeton") not in gone  # no row left at zero
    assert ("other", "simple", "zyzzogeton") not in gone and len([k for k in gone if k[0] == "other"]) > 500

    kb.reset()  # `rag reset`: every table dropped and recreated, the frequencies too
    assert _stored(kb) == {}


def test_a_failed_publish_leaves_the_frequencies_as_they_were(kb, corpus_copy):
    root = corpus_copy(PFE, LEARNING)
    kb.ingest([root])
    before = _stored(kb)
    # the next publish of the PFE file fails at its commit, after every statement of it ran
    with kb.store.db.connection() as conn:
        conn.execute("""CREATE FUNCTION fail_publish() RETURNS trigger LANGUAGE plpgsql
                        AS $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$""")
        conn.execute("""CREATE CONSTRAINT TRIGGER fail_publish AFTER INSERT ON rag_documents
                        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.path LIKE '%%PFE%%')
                        EXECUTE FUNCTION fail_publish()""")
        conn.commit()
    path = root / PFE
    path.write_text(path.read_text() + "\nextra_note:\n  lesson: qwertyuiop never lands.\n")
    report = kb.ingest([root])
    assert report.count("failed") == 1
    assert _stored(kb) == before == _counted(kb)
    assert not any(lex == "qwertyuiop" for _, _, lex in _stored(kb))


def _document(n: int, words: list[str]) -> tuple[Document, list[Section], list[Chunk]]:
    path = f"gen/doc{n:03d}.md"
    doc = Document(collection="default", path=path, doc_id=f"d{n}", doc_type="note", format="markdown",
                   content_hash=f"h{n}", body="")
    chunks = []
    for k in range(3):
        text = " ".join(words[(n * 7 + k * 5 + i) % len(words)] for i in range(40))
        chunks.append(Chunk(chunk_id=f"{path}#{k}", collection="default", path=path, doc_id=f"d{n}",
                            doc_type="note", section=f"s{k}", section_path=f"s{k}", ordinal=k, text=text,
                            embed_text=text, token_count=40, content_hash=hashlib.sha256(text.encode()).hexdigest(),
                            char_start=0, char_end=len(text)))
    return doc, [Section(name=f"s{k}", title=f"s{k}", ordinal=k, text=c.text) for k, c in enumerate(chunks)], chunks


def test_concurrent_publishers_of_one_collection_keep_exact_counts(kb, corpus_copy):
    """Every document shares most of its lexemes with the others (hot rows), published and
    re-published by four threads at once: no deadlock, no lost update."""
    kb.ingest([corpus_copy(LEARNING)])
    space, dims = kb.provider.space, kb.provider.dimensions
    vocabulary = [f"{a}{b}" for a in ("alpha", "beta", "gamma", "delta", "omega") for b in ("x", "y", "z", "w")]
    errors: list[BaseException] = []

    def publish(worker: int) -> None:
        try:
            for round_ in range(3):
                for n in range(worker, 24, 4):
                    doc, sections, chunks = _document(n + round_, vocabulary)  # re-publish: other words
                    doc = Document(**{**doc.__dict__, "path": f"gen/doc{n:03d}.md"})
                    chunks = [Chunk(**{**c.__dict__, "path": doc.path, "chunk_id": f"{doc.path}#{c.ordinal}"})
                              for c in chunks]
                    kb.store.publish_document(doc, sections, chunks, np.ones((len(chunks), dims), np.float32),
                                              space, dims, "fp")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _stored(kb) == _counted(kb)
    assert _stored(kb)[("default", "simple", "alphax")] > 10


def test_the_migration_back_fills_an_existing_database(corpus_kb):
    expected = _counted(corpus_kb)
    with corpus_kb.store.db.connection() as conn:  # the database as it was before sql/021
        conn.execute("DROP TABLE rag_lexeme_frequencies")
        conn.execute("DELETE FROM rag_schema_migrations WHERE name = '021_lexeme_frequencies.sql'")
        conn.commit()
        assert apply_migrations(conn) == ["021_lexeme_frequencies.sql"]
    assert _stored(corpus_kb) == expected and len(expected) > 10_000


def _counted_before(kb, config: str, lexemes: list[str], total: int, cap: int) -> dict[str, int]:
    """What the store answered before the table (10fcc30): ANALYZE's share for its most common
    lexemes, the others counted through the GIN index, at most `cap` rows."""
    column = {"english": "tsv", "simple": "tsv_simple"}[config]
    with kb.store.db.connection() as conn:
        rows, elems, freqs = conn.execute(
            "SELECT c.reltuples, s.most_common_elems::text::text[], s.most_common_elem_freqs FROM pg_class c"
            " LEFT JOIN pg_stats s ON s.tablename = 'rag_chunks' AND s.attname = %s WHERE c.relname = 'rag_chunks'",
            (column,)).fetchone()
        common = dict(zip(elems, freqs)) if elems and total >= 0.9 * rows else {}
        return {lex: round(common[lex] * total) if lex in common else conn.execute(
            f"SELECT count(*) FROM (SELECT FROM rag_chunks WHERE collection = 'default' AND {column} @@ %s::tsquery"
            " LIMIT %s) t", ("'" + lex.replace("\\", "\\\\").replace("'", "''") + "'", cap)).fetchone()[0]
            for lex in lexemes}


def test_lexical_plans_are_those_counting_gave(corpus_kb):
    """Every query of both dev sets plans the same lexical query (each lexeme's weight and the
    lexemes selecting candidates: all its ranking depends on) from the table, read with the query's
    lexemes in one statement, as from counting through the GIN index (10fcc30)."""
    store = corpus_kb.store
    store.refresh_statistics(force=True)
    queries = [json.loads(line)["text"] for d in DEV_SETS for line in (d / "queries.jsonl").read_text().splitlines()
               if line.strip()]
    assert len(queries) >= 60
    total = store.collection_generation("default")[1]
    stats = TermStatistics()  # one cache for all the queries, as a knowledge base keeps it
    for cap in (20, 2000):  # 20: most lexemes are cut at the cap, as at 1M chunks
        for query in queries:
            exact = " ".join(exact_tokens(query))
            lexemes = {"english": store.query_lexemes(query, "english"), "simple": store.query_lexemes(exact, "simple")}
            counted = {config: list(_counted_before(corpus_kb, config, found, total, cap + 1).items())
                       for config, found in lexemes.items() if found}
            assert stats.frequencies(store, "default", query, exact, cap + 1) == (total, counted), query
            assert plan_terms(store, stats, query, "default", cap) == choose_terms(counted, total, cap), query


def _store_calls(store) -> Counter:
    """Count the calls of the store's public methods (each runs its real queries)."""
    calls: Counter[str] = Counter()
    for name in [n for n in dir(store) if not n.startswith("_") and callable(getattr(store, n))]:
        real = getattr(store, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(store, name, counted)
    return calls


def test_planning_a_lexical_query_is_one_round_trip(kb, corpus_copy):
    """A query's lexemes and their frequencies are one statement; the collection's size and
    ANALYZE's common lexemes are read once per collection state, not per query (issue 32: at 1M
    chunks each round trip waited for a core while the query encoder held both)."""
    kb.ingest([corpus_copy(PFE, TRADE, LEARNING)])
    store, stats = kb.store, TermStatistics()
    calls = _store_calls(store)
    cap = store.settings.search.lexical_max_candidates
    plan_terms(store, stats, "loss aversion before earnings", "default", cap)
    assert calls == {"collection_generation": 1, "element_statistics": 1, "query_terms": 1}
    calls.clear()
    for query in ("NVDA stop loss 145.50", "pfizer pipeline risk", "what did the trade teach"):
        assert plan_terms(store, stats, query, "default", cap).terms
    assert calls == {"query_terms": 3}


def test_a_repeated_question_plans_its_terms_without_a_query_until_the_collection_changes(
        kb, corpus_copy, monkeypatch):
    """A question asked again (a page refreshed, an agent's retry, another filter) takes its lexemes
    and their frequencies from the cache; once a document is published the next check of the
    collection's state drops them and the new frequencies are read."""
    kb.ingest([corpus_copy(PFE, TRADE)])
    store, stats = kb.store, TermStatistics()
    cap = store.settings.search.lexical_max_candidates
    question = "loss aversion before earnings"
    first = plan_terms(store, stats, question, "default", cap)
    calls = _store_calls(store)
    assert plan_terms(store, stats, question, "default", cap) == first
    assert calls["query_terms"] == 0
    assert plan_terms(store, stats, "pfizer pipeline risk", "default", cap).terms and calls["query_terms"] == 1
    kb.ingest([corpus_copy(LEARNING)])  # "loss" and "aversion" are in more chunks now
    monkeypatch.setattr(lexical, "GENERATION_TTL", 0.0)  # the next search checks the collection's state
    calls.clear()
    again = plan_terms(store, stats, question, "default", cap)
    assert calls["query_terms"] == 1 and again == plan_terms(store, TermStatistics(), question, "default", cap)
    assert again != first


def test_common_lexemes_are_read_again_after_analyze(kb, corpus_copy, monkeypatch):
    """ANALYZE's most common lexemes are cached per collection state: an ANALYZE of the chunks
    (which rewrites them) makes the next check read them again, even when no document changed."""
    kb.ingest([corpus_copy(PFE, TRADE, LEARNING)])
    store, stats = kb.store, TermStatistics()
    store.refresh_statistics(force=True)
    query = "loss aversion before earnings risk"
    first = stats.frequencies(store, "default", query, "")
    before = store.collection_generation("default")
    monkeypatch.setattr(lexical, "GENERATION_TTL", 0.0)  # check the collection's state on every query
    calls = _store_calls(store)
    assert stats.frequencies(store, "default", query, "") == first
    assert calls["element_statistics"] == 0  # same state: still cached
    with store.db.connection() as conn:  # only the common lexemes' statistics change, not the collection
        conn.execute("ALTER TABLE rag_chunks ALTER COLUMN tsv SET STATISTICS 1")
        conn.commit()
    store.refresh_statistics(force=True)
    after = store.collection_generation("default")
    assert after[:3] == before[:3] and after[3] != before[3]
    calls.clear()
    assert stats.frequencies(store, "default", query, "") == TermStatistics().frequencies(store, "default", query, "")
    assert calls["element_statistics"] == 2  # read again by this cache, as by a new one
    assert stats._by_collection["default"].common == store.element_statistics()[1]
    assert len(stats._by_collection["default"].common["english"]) <= 10  # statistics target 1: ten lexemes at most


def test_searches_go_on_while_one_checks_the_collections_state(kb, corpus_copy, monkeypatch):
    """Every GENERATION_TTL one search checks whether the collection changed (~70 ms at 1M chunks:
    it sums the documents' rows); the others plan with the cached statistics meanwhile instead of
    waiting for it. Before anything is cached they wait (nothing to plan with)."""
    kb.ingest([corpus_copy(PFE, TRADE, LEARNING)])
    store, stats = kb.store, TermStatistics()
    cap = store.settings.search.lexical_max_candidates
    first = plan_terms(store, stats, "NVDA stop loss 145.50", "default", cap)
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    real = store.collection_generation

    def held(*args, **kwargs):  # the real query, once the test lets it go
        entered.set()
        release.wait(30)
        try:
            return real(*args, **kwargs)
        finally:
            finished.set()

    monkeypatch.setattr(store, "collection_generation", held)
    monkeypatch.setattr(lexical, "GENERATION_TTL", 0.0)  # the next search checks
    checking = threading.Thread(target=plan_terms, args=(store, stats, "pfizer pipeline risk", "default", cap))
    checking.start()
    try:
        assert entered.wait(30)
        monkeypatch.setattr(lexical, "GENERATION_TTL", 3600.0)  # this one need not check
        assert plan_terms(store, stats, "NVDA stop loss 145.50", "default", cap) == first
        assert not finished.is_set()  # planned while the other search's check was still running
    finally:
        release.set()
        checking.join(30)
    assert finished.is_set() and not checking.is_alive()


def _pending(kb) -> dict[str, int]:
    """Entries waiting in each full-text index's pending list (pgstattuple's view of the metapage)."""
    with kb.store.db.connection() as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
        return {index: conn.execute("SELECT pending_tuples FROM pgstatginindex(%s)", (index,)).fetchone()[0]
                for index in ("rag_chunks_tsv", "rag_chunks_tsv_simple")}


def test_published_chunks_go_straight_into_the_full_text_index(kb, corpus_copy):
    # a pending list is read in full by every full-text query (sql/022): nothing may wait in one
    kb.ingest([corpus_copy(PFE, TRADE, LEARNING)])
    assert _pending(kb) == {"rag_chunks_tsv": 0, "rag_chunks_tsv_simple": 0}
    assert kb.search("loss aversion before earnings", mode="lexical").hits


def test_the_migration_empties_an_existing_pending_list(kb, corpus_copy):
    root = corpus_copy(PFE, TRADE, LEARNING)
    kb.ingest([root / PFE])
    with kb.store.db.connection() as conn:  # the indexes as they were before sql/022
        conn.execute("ALTER INDEX rag_chunks_tsv SET (fastupdate = on)")
        conn.execute("ALTER INDEX rag_chunks_tsv_simple SET (fastupdate = on)")
        conn.execute("DELETE FROM rag_schema_migrations WHERE name = '022_full_text_without_pending_list.sql'")
        conn.commit()
    kb.ingest([root])
    waiting = _pending(kb)
    assert waiting["rag_chunks_tsv"] > 0 and waiting["rag_chunks_tsv_simple"] > 0
    before = [h.chunk_id for h in kb.search("loss aversion before earnings", mode="lexical").hits]

    with kb.store.db.connection() as conn:
        assert apply_migrations(conn) == ["022_full_text_without_pending_list.sql"]
        options = dict(conn.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)",
                                    (["rag_chunks_tsv", "rag_chunks_tsv_simple"],)).fetchall())
    assert _pending(kb) == {"rag_chunks_tsv": 0, "rag_chunks_tsv_simple": 0}
    assert all("fastupdate=off" in opts for opts in options.values())
    assert [h.chunk_id for h in kb.search("loss aversion before earnings", mode="lexical").hits] == before
