"""The code location loads: `dagster definitions validate` on workspace.yaml, and a webserver on
the workspace serves the asset graph (seven assets, their lineage) over GraphQL."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.subprocess

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _env(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "dagster_home"
    home.mkdir()
    # A throwaway instance (sqlite under DAGSTER_HOME): these tests load definitions, not storage.
    return {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(REPO), "DAGSTER_DISABLE_TELEMETRY": "1"}


def test_definitions_validate(tmp_path):
    proc = subprocess.run([str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rag_pipeline" in proc.stdout + proc.stderr


def test_the_location_loads_with_an_unreadable_tokenizer_path(tmp_path):
    """A bad embedding.tokenizer_path stopped the code location loading (the whole UI showed a load
    error): it loads, and the runs, ticks and commands that need the tokenizer say the setting."""
    config = tmp_path / "rag.yaml"
    config.write_text(f"embedding:\n  provider: openai_compatible\n  base_url: http://127.0.0.1:9/v1\n"
                      f"  tokenizer_path: {tmp_path / 'missing'}\n")
    proc = subprocess.run([str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"], cwd=REPO,
                          env={**_env(tmp_path), "RAG_CONFIG": str(config)}, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


QUERY = """{ assetNodes { assetKey { path } dependencyKeys { path } isPartitioned
  partitionDefinition { type } } }"""


def test_webserver_serves_asset_graph(tmp_path):
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN / "dagster-webserver"), "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 150
        nodes = None
        while time.monotonic() < deadline:
            try:
                r = httpx.post(f"http://127.0.0.1:{port}/graphql", json={"query": QUERY}, timeout=10)
                data = r.json().get("data") or {}
                if data.get("assetNodes"):
                    nodes = data["assetNodes"]
                    break
            except (httpx.HTTPError, ValueError):
                pass
            assert proc.poll() is None, "dagster-webserver exited"
            time.sleep(1)
        assert nodes is not None, "asset graph not served in time"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    graph = {n["assetKey"]["path"][0]: {d["path"][0] for d in n["dependencyKeys"]} for n in nodes}
    assert graph == {
        "raw_documents": set(),
        "flattened_sections": {"raw_documents"},
        "chunks": {"flattened_sections"},
        "embeddings": {"chunks"},
        "vector_table": {"embeddings"},
        "hnsw_index": {"vector_table"},
        "knowledge_graph": {"raw_documents", "vector_table"},
    }
    partitioned = {n["assetKey"]["path"][0] for n in nodes if n["isPartitioned"]}
    assert partitioned == set(graph) - {"hnsw_index"}
