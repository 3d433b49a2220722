"""Each data-quality check passes on good data and fails on injected bad data (wrong-dimension
and zero vectors, orphan and duplicate rows, oversize and tiny chunks, skipped inputs, a missing
index); the blocking embeddings check keeps bad vectors out of vector_table."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import psycopg
import pytest
from dagster import AssetCheckSeverity, instance_for_test, materialize
from pgvector.psycopg import register_vector

warnings.filterwarnings("ignore", category=Warning, module="dagster")

from pipelines.assets import ASSETS, chunks, embeddings, flattened_sections, raw_documents, vector_table  # noqa: E402
from pipelines.checks import CHECKS, embeddings_valid, to_check_result  # noqa: E402
from pipelines.partitions import CORPUS_FILES, range_tags  # noqa: E402
from pipelines.resources import RagResource, preload_provider  # noqa: E402
from rag_lib import quality  # noqa: E402
from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.store import Store  # noqa: E402
from rag_lib.store.vectors import index_name  # noqa: E402

FILES = ["tradegent/fixtures/sample_trade.yaml", "tradegent/fixtures/sample_earnings.yaml"]
KEYS = [f"corpus/{rel}" for rel in FILES]  # partition keys: <root name>/<path under the root>
# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


def _registered(settings: Settings, provider, root) -> None:
    with KnowledgeBase(settings, provider=provider) as kb:
        kb.add_root(root)  # roots are registry state, not run config


@pytest.fixture
def staged(corpus_copy, database_url, provider, tmp_path):
    """Two files run through every stage (stage rows, staged vectors, serving rows, HNSW index)."""
    root = corpus_copy(*FILES)
    home = tmp_path / ".rag"
    settings = Settings(database_url=database_url, home=home)
    preload_provider(settings, provider)
    _registered(settings, provider, root)
    rag = RagResource(database_url=database_url, home=str(home))
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
        assert materialize(ASSETS, instance=instance, resources={"rag": rag}, tags=range_tags(*KEYS)).success
    kb = KnowledgeBase(settings, provider=provider)
    yield kb, rag, root
    kb.close()


def _sql(url: str, query: str, params=()):
    with psycopg.connect(url, autocommit=True) as conn:
        register_vector(conn)
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


@pytest.mark.slow
def test_embeddings_check(staged):
    kb, _, _ = staged
    good = quality.check_embeddings(kb.store, kb.settings)
    assert good.passed and good.metadata["checked"] > 10
    url = kb.settings.database_url
    (chunk_id,) = _sql(url, "SELECT chunk_id FROM rag_stage_vectors ORDER BY chunk_id LIMIT 1")[0]
    _sql(url, "UPDATE rag_stage_vectors SET embedding = %s WHERE chunk_id = %s", (np.zeros(384, dtype=np.float32), chunk_id))
    _sql(url, "INSERT INTO rag_stage_vectors (collection, path, chunk_id, content_hash, model, dimensions, embedding)"
              " VALUES ('default', %s, 'bad-dim', 'x', 'all-MiniLM-L6-v2', 384, %s)",
         (FILES[0], np.ones(383, dtype=np.float32)))
    bad = quality.check_embeddings(kb.store, kb.settings)
    assert not bad.passed and bad.severity == "error"
    assert bad.metadata["bad_zero_vector"] == 1 and bad.metadata["bad_wrong_dimension"] == 1
    assert any("bad-dim" in i for i in bad.metadata["offending_ids"])
    assert any(chunk_id in i for i in bad.metadata["offending_ids"])
    result = to_check_result(bad)
    assert result.severity == AssetCheckSeverity.ERROR and not result.passed


@pytest.mark.slow
def test_blocking_embeddings_check_stops_vector_table(corpus_copy, database_url, provider, tmp_path):
    root = corpus_copy(FILES[0])
    home = tmp_path / ".rag"
    preload_provider(Settings(database_url=database_url, home=home), provider)
    _registered(Settings(database_url=database_url, home=home), provider, root)
    rag = RagResource(database_url=database_url, home=str(home))
    Store(Settings(database_url=database_url, home=home)).close()  # schema in place before injecting
    _sql(database_url, "INSERT INTO rag_stage_vectors (collection, path, chunk_id, content_hash, model, dimensions,"
                        " embedding) VALUES ('default', 'elsewhere.yaml', 'wrong-model', 'x', 'other-model', 384, %s)",
         (np.ones(384, dtype=np.float32),))
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CORPUS_FILES, [KEYS[0]])
        result = materialize([raw_documents, flattened_sections, chunks, embeddings, vector_table, embeddings_valid],
                             instance=instance, resources={"rag": rag}, partition_key=KEYS[0], raise_on_error=False)
    assert not result.success
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed and check.metadata["bad_wrong_model"].value == 1
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "embeddings" in materialized and "vector_table" not in materialized
    assert _sql(database_url, "SELECT count(*) FROM rag_documents")[0][0] == 0  # nothing published ahead either


@pytest.mark.slow
def test_vector_table_check(staged):
    kb, _, _ = staged
    space = kb.provider.space
    good = quality.check_vector_table(kb.store, space)
    assert good.passed, good.description
    url = kb.settings.database_url
    # An orphan: a copy of a chunk with no vector (and a duplicate of its text), plus a stale hash.
    _sql(url, """INSERT INTO rag_chunks (chunk_id, collection, path, doc_id, doc_type, section, section_path, unit_id,
                 ordinal, text, embed_text, token_count, content_hash, doc_hash, char_start, char_end)
                 SELECT 'orphan-1', collection, path, doc_id, doc_type, section, section_path, unit_id, ordinal + 1000,
                        text, embed_text, token_count, content_hash, doc_hash, char_start, char_end
                 FROM rag_chunks WHERE path = %s ORDER BY chunk_id LIMIT 1""", (FILES[0],))
    _sql(url, "UPDATE rag_chunks SET doc_hash = 'gone' WHERE chunk_id = (SELECT min(chunk_id) FROM rag_chunks WHERE path = %s)",
         (FILES[1],))
    bad = quality.check_vector_table(kb.store, space)
    assert not bad.passed
    assert bad.metadata["chunks_without_vector"] == 1 and bad.metadata["chunks_without_vector_ids"] == ["orphan-1"]
    assert bad.metadata["chunks_with_stale_hash"] == 1 and bad.metadata["duplicate_chunks"] == 1
    # which documents, and what to do: an operator cannot act on chunk hashes alone
    assert bad.metadata["chunks_without_vector_documents"] == [f"default:{FILES[0]}"]
    assert f"1 chunks without vector (in default:{FILES[0]})" in bad.description
    assert "`rag ingest PATH --force`" in bad.description and "force: true" in bad.description


@pytest.mark.slow
def test_chunk_size_check(staged):
    kb, _, _ = staged
    limit = kb.provider.max_tokens
    good = quality.check_chunks(kb.store, kb.settings, limit)
    assert good.passed, good.description
    assert good.metadata["p5"] <= good.metadata["p50"] <= good.metadata["p95"] <= limit
    assert "| tokens | chunks |" in good.markdown["histogram"]
    url = kb.settings.database_url
    _sql(url, """UPDATE rag_stage_outputs SET payload = jsonb_set(payload, '{documents,0,chunks,0,token_count}', '9999')
                 WHERE stage = 'chunks' AND path = %s""", (FILES[0],))
    (oversize,) = _sql(url, """SELECT payload->'documents'->0->'chunks'->0->>'chunk_id' FROM rag_stage_outputs
                               WHERE stage = 'chunks' AND path = %s""", (FILES[0],))[0]
    bad = quality.check_chunks(kb.store, kb.settings, limit)
    assert not bad.passed and bad.severity == "error" and bad.metadata["oversize_ids"] == [oversize]
    assert "expect_column_values_to_be_between(token_count)" in bad.description
    # An empty or missing text fails too (the frame holds each text's length, not the text)
    for text, expectation in (('""', "expect_column_values_to_be_between(text_chars)"),
                              ("null", "expect_column_values_to_not_be_null(text_chars)")):
        _sql(url, f"""UPDATE rag_stage_outputs SET payload = jsonb_set(jsonb_set(payload,
                      '{{documents,0,chunks,0,token_count}}', '40'), '{{documents,0,chunks,0,text}}', '{text}')
                      WHERE stage = 'chunks' AND path = %s""", (FILES[0],))
        empty = quality.check_chunks(kb.store, kb.settings, limit)
        assert not empty.passed and empty.severity == "error" and expectation in empty.description, empty.description
    _sql(url, """UPDATE rag_stage_outputs SET payload = jsonb_set(payload, '{documents,0,chunks,0,text}', '"restored"')
                 WHERE stage = 'chunks' AND path = %s""", (FILES[0],))
    # Too many tiny chunks is a warning, not an error.
    _sql(url, """UPDATE rag_stage_outputs SET payload = jsonb_set(payload, '{documents,0,chunks,0,token_count}', '40')
                 WHERE stage = 'chunks' AND path = %s""", (FILES[0],))
    kb.settings.pipeline.tiny_chunk_tokens = 10_000
    tiny = quality.check_chunks(kb.store, kb.settings, limit)
    assert not tiny.passed and tiny.severity == "warn" and tiny.metadata["tiny_fraction"] == 1.0


@pytest.mark.slow
def test_an_unchanged_chunk_frame_is_validated_once(staged, monkeypatch):
    """Great Expectations (seconds of CPU to import) runs once per distinct chunk frame: the same
    frame checked again gets the same result from the last validation, kept in the home folder; a
    changed chunk is validated again."""
    kb, _, _ = staged
    quality._stop_validator()  # validations in this process, where they are counted
    runs = []
    real = quality._validate_chunk_frame

    @functools.wraps(real)
    def counted(*args):
        runs.append(len(args[0]))
        return real(*args)

    monkeypatch.setattr(quality, "_validate_chunk_frame", counted)
    limit = kb.provider.max_tokens
    first = quality.check_chunks(kb.store, kb.settings, limit)
    again = quality.check_chunks(kb.store, kb.settings, limit)
    assert first.passed and len(runs) == 1
    assert (again.passed, again.description, again.metadata, again.markdown) == \
        (first.passed, first.description, first.metadata, first.markdown)
    assert (kb.settings.home / "quality" / quality.VALIDATED).exists()
    _sql(kb.settings.database_url, """UPDATE rag_stage_outputs SET payload = jsonb_set(payload,
             '{documents,0,chunks,0,token_count}', '9999') WHERE stage = 'chunks' AND path = %s""", (FILES[0],))
    bad = quality.check_chunks(kb.store, kb.settings, limit)
    assert not bad.passed and len(runs) == 2


@pytest.mark.slow
def test_skipped_inputs_check(staged):
    kb, rag, root = staged
    assert quality.check_skipped(kb.store).passed
    (root / "templates").mkdir()
    (root / "templates" / "broken.yaml").write_text("a: [1, 2\n")
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CORPUS_FILES, ["corpus/templates/broken.yaml"])
        assert materialize([raw_documents], instance=instance, resources={"rag": rag},
                           partition_key="corpus/templates/broken.yaml").success
    warn = quality.check_skipped(kb.store)
    assert not warn.passed and warn.severity == "warn" and warn.metadata["reason_malformed_yaml"] == 1
    assert "templates/broken.yaml" in warn.markdown["skipped_inputs"]


@pytest.mark.slow
def test_metadata_warnings_check(staged):
    kb, rag, root = staged
    assert quality.check_metadata(kb.store).passed
    (root / "notes").mkdir()
    (root / "notes" / "odd.yaml").write_text("_meta:\n  type: stock-analysis\nticker: 123\nanalysis_date: soon\n"
                                             "thesis: up\n")
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CORPUS_FILES, ["corpus/notes/odd.yaml"])
        assert materialize([raw_documents], instance=instance, resources={"rag": rag},
                           partition_key="corpus/notes/odd.yaml").success
    warn = quality.check_metadata(kb.store)
    assert not warn.passed and warn.severity == "warn"
    assert warn.metadata == {"documents": 1, "warnings": 2}
    assert "notes/odd.yaml" in warn.markdown["metadata_warnings"] and "analysis_date 'soon'" in warn.markdown[
        "metadata_warnings"]
    assert kb.store.metadata_warnings("elsewhere") == []


@pytest.mark.slow
def test_hnsw_check(staged):
    kb, _, _ = staged
    space = kb.provider.space
    good = quality.check_hnsw(kb.store, kb.settings, space, 384)
    assert good.passed, good.description
    assert good.metadata["recall_at_10"] >= 0.95 and good.metadata["sample_size"] > 10
    kb.settings.pipeline.min_recall = 1.01  # unreachable: the check must fail on its threshold
    assert not quality.check_hnsw(kb.store, kb.settings, space, 384).passed
    _sql(kb.store.db.url, f'DROP INDEX "{index_name(space)}"')
    missing = quality.check_hnsw(kb.store, kb.settings, space, 384)
    assert not missing.passed and missing.metadata["exists"] is False


def test_checks_registered_on_their_assets():
    by_asset = {next(iter(c.check_keys)).asset_key.to_user_string(): c for c in CHECKS}
    assert set(by_asset) == {"embeddings", "vector_table", "chunks", "raw_documents", "hnsw_index"}
    spec = next(iter(by_asset["embeddings"].check_specs))
    assert spec.blocking


def test_recall_is_measured_against_the_databases_exact_ranking(corpus_kb):
    """The recall check ranks the stored vectors itself, in one read: its exact neighbours are the
    database's exact ranking's, and its recall is the walk's overlap with them."""
    from psycopg import sql

    from rag_lib.store.checks import _exact_neighbours
    from rag_lib.store.connection import as_array

    store, space = corpus_kb.store, corpus_kb.provider.space
    knn = sql.SQL("SELECT chunk_id FROM rag_chunk_vectors WHERE space = %s"
                  " ORDER BY embedding::vector(384) <=> %s::vector(384) LIMIT 10")
    with store.db.connection() as conn, conn.transaction():
        queries = [as_array(r[0]) for r in conn.execute(
            "SELECT embedding FROM rag_chunk_vectors WHERE space = %s ORDER BY md5(chunk_id) LIMIT 30", (space,))]
        conn.execute("SET LOCAL hnsw.ef_search = 4")  # a walk this short misses most of the 10
        walked = [{r[0] for r in conn.execute(knn, (space, q))} for q in queries]
        conn.execute("SET LOCAL enable_indexscan = off")
        exact = [[r[0] for r in conn.execute(knn, (space, q))] for q in queries]
        # the same ten (equal distances may come in either order: the corpus repeats some texts)
        assert [set(found) for found in _exact_neighbours(conn, space, queries, 10)] == [set(e) for e in exact]
    overlap = sum(len(w & set(e)) for w, e in zip(walked, exact)) / 300
    measured = store.measure_recall(space, 384, 30, 10, 4)
    assert measured["recall"] == pytest.approx(overlap) and measured["sample"] == 30
    assert 0 < overlap < 0.9  # the walk missed some: the exact side was tested, not just agreed with
