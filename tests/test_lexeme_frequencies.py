"""Document frequencies per collection and lexeme (rag_lexeme_frequencies, sql/021): kept by
publishing and deleting in the document's own transaction, back-filled by the migration, and the
lexical rankings read from them the same as counting through the GIN index gave (issue 32)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import pytest

from rag_lib.models import Chunk, Document, Section
from rag_lib.search.lexical import TermStatistics, _Stats, exact_tokens, plan_terms
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
    lexemes selecting candidates: all its ranking depends on) from the table as from counting."""
    store = corpus_kb.store
    store.refresh_statistics(force=True)
    queries = [json.loads(line)["text"] for d in DEV_SETS for line in (d / "queries.jsonl").read_text().splitlines()
               if line.strip()]
    assert len(queries) >= 60
    generation = store.collection_generation("default")
    for cap in (20, 2000):  # 20: most lexemes are cut at the cap, as at 1M chunks
        for query in queries:
            before = TermStatistics()
            before._by_collection["default"] = _Stats(generation, time.monotonic() + 3600, generation[1])
            english, simple = store.query_lexemes_pair(query, " ".join(exact_tokens(query)))
            for config, lexemes in (("english", english), ("simple", simple)):
                counted = _counted_before(corpus_kb, config, lexemes, generation[1], cap + 1)
                before._by_collection["default"].df.update({(config, lex): n for lex, n in counted.items()})
                assert store.term_statistics_many("default", {config: lexemes}, generation[1], cap + 1).get(config, {}) == counted
            planned = plan_terms(store, TermStatistics(), query, "default", cap)
            assert planned == plan_terms(store, before, query, "default", cap), query
