"""Parallel runs on one engine: ranges split for N runs, concurrent runs over the same files stay
correct (no duplicates, no orphans, the same rows as a clean library ingest), `--parallel` and the
skip of current files in `rag materialize`."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from pipelines.instance import get_instance, sqlalchemy_url
from pipelines.partitions import plan_ranges
from pipelines.resources import preload_provider
from pipelines.launch import (launch_runs, location_workspace, materialize_corpus, poll_delays, register_partitions,
                              wait_for_run)
from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.models import CorpusRoot
from testkit import create_database

RELS = [
    "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml",
    "tradegent/knowledge/scanners/daily/oversold-bounce.yaml",
    "tradegent/knowledge/strategies/earnings-momentum.yaml",
    "tradegent/knowledge/learnings/biases/loss-aversion-pre-earnings.yaml",
    "tradegent/knowledge/analysis/research/AI_CAPEX_20250110T0800.yaml",
    "tradegent/examples/sample_stock_analysis.yaml",
]


def test_plan_ranges_splits_into_disjoint_balanced_ranges():
    ordered = [f"r/{i:02d}" for i in range(10)]
    assert plan_ranges(ordered, ordered) == [("r/00", "r/09")]
    assert plan_ranges(ordered, ordered, parallel=4) == [("r/00", "r/02"), ("r/03", "r/05"), ("r/06", "r/08"),
                                                         ("r/09", "r/09")]
    # only the wanted files count towards the split; a span may hold current files between them
    assert plan_ranges(["r/01", "r/02", "r/07", "r/08"], ordered, parallel=2) == [("r/01", "r/02"), ("r/07", "r/08")]
    assert plan_ranges(ordered[:2], ordered, parallel=8) == [("r/00", "r/00"), ("r/01", "r/01")]


def test_waiting_on_a_run_reads_its_status_quickly_at_first_then_once_a_second():
    delays = poll_delays()
    first = [next(delays) for _ in range(12)]
    assert first[0] == 0.1  # a short run's end is seen within a tenth of a second
    assert first == sorted(first) and first[-1] == 1.0  # a long run is read once a second
    assert sum(first[:4]) < 1.0  # four reads in the first second


def _rows(url: str) -> dict[str, list]:
    with psycopg.connect(url) as conn:
        return {
            "chunks": conn.execute("SELECT path, chunk_id, content_hash FROM rag_chunks ORDER BY 1, 2").fetchall(),
            "vectors": conn.execute("SELECT count(*), count(DISTINCT chunk_id) FROM rag_chunk_vectors").fetchall(),
            "edges": conn.execute("SELECT path, src, predicate, dst FROM rag_graph_edges ORDER BY 1, 2, 3, 4").fetchall(),
            "indexes": conn.execute("SELECT (SELECT count(*) FROM pg_indexes WHERE indexname LIKE 'rag\\_vec\\_hnsw\\_%'),"
                                    " (SELECT count(*) FROM rag_index_builds)").fetchall(),
        }


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.warm_cache  # about concurrency, not encoding: the shared corpus's vectors are cached
def test_concurrent_overlapping_runs_then_parallel_materialize(corpus_copy, pg_server, database_url, provider,
                                                                   tmp_path, monkeypatch):
    root = corpus_copy(*RELS)
    dagster_db = f"dagster_{uuid.uuid4().hex[:8]}"
    create_database(pg_server, dagster_db)
    monkeypatch.setenv("DAGSTER_PG_URL", sqlalchemy_url(pg_server, dagster_db))
    home = tmp_path / ".rag"
    settings = Settings(database_url=database_url, home=home)
    preload_provider(settings, provider)
    instance = get_instance(settings, home=tmp_path / "dagster_home")
    try:
        with KnowledgeBase(settings, provider=provider) as kb:
            targets, ordered, _ = register_partitions(instance, kb, [CorpusRoot(root, "default")])
        assert len(targets) == 6
        # Three runs at once over overlapping ranges: every file is in two or more of them.
        ranges = [(ordered[0], ordered[3]), (ordered[2], ordered[5]), (ordered[0], ordered[5])]
        run_config = {"resources": {"rag": {"config": {"database_url": database_url, "home": str(home)}}}}
        with location_workspace(instance) as workspace:
            run_ids = launch_runs(instance, workspace, "ingest_files", run_config, ranges, parallel=3)
            runs = [wait_for_run(instance, run_id) for run_id in run_ids]
        assert [r.status.value for r in runs] == ["SUCCESS"] * 3, [r.status.value for r in runs]
        stats = [instance.get_run_stats(r.run_id) for r in runs]
        spans = [(st.start_time, st.end_time) for st in stats]
        # each run overlapped another one (launches are ~3 s apart; a run of a few cached files is short)
        overlapping = [any(s < e2 and s2 < e for j, (s2, e2) in enumerate(spans) if j != i)
                       for i, (s, e) in enumerate(spans)]
        assert all(overlapping), f"runs that overlapped no other run: {overlapping}, spans {spans}"

        with KnowledgeBase(settings, provider=provider) as kb:
            orphans = kb.quality_check("vector_table")
            assert orphans.passed, orphans.description  # no orphans, no duplicate chunks
            status = kb.status()
            assert not status["failures"], status["failures"]
        concurrent = _rows(database_url)
        assert concurrent["vectors"][0][0] == concurrent["vectors"][0][1] == len(concurrent["chunks"]) > 0
        assert concurrent["indexes"] == [(1, 1)]  # built once; the other runs waited and found it

        # The same files through the library into a clean database: the same rows.
        clean_url = create_database(pg_server, f"clean_{uuid.uuid4().hex[:8]}")
        with KnowledgeBase(Settings(database_url=clean_url, home=home), provider=provider) as clean:
            clean.ingest([root])
        clean_rows = _rows(clean_url)
        assert concurrent["chunks"] == clean_rows["chunks"] and concurrent["edges"] == clean_rows["edges"]

        # `rag materialize --parallel 2 --force`: two runs, each file materialized once.
        summary = materialize_corpus(instance, [CorpusRoot(root, "default")], database_url=database_url,
                                     home=str(home), force=True, parallel=2)
        assert summary.success and len(summary.run_ids) == 2 and summary.partitions == 6
        assert summary.stages["vector_table"] == {"ok": 6} and summary.stages["hnsw_index"] == {"ok": 2}
        tags = [instance.get_run_by_id(r).tags for r in summary.run_ids]
        assert {t["rag/trigger"] for t in tags} == {"rag materialize"}
        assert [(t["dagster/asset_partition_range_start"], t["dagster/asset_partition_range_end"]) for t in tags] == \
            [(ordered[0], ordered[2]), (ordered[3], ordered[5])]

        # Nothing changed: no run at all. One file changes: one run, for that file only.
        again = materialize_corpus(instance, [CorpusRoot(root, "default")], database_url=database_url, home=str(home))
        assert again.success and again.run_ids == [] and again.current == 6
        changed = root / RELS[2]
        changed.write_text(changed.read_text() + "\nnotes: re-checked after the parallel runs\n")
        once = materialize_corpus(instance, [CorpusRoot(root, "default")], database_url=database_url, home=str(home),
                                  parallel=4)
        assert once.success and len(once.run_ids) == 1 and once.current == 5
        run = instance.get_run_by_id(once.run_ids[0])
        assert run.tags["dagster/asset_partition_range_start"] == run.tags["dagster/asset_partition_range_end"]
        assert once.stages["vector_table"] == {"ok": 1}
    finally:
        instance.dispose()
