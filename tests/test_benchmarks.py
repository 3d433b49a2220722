"""Every script in benchmarks/ still runs: `--help` answers without starting the run, and a tiny run
prints one JSON line with its figures. A refactor that breaks a benchmark fails here instead of
rotting until someone needs the numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_lib.db import stop_embedded
from testkit import create_database

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))
# A few files of the shared corpus: YAML analyses of two types, a trade, and a markdown note.
FILES = ("tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml",
         "tradegent/knowledge/analysis/stock/MSFT_20260220T1805.yaml",
         "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml",
         "tradegent/fixtures/sample_trade.yaml")


def run(script: str, *args: str, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    base.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_answers_without_starting_the_run(script: str, tmp_path: Path):
    done = run(script, "--help", cwd=tmp_path, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def _tiny_eval_set(tmp: Path) -> list[str]:
    """Two questions about FILES' sample trade, as --queries/--qrels arguments."""
    (tmp / "queries.jsonl").write_text(
        '{"_id": "q1", "text": "NVDA trade exit price", "metadata": {"type": "factual"}}\n'
        '{"_id": "q2", "text": "lessons from the NVDA earnings trade", "metadata": {"type": "factual"}}\n')
    (tmp / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                   "q1\ttradegent/fixtures/sample_trade.yaml#execution\t2\n"
                                   "q2\ttradegent/fixtures/sample_trade.yaml#review\t2\n")
    return ["--queries", str(tmp / "queries.jsonl"), "--qrels", str(tmp / "qrels.tsv")]


def _tiny_set_folder(tmp: Path) -> Path:
    """A folder holding `_tiny_eval_set`'s queries.jsonl and qrels.tsv (scripts that take --set)."""
    folder = tmp / "tiny-set"
    folder.mkdir(exist_ok=True)
    _tiny_eval_set(folder)
    return folder


