"""The `knowledge_graph` asset and its checks, materialized through Dagster on copies of shared
corpus files with `_graph` and `_links`: the per-file report (exact counts for a known trade journal),
unchanged files re-emitting it, and the checks passing on clean data, then warning on a planted
dangling link and failing on a planted orphan node and stale edge."""

from __future__ import annotations

import warnings

import psycopg
import pytest
import yaml
from dagster import AssetCheckSeverity, AssetKey, instance_for_test

warnings.filterwarnings("ignore", category=Warning, module="dagster")

from pipelines.definitions import defs  # noqa: E402
from pipelines.jobs import INGEST_JOB  # noqa: E402
from pipelines.partitions import CORPUS_FILES, range_tags  # noqa: E402
from pipelines.resources import preload_provider  # noqa: E402
from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402

# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = [pytest.mark.slow, pytest.mark.warm_cache]

K = "tradegent/knowledge"
TRADE = f"{K}/trades/2025/01/NVDA_20250115T1000.yaml"
TARGETS = [f"{K}/analysis/earnings/NVDA_20250120T0900.yaml", f"{K}/strategies/earnings-momentum.yaml",
           f"{K}/analysis/ticker-profiles/2025/01/NVDA_20250110T1000.yaml",
           f"{K}/learnings/biases/loss-aversion-pre-earnings.yaml"]
LEARNING = TARGETS[-1]
KEYS = sorted(f"corpus/{rel}" for rel in [TRADE, *TARGETS])
GRAPH_CHECK_NAMES = {"graph_dangling_links", "graph_orphan_nodes", "graph_stale_edges", "graph_duplicate_nodes",
                     "graph_counts"}


def _rewrite(path, change) -> None:
    body = yaml.safe_load(path.read_text())
    change(body)
    path.write_text(yaml.safe_dump(body, sort_keys=False))


def _run(instance, job):
    result = job.execute_in_process(instance=instance, tags=range_tags(KEYS[0], KEYS[-1]))
    assert result.success
    graph = {ev.partition: ev.step_materialization_data.materialization.metadata
             for ev in result.get_asset_materialization_events() if ev.asset_key == AssetKey("knowledge_graph")}
    checks = {ev.check_name: ev for ev in result.get_asset_check_evaluations()}
    return graph, checks


def test_knowledge_graph_asset_reports_each_file_and_its_checks_catch_planted_faults(
        corpus_copy, database_url, provider, tmp_path, monkeypatch):
    job = defs.resolve_job_def(INGEST_JOB)  # the code location's ingest job, with the graph asset and checks
    assert AssetKey("knowledge_graph") in job.asset_layer.selected_asset_keys

    root = corpus_copy(TRADE, *TARGETS)
    for rel in TARGETS:  # the targets' own links lead out of this small set (and globs never resolve)
        _rewrite(root / rel, lambda body: body.pop("_links", None))
    home = tmp_path / ".rag"
    settings = Settings(database_url=database_url, home=home)
    preload_provider(settings, provider)
    with KnowledgeBase(settings, provider=provider) as kb:
        kb.add_root(root)
    monkeypatch.setenv("RAG_DATABASE_URL", database_url)  # what the job's RagResource() reads
    monkeypatch.setenv("RAG_HOME", str(home))
    monkeypatch.delenv("RAG_CONFIG", raising=False)
    trade_key = f"corpus/{TRADE}"
    with instance_for_test() as instance:
        instance.add_dynamic_partitions(CORPUS_FILES, KEYS)
        graph, checks = _run(instance, job)
        assert set(graph) == set(KEYS) and {m["status"].value for m in graph.values()} == {"ok"}
        trade = graph[trade_key]
        assert trade["edges_by_predicate"].value == {
            "about_ticker": 1, "based_on": 1, "catalyst_type": 1, "dated": 1, "exhibited_bias": 1,
            "has_entity": 4, "has_type": 1, "links_to": 4, "resulted_in": 1, "traded": 1}
        # `earnings` is a catalyst here but a category for the strategy, published before it: the first type stays.
        # The trade's id is its own node and `based_on EA-NVDA-Q4-2024` is the earnings analysis' node.
        assert trade["nodes_by_kind"].value == {"bias": 1, "category": 1, "date": 1, "doc": 5, "doc_type": 1,
                                                "outcome": 1, "ticker": 1}
        assert trade["edges"].value == 16 and trade["nodes"].value == 11 and trade["dangling_links"].value == 0
        table = trade["triples"].value
        assert f"| doc:{TRADE} | exhibited_bias | loss-aversion | _graph |" in table
        # the run rebuilt the ticker profiles entity linking uses: NVDA, the one ticker documents are about
        assert trade["profiles"].value == 1 and trade["profiles_rebuilt"].value == 1
        assert "**NVDA**: NVDA: NVIDIA Corporation" in trade["profiles_sample"].value
        assert {n: checks[n].passed for n in GRAPH_CHECK_NAMES} == dict.fromkeys(GRAPH_CHECK_NAMES, True)
        counts = checks["graph_counts"].metadata
        assert counts["edges_by_predicate"].value["links_to"] == 4 and counts["nodes_by_kind"].value["doc"] == 5
        assert "| links_to | 4 |" in counts["predicates"].value
        assert len(counts["sample"].value.splitlines()) == 2 + 10  # header, rule, ten `_graph` triples

        # planted: a link to a file that is not in the corpus, an orphan node, an edge of an old version
        _rewrite(root / LEARNING, lambda body: body.update(_links={"related_learnings": ["learnings/biases/gone.yaml"]}))
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("INSERT INTO rag_graph_nodes (collection, key, kind, label)"
                         " VALUES ('default', 'planted-orphan', 'entity', 'planted')")
            conn.execute("UPDATE rag_graph_edges SET doc_hash = 'an-older-version'"
                         " WHERE path = %s AND predicate = 'traded'", (TRADE,))
        graph, checks = _run(instance, job)
        learning = graph[f"corpus/{LEARNING}"]
        assert learning["status"].value == "ok" and learning["dangling_links"].value == 1
        assert learning["dangling"].value == ["related_learnings: learnings/biases/gone.yaml"]
        assert graph[trade_key]["status"].value == "unchanged"  # same graph: the same report, re-emitted
        assert graph[trade_key]["edges_by_predicate"].value == trade["edges_by_predicate"].value
        assert graph[trade_key]["profiles_rebuilt"].value == 0  # NVDA's documents did not change
        dangling, orphans, stale = (checks[n] for n in ("graph_dangling_links", "graph_orphan_nodes", "graph_stale_edges"))
        assert not dangling.passed and dangling.severity == AssetCheckSeverity.WARN
        assert dangling.metadata["links"].value == [f"{LEARNING} → learnings/biases/gone.yaml"]
        assert not orphans.passed and orphans.severity == AssetCheckSeverity.ERROR
        assert orphans.metadata["nodes"].value == ["planted-orphan"]
        assert not stale.passed and stale.severity == AssetCheckSeverity.ERROR
        assert stale.metadata["edges"].value == [f"{TRADE}: doc:{TRADE} traded ticker:NVDA"]
        assert checks["graph_counts"].passed
