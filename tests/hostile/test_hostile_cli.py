"""Every hostile file at once through the real `rag ingest` and `rag validate` processes: both
finish within a generous bound, skip each bomb with its reason and keep the good files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bombs import GOOD_FILES, cases

pytestmark = pytest.mark.subprocess

RAG = [sys.executable, "-m", "rag_lib.cli"] if not (Path(sys.executable).parent / "rag").exists() else [
    str(Path(sys.executable).parent / "rag")]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(RAG + args, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def hostile_root(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    for rel, text in GOOD_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for case in cases():
        (root / case.name).write_bytes(case.data)
    return root


@pytest.fixture
def cli_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(RAG_DATABASE_URL=database_url, RAG_HOME=str(tmp_path / ".rag"), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    return env


@pytest.mark.timeout(600)
def test_rag_ingest_skips_every_bomb_and_keeps_the_good_files(hostile_root: Path, cli_env, kb):
    done = run(["ingest", str(hostile_root), "--json"], cli_env)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    outcomes = {f["path"]: f for f in report["files"]}
    for case in cases():
        outcome = outcomes[case.skipped_path or case.name]
        if case.reason is None:
            assert outcome["status"] == "new", outcome
        else:
            assert (outcome["status"], outcome["reason"]) == ("skipped", case.reason), outcome
    for rel in GOOD_FILES:
        assert outcomes[rel]["status"] == "new"
    assert report["failed"] == 0
    paths = {d["path"] for d in kb.store.list_documents(None)}
    assert "../../etc/passwd" not in paths and "good.md" in paths
    assert kb.search("NVDA datacenter accelerator demand", top_k=3).hits[0].path == "good.md"
    assert kb.search("copper miners grid electrification", top_k=3).hits[0].path == "notes/plain.yaml"


@pytest.mark.timeout(600)
def test_rag_validate_reports_every_bomb_as_a_problem(hostile_root: Path, cli_env):
    done = run(["validate", str(hostile_root), "--json"], cli_env)
    assert done.returncode == 1, done.stderr[-2000:]  # problems found: exit 1, not a crash
    report = json.loads(done.stdout)
    problems = {f["path"]: f.get("problem") for f in report["files"]}
    for case in cases():
        problem = problems[case.skipped_path or case.name]
        if case.reason is None:
            assert problem is None, problem
        else:
            assert problem and problem.startswith(f"{case.reason}: "), problem
    for rel in GOOD_FILES:
        assert problems[rel] is None