def _built_search_bench(corpus: Path, tmp: Path) -> list[str]:
    """search_latency.py measures a database search.py built: build a tiny one first (--build-only)."""
    done = run("search.py", "--corpus", str(corpus), "--chunks", "400", "--build-only", "--work", str(tmp / "bench"),
               cwd=tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return ["--work", str(tmp / "bench")]


# Per script: the arguments of a run of a few seconds (given the small corpus copy `corpus`, a
# scratch folder `tmp`), and figures its JSON line must hold.
SMALL = {
    "adapt_model.py": (lambda corpus, tmp: ["--corpus", str(corpus), *_tiny_eval_set(tmp), "--steps", "1",
                                            "--batch-size", "4", "--max-seq-length", "32", "--train-layers", "1",
                                            "--modes", "semantic", "--work", str(tmp / "bench")],
                       {"training", "base", "adapted"}),
    "api.py": (lambda corpus, tmp: ["--seconds", "1", "--levels", "1", "--corpus", str(corpus)],
               {"in_process", "http", "errors"}),
    "dagster_partitions.py": (lambda corpus, tmp: ["--files", "20", "--corpus", str(corpus)],
                              {"register_seconds", "sensor_first_tick_seconds", "sensor_idle_tick_seconds",
                               "sensor_change_tick_seconds", "one_partition_seconds", "ui_partition_health_seconds",
                               "ui_backfill_all_seconds", "backfill_run_create_seconds", "failed_run_report_seconds",
                               "ui_failed_partitions_after_failure", "sensor_change_tick_keys_covered", "load_before"}),
    "dagster_overhead.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--sensor-files", "20", "--rounds", "1"],
                            {"library_seconds", "dagster_seconds", "ratio", "chunks", "library_encoder_ratio",
                             "dagster_encoder_ratio", "dagster_run_encoder_ratio", "library_schema_seconds",
                             "dagster_schema_seconds", "library_encoder_ratio_mean", "dagster_step_encoder_ratio_mean"}),
    "embedding.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--latency", "0"],
                     {"clean", "with_faults", "second_run_cache_hit_rate"}),
    "eval_scifact.py": (lambda corpus, tmp: ["--docs", "30", "--modes", "lexical", "--work", str(tmp / "bench")],
                        {"ingest", "results"}),
    "graph.py": (lambda corpus, tmp: ["--docs", "30", "--queries", "9"],
                 {"edges", "p95_ms", "paths_depth4", "complete_graph_52_unreachable"}),
    "graph_fusion.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--weights", "0.25", "--seeds", "5",
                                             "--work", str(tmp / "bench")],
                        {"runs", "graph", "per_query"}),
    "ingest.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--copies", "1", "--dagster"],
                  {"ratio", "cpu_ratio", "rerun_seconds", "peak_rss_mb", "load_before", "load_after",
                   "dagster_ratio", "dagster_run_ratio", "dagster_steps", "dagster_cpu_s", "dagster_cpu_ratio"}),
    "lexical_reference.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--collection", "small",
                                                  *_tiny_eval_set(tmp)], {"ndcg@10"}),
    "local_batch_size.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--chunks", "8", "--sizes", "8",
                                                 "--runtimes", "onnx", "--rounds", "1"], set()),
    "onnx_spinning.py": (lambda corpus, tmp: ["--queries", "4", "--chunks", "8", "--clients", "2", "--rounds", "1"],
                         {"spinning", "not_spinning", "same_vectors", "load_before"}),
    "parallel.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--runs", "1", "--local-files", "2",
                                         "--latency", "0"], {"stub", "local"}),
    "retrieval_cv.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--set", str(_tiny_set_folder(tmp)),
                                             "--variant", "alpha:convex_alpha=0.4", "--folds", "2", "--repeats", "1",
                                             "--work", str(tmp / "bench")],
                        {"ndcg@10", "cv", "variants"}),
    # scale.py samples 2,000 chunks for its recall figures and picks among 20 nearby anchors
    "scale.py": (lambda corpus, tmp: ["--chunks", "2000", "--anchors", "40", "--queries", "3", "--types", "vector",
                                      "--maintenance-work-mem", "64MB", "--cache", str(tmp / "anchors.npy"),
                                      "--ef-search-sweep", "40", "--shared-buffers", "1536MB"],
                 {"load", "chunks"}),
    "search.py": (lambda corpus, tmp: ["--corpus", str(corpus), "--chunks", "400", "--queries", "3",
                                       "--recall-queries", "2", "--warmup", "0", "--work", str(tmp / "bench")],
                  set()),
    "search_latency.py": (lambda corpus, tmp: [*_built_search_bench(corpus, tmp), "--queries", "3", "--warmup", "1"],
                          {"latency", "stages_p95", "feedback_applied", "load_start", "load_end"}),
    # the code compared with itself: the run's shape, not a speed-up
    "search_versions.py": (lambda corpus, tmp: [*_built_search_bench(corpus, tmp), "--base", str(REPO), "--queries", "3",
                                                "--warmup", "1", "--rounds", "1", "--lever-rounds", "1"],
                           {"questions", "target_hybrid_p95_le_1.2x"}),
    "stale_plan.py": (lambda corpus, tmp: ["--docs", "2000", "--per-folder", "100", "--rounds", "3"],
                      {"one_file", "folder", "root", "one_file_without_index"}),
    "soak.py": (lambda corpus, tmp: ["--seconds", "3", "--clients", "2", "--files", "3"], set()),
}


def test_every_benchmark_has_a_small_run():
    assert sorted(SMALL) == SCRIPTS, "give the new benchmark a small size here"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMALL))
def test_small_run_prints_one_json_line_of_figures(script: str, corpus_copy, pg_server: str, tmp_path: Path):
    make_args, figures = SMALL[script]
    corpus = corpus_copy(*FILES)
    env = {"RAG_DATABASE_URL": create_database(pg_server)} if script in ("api.py", "lexical_reference.py") else {}
    try:
        done = run(script, *make_args(corpus, tmp_path), cwd=tmp_path, env=env)
    finally:
        if (tmp_path / "bench" / "pgdata").exists():
            stop_embedded(tmp_path / "bench" / "pgdata")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, done.stdout[-3000:]
    out = json.loads(lines[0])
    assert isinstance(out, dict) and figures <= set(out), (figures - set(out), sorted(out))
