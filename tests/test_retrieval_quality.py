"""The retrieval_quality check: runs the configured eval set, records nDCG@10 / recall@10 / MRR@10 per
query type and its history; passes on an unchanged index, warns when nDCG@10 drops more than
`eval.max_drop` below the last accepted run, errors (blocking, in Dagster) below `eval.ndcg_floor`.
The regression is planted for real: the document that answers a question is deleted."""

from __future__ import annotations

import json
import warnings

import pytest
from dagster import AssetCheckSeverity, AssetSelection, instance_for_test, materialize

warnings.filterwarnings("ignore", category=Warning, module="dagster")

from pipelines.assets import ASSETS  # noqa: E402
from pipelines.checks import retrieval_quality, to_check_result  # noqa: E402
from pipelines.partitions import CORPUS_FILES, range_tags  # noqa: E402
from pipelines.resources import RagResource, preload_provider  # noqa: E402
from rag_lib import quality  # noqa: E402
from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402

TRADE = "tradegent/fixtures/sample_trade.yaml"
EARNINGS = "tradegent/fixtures/sample_earnings.yaml"
# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache
QUERIES = [
    ("q1", "at what price did we exit the NVDA trade and why", "factual", f"{TRADE}#execution"),
    ("q2", "lessons and biases from reviewing the NVDA trade", "factual", f"{TRADE}#review"),
    ("q3", "bear case: valuation stretched at 35x forward P/E, AI spending could slow", "paraphrase",
     f"{EARNINGS}#steel_man"),
]


def _eval_set(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "queries.jsonl").write_text("".join(
        json.dumps({"_id": qid, "text": text, "metadata": {"type": qtype}}) + "\n" for qid, text, qtype, _ in QUERIES))
    (folder / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{qid}\t{unit}\t2\n" for qid, _, _, unit in QUERIES))
    return folder / "queries.jsonl", folder / "qrels.tsv"


@pytest.fixture
def configured(kb, corpus_copy, tmp_path):
    root = corpus_copy(TRADE, EARNINGS)
    kb.ingest([root], root=root)
    kb.settings.eval.queries, kb.settings.eval.qrels = _eval_set(tmp_path / "eval")
    return kb, root


def test_unconfigured_check_passes_without_measuring(kb):
    result = kb.quality_check("retrieval")
    assert result.passed and result.metadata == {"configured": False}


def test_check_records_per_type_metrics_and_warns_on_a_drop(configured):
    kb, root = configured
    first = kb.quality_check("retrieval")
    assert first.passed, first.description
    assert "first run" in first.description
    assert first.metadata["ndcg@10"] >= 0.9  # every question's unit ranks near the top
    assert {"ndcg@10 factual", "ndcg@10 paraphrase"} <= set(first.metadata)
    assert "| factual | 2 |" in first.markdown["per_type"]
    again = kb.quality_check("retrieval")
    assert again.passed and again.metadata["baseline_ndcg@10"] == first.metadata["ndcg@10"]

    # planted regression: the document answering q3 goes, so a third of the set scores 0
    kb.delete_document(EARNINGS)
    dropped = kb.quality_check("retrieval")
    drop = first.metadata["ndcg@10"] - dropped.metadata["ndcg@10"]
    assert drop > 0.25
    assert not dropped.passed and dropped.severity == "warn", dropped.description
    assert "below the last accepted run" in dropped.description
    assert dropped.metadata["ndcg@10 paraphrase"] == 0.0
    # the failed run is history, not the baseline: it is still compared with the first run
    assert kb.quality_check("retrieval").metadata["baseline_ndcg@10"] == first.metadata["ndcg@10"]
    history = kb.store.eval_history(quality.eval_set_key(kb.settings))
    assert [r["accepted"] for r in history] == [False, False, True, True]
    assert "| warn | no |" in dropped.markdown["history"]

    # the tolerance is the line: just above the measured drop passes, just below warns
    kb.settings.eval.max_drop = drop + 0.001
    assert kb.quality_check("retrieval").passed
    kb.settings.eval.max_drop = 0.02
    # that passing run became the new baseline: the same index now passes at the default tolerance
    assert kb.quality_check("retrieval").passed


def test_check_errors_below_the_floor(configured):
    kb, _ = configured
    kb.settings.eval.ndcg_floor = 0.8
    good = kb.quality_check("retrieval")
    assert good.passed, good.description
    kb.delete_document(EARNINGS)
    bad = kb.quality_check("retrieval")
    assert not bad.passed and bad.severity == "error"
    assert "eval.ndcg_floor = 0.8" in bad.description


@pytest.mark.slow
def test_dagster_check_blocks_below_the_floor_and_warns_on_a_drop(corpus_copy, database_url, provider, tmp_path,
                                                                  monkeypatch):
    root = corpus_copy(TRADE, EARNINGS)
    queries, qrels = _eval_set(tmp_path / "eval")
    monkeypatch.setenv("RAG_EVAL__QUERIES", str(queries))
    monkeypatch.setenv("RAG_EVAL__QRELS", str(qrels))
    home = tmp_path / ".rag"
    settings = Settings(database_url=database_url, home=home)
    preload_provider(settings, provider)
    with KnowledgeBase(settings, provider=provider) as kb:
        kb.add_root(root)
    keys = [f"corpus/{TRADE}", f"corpus/{EARNINGS}"]
    rag = RagResource(database_url=database_url, home=str(home))
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CORPUS_FILES, keys)
        result = materialize(ASSETS + [retrieval_quality], instance=instance, resources={"rag": rag},
                             tags=range_tags(*keys))
        assert result.success
        (check,) = [c for c in result.get_asset_check_evaluations() if c.check_name == "retrieval_quality"]
        assert check.passed and check.metadata["ndcg@10"].value >= 0.9
        assert "ndcg@10 factual" in check.metadata and "history" in check.metadata

        with KnowledgeBase(settings, provider=provider) as kb:
            kb.delete_document(EARNINGS)
        only_check = AssetSelection.checks(retrieval_quality)
        warned = materialize(ASSETS + [retrieval_quality], instance=instance, resources={"rag": _fresh(rag)},
                             selection=only_check, raise_on_error=False)
        (check,) = warned.get_asset_check_evaluations()
        assert not check.passed and check.severity == AssetCheckSeverity.WARN
        assert warned.success  # a warning does not fail the run

        monkeypatch.setenv("RAG_EVAL__NDCG_FLOOR", "0.9")
        blocked = materialize(ASSETS + [retrieval_quality], instance=instance, resources={"rag": _fresh(rag)},
                              selection=only_check, raise_on_error=False)
        (check,) = blocked.get_asset_check_evaluations()
        assert not check.passed and check.severity == AssetCheckSeverity.ERROR
        spec = next(iter(retrieval_quality.check_specs))
        assert spec.blocking


def _fresh(rag: RagResource) -> RagResource:
    """A new resource reads the settings (environment) again."""
    return RagResource(database_url=rag.database_url, home=rag.home)


def test_reembed_gate_scores_with_the_checks_code(configured):
    """The re-embed's quality gate and the check give the same nDCG@10 for the same set and mode."""
    from rag_lib.reembed import eval_ndcg_at_10

    kb, _ = configured
    folder = kb.settings.eval.queries.parent
    kb.settings.eval.mode = "semantic"
    space = kb.store.active_space()
    gate = eval_ndcg_at_10(kb.store, kb.provider, space, folder)
    assert gate == kb.quality_check("retrieval").metadata["ndcg@10"]
    assert to_check_result(kb.quality_check("retrieval")).passed
