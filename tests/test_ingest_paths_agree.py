"""`rag ingest` (the library) and the Dagster job run the same ingest engine: the same corpus,
ingested by each into its own database, leaves the same serving state, table by table; also after
a JSONL record disappears from its file (both paths delete that record's document). Each path
parses each file once per run."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import psycopg
import pytest
from dagster import instance_for_test, materialize

warnings.filterwarnings("ignore", category=Warning, module="dagster")

from testkit import create_database  # noqa: E402

from pipelines.assets import ASSETS  # noqa: E402
from pipelines.graph_assets import GRAPH_ASSETS  # noqa: E402
from pipelines.partitions import CORPUS_FILES, PartitionMap, range_tags  # noqa: E402
from pipelines.resources import RagResource, preload_provider  # noqa: E402
import rag_lib.documents  # noqa: E402
import rag_lib.graph.extract  # noqa: E402
from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.ingest.run import source_files  # noqa: E402
from rag_lib.ingest.stages import Preparer  # noqa: E402

pytestmark = pytest.mark.slow

RELS = [
    "tradegent/fixtures/sample_trade.yaml",
    "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml",
    "tradegent/knowledge/learnings/biases/loss-aversion-pre-earnings.yaml",
    "tradegent/templates/watchlist.yaml",  # a template: skipped with its reason
    "tradegent-docs/docs/operations",  # markdown
]
RECORDS = [
    {"_id": "r1", "title": "NVDA supply", "text": "NVDA guided data-center revenue above consensus on Blackwell supply."},
    {"_id": "r2", "title": "AMD margins", "text": "AMD gross margin expansion depends on the MI300 ramp and pricing."},
    {"_id": "r3", "title": "Rates", "text": "Falling ten-year yields lifted long-duration growth stocks this week."},
]
# Columns that say when or in which run a row was written, not what it holds.
VOLATILE = {"ingested_at", "created_at", "updated_at", "activated_at", "retired_at", "skipped_at", "id", "run_id",
            "tsv", "tsv_simple", "embedding"}
TABLES = ["rag_documents", "rag_sections", "rag_chunks", "rag_graph_nodes", "rag_graph_edges", "rag_graph_aliases",
          "rag_skipped"]


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def table_rows(url: str) -> dict[str, list[tuple]]:
    """Each table's rows (sorted, volatile columns left out) and each chunk's vector."""
    out: dict[str, list[tuple]] = {}
    with psycopg.connect(url) as conn:
        for table in TABLES:
            cols = [r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
                (table,)) if r[0] not in VOLATILE and not r[0].endswith("_at")]
            query = f"SELECT {', '.join(f'{c}::text' for c in cols)} FROM {table}"  # noqa: S608 - names from the catalog
            out[table] = sorted(tuple(r) for r in conn.execute(query))
        out["vectors"] = [(cid, space, np.array(json.loads(vec), dtype=np.float32)) for cid, space, vec in conn.execute(
            "SELECT chunk_id, space, embedding::text FROM rag_chunk_vectors ORDER BY space, chunk_id")]
    return out


def assert_same_state(lib: dict, dag: dict) -> None:
    for table in TABLES:
        assert lib[table] == dag[table], f"{table} differs: only library {set(lib[table]) - set(dag[table])}, " \
                                         f"only Dagster {set(dag[table]) - set(lib[table])}"
    assert [v[:2] for v in lib["vectors"]] == [v[:2] for v in dag["vectors"]]
    for (cid, _, a), (_, _, b) in zip(lib["vectors"], dag["vectors"]):
        assert np.allclose(a, b, atol=1e-5), cid  # encoded in batches of other sizes: float noise only


def count_parses(monkeypatch) -> list[int]:
    """Every YAML parse (documents and front matter; the graph's re-read of a body) is counted."""
    calls = [0]
    real = rag_lib.documents.parse_yaml

    def counted(text: str):
        calls[0] += 1
        return real(text)

    real_noting = rag_lib.documents.parse_yaml_noting  # the loader's (it notes keys given twice)

    def counted_noting(text: str, first_line: int = 1):
        calls[0] += 1
        return real_noting(text, first_line)

    monkeypatch.setattr(rag_lib.documents, "parse_yaml", counted)
    monkeypatch.setattr(rag_lib.documents, "parse_yaml_noting", counted_noting)
    monkeypatch.setattr(rag_lib.graph.extract, "parse_yaml", counted)
    return calls


@pytest.mark.timeout(900)
def test_rag_ingest_and_the_dagster_job_leave_the_same_tables(corpus_copy, pg_server, migrated_template, provider,
                                                              tmp_path: Path, monkeypatch):
    root = corpus_copy(*RELS)
    write_jsonl(root / "notes.jsonl", RECORDS)
    lib_url = create_database(pg_server, template=migrated_template)
    dag_url = create_database(pg_server, template=migrated_template)
    lib_settings = Settings(database_url=lib_url, home=tmp_path / "lib")
    dag_settings = Settings(database_url=dag_url, home=tmp_path / "dag")
    preload_provider(dag_settings, provider)
    with KnowledgeBase(dag_settings, provider=provider) as kb:
        kb.add_root(root)
    rag = RagResource(database_url=dag_url, home=str(tmp_path / "dag"))
    parses = count_parses(monkeypatch)
    preparer = Preparer.offline(lib_settings)
    for source in source_files([root], "default"):
        preparer.load(source)
    once = parses[0]  # what reading every file once costs
    assert once >= 3

    def ingest_both() -> tuple[dict, dict]:
        parses[0] = 0
        with KnowledgeBase(lib_settings, provider=provider) as kb:
            report = kb.ingest([root])
            assert report.count("failed") == 0, report.to_dict()
        lib_parses, parses[0] = parses[0], 0
        with KnowledgeBase(dag_settings, provider=provider) as kb, instance_for_test() as instance:
            keys = list(PartitionMap(kb.roots()).files())
            instance.add_dynamic_partitions(CORPUS_FILES, keys)
            result = materialize(ASSETS + GRAPH_ASSETS, instance=instance, resources={"rag": rag},
                                 tags=range_tags(keys[0], keys[-1]))
            assert result.success
        return table_rows(lib_url), table_rows(dag_url), lib_parses, parses[0]

    lib, dag, lib_parses, dag_parses = ingest_both()
    assert lib_parses == dag_parses == once  # each file read and parsed once per run, by either path
    paths = {r[1] for r in lib["rag_documents"]}
    assert {"notes.jsonl#r1", "notes.jsonl#r2", "notes.jsonl#r3", RELS[0]} <= paths
    assert len(lib["rag_chunks"]) > 20 and lib["rag_graph_edges"] and lib["vectors"]
    assert_same_state(lib, dag)

    write_jsonl(root / "notes.jsonl", [RECORDS[0], RECORDS[2]])  # r2 disappears from its file
    lib, dag, lib_parses, dag_parses = ingest_both()
    assert lib_parses == dag_parses == 0  # only the JSONL file changed: no YAML file is parsed again
    paths = {r[1] for r in lib["rag_documents"]}
    assert "notes.jsonl#r2" not in paths and {"notes.jsonl#r1", "notes.jsonl#r3"} <= paths
    assert_same_state(lib, dag)
