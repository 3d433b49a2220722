"""benchmarks/retrieval_cv.py's cross-validation rule, on made-up per-question scores: a setting is
picked only when it helps on the training questions of every set, so a change that lifts one dev set
at the other's cost never becomes a default."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "retrieval_cv.py"


def _module():
    spec = importlib.util.spec_from_file_location("retrieval_cv", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scores(base: float, a: float, b: float, n: int = 20) -> dict[tuple[str, str], float]:
    """Per-question nDCG: set A's questions at base + a, set B's at base + b."""
    return {**{("A", f"a{i}"): base + a for i in range(n)}, **{("B", f"b{i}"): base + b for i in range(n)}}


def test_a_setting_that_lowers_one_set_is_never_picked_and_one_that_lifts_both_is():
    cv = _module()
    scores = {"current": _scores(0.5, 0, 0),
              "lopsided": _scores(0.5, 0.3, -0.05),  # the best mean overall, but set B falls
              "both": _scores(0.5, 0.02, 0.02)}
    out = cv.cross_validate(scores, folds=5, repeats=3)
    assert out["picks"] == {"both": 15}
    held = out["held_out_ndcg@10"]
    assert held["picked"] == held["both"] > held["current"]
    assert held["lopsided"] > held["both"]  # what a plain best-mean rule would have picked


def test_the_current_settings_stay_when_nothing_helps_every_set():
    cv = _module()
    scores = {"current": _scores(0.5, 0, 0), "worse": _scores(0.5, -0.01, 0.2), "other": _scores(0.5, 0.2, -0.01)}
    out = cv.cross_validate(scores, folds=5, repeats=2)
    assert out["picks"] == {"current": 10}
    assert out["held_out_ndcg@10"]["picked"] == out["held_out_ndcg@10"]["current"]


def test_variants_are_read_as_settings():
    cv = _module()
    assert cv.parse_variant("mix:convex_alpha=0.4,entity_linking=false,fusion=rrf") == (
        "mix", {"convex_alpha": 0.4, "entity_linking": False, "fusion": "rrf"})
