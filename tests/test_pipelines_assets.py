"""The six assets materialized through Dagster on copies of shared corpus files: per-file
partitions in one run, skipped inputs, per-file failures, and the Postgres-backed instance."""

from __future__ import annotations

import json
import os
import threading
import uuid
import warnings
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterEventType, instance_for_test, materialize

warnings.filterwarnings("ignore", category=Warning, module="dagster")

from pipelines.assets import ASSETS, raw_documents  # noqa: E402
from pipelines.checks import CHECKS  # noqa: E402
from pipelines.partitions import CORPUS_FILES, range_tags  # noqa: E402
from pipelines.resources import RagResource, preload_provider  # noqa: E402
from rag_lib import quality  # noqa: E402
from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.embedding.local import LocalProvider  # noqa: E402
from rag_lib.errors import NotFoundError  # noqa: E402
from rag_lib.ingest import run as ingest_run  # noqa: E402
from rag_lib.ingest.state import StageRunner  # noqa: E402
from rag_lib.models import CorpusRoot  # noqa: E402
from rag_lib.store.stages import SERVING_TABLES  # noqa: E402
from pipelines.partitions import PartitionMap  # noqa: E402

# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls),
# except in the tests of runs that embed.
pytestmark = [pytest.mark.slow, pytest.mark.warm_cache]

RELS = [
    "tradegent/fixtures/sample_trade.yaml",
    "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml",
    "tradegent/templates/watchlist.yaml",  # a template: skipped with a reason
]
FILES = [f"corpus/{rel}" for rel in RELS]  # partition keys: <root name>/<path under the root>


@pytest.fixture
def rag_factory(database_url, provider, tmp_path):
    home = tmp_path / ".rag"

    def make(root: Path, **kw) -> RagResource:
        settings = Settings(database_url=database_url, home=home)
        preload_provider(settings, provider)
        with KnowledgeBase(settings, provider=provider) as kb:
            kb.add_root(root)  # roots are registry state, not run config
        return RagResource(database_url=database_url, home=str(home), **kw)

    return make


def _kb(url: str, tmp_path: Path, provider) -> KnowledgeBase:
    return KnowledgeBase(Settings(database_url=url, home=tmp_path / ".rag"), provider=provider)


def _register(instance, root: Path) -> list[str]:
    keys = list(PartitionMap([CorpusRoot(root.resolve(), "default", root.name)]).files())
    instance.add_dynamic_partitions(CORPUS_FILES, keys)
    return keys


def _statuses(result, asset: str) -> dict[str, str]:
    out = {}
    for ev in result.get_asset_materialization_events():
        mat = ev.step_materialization_data.materialization
        if mat.asset_key.to_user_string() == asset:
            out[ev.partition] = mat.metadata["status"].value
    return out


@pytest.mark.warm_cache(False)  # asserts the run's model calls
def test_full_graph_materializes_all_files_in_one_run(corpus_copy, rag_factory, database_url, provider, tmp_path):
    root = corpus_copy(*RELS)
    (root / "broken.yaml").write_text("title: [unclosed\n")
    (root / "undated.md").write_text("---\ndate: last tuesday\n---\n# Undated note\n\n## Body\nA note.\n")
    with instance_for_test() as instance:
        keys = _register(instance, root)
        result = materialize(ASSETS + CHECKS, instance=instance, resources={"rag": rag_factory(root)},
                             tags=range_tags(keys[0], keys[-1]))
        assert result.success
        assert len(instance.get_runs()) == 1  # every partition in a single run
        raw = _statuses(result, "raw_documents")
        assert raw == {"corpus/broken.yaml": "skipped", "corpus/undated.md": "ok", FILES[0]: "ok", FILES[1]: "ok",
                       FILES[2]: "skipped"}
        assert _statuses(result, "vector_table") == raw
        mats = {(ev.asset_key.to_user_string(), ev.partition): ev.step_materialization_data.materialization.metadata
                for ev in result.get_asset_materialization_events()}
        assert mats[("raw_documents", "corpus/broken.yaml")]["skip_reason"].value == "malformed_yaml"
        assert mats[("raw_documents", FILES[2])]["skip_reason"].value == "template"
        # ingested, without the date its front matter gives: the file's metadata says why
        assert "date 'last tuesday' is not a date" in mats[("raw_documents", "corpus/undated.md")]["warnings"].value
        assert "warnings" not in mats[("raw_documents", FILES[1])]
        chunk_meta = mats[("chunks", FILES[1])]
        assert chunk_meta["chunks"].value > 5 and "| tokens | chunks |" in chunk_meta["chunk_size_histogram"].value
        assert "| section | tokens | text |" in chunk_meta["preview"].value
        emb = mats[("embeddings", FILES[1])]
        assert emb["model"].value == "all-MiniLM-L6-v2" and emb["dimensions"].value == 384
        total_chunks = sum(mats[("chunks", f)]["chunks"].value for f in [*FILES[:2], "corpus/undated.md"])
        # chunks and distinct texts counted apart, as `rag ingest` counts them: the model was called
        assert emb["run_chunks"].value == total_chunks
        assert 0 < emb["run_texts_embedded"].value <= total_chunks - emb["run_chunks_from_cache"].value
        assert mats[("hnsw_index", None)]["valid"].value is True
        assert "rag_chunks" in mats[("hnsw_index", None)]["tables_analyzed"].value  # a first load: statistics
        checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
        assert set(checks) == {"embeddings_valid", "vector_table_orphans", "failed_files", "chunk_sizes",
                               "skipped_inputs", "metadata_warnings", "hnsw_recall", "retrieval_quality"}
        assert all(checks[n].passed for n in ("embeddings_valid", "vector_table_orphans", "failed_files", "chunk_sizes",
                                              "hnsw_recall", "retrieval_quality"))  # no eval set: passes unmeasured
        assert not checks["skipped_inputs"].passed and checks["skipped_inputs"].severity.value == "WARN"
        # undated.md's front matter date: a warning, listed with the file and the field
        meta_check = checks["metadata_warnings"]
        assert not meta_check.passed and meta_check.severity.value == "WARN"
        assert "undated.md" in meta_check.metadata["metadata_warnings"].value
        assert "date 'last tuesday' is not a date" in meta_check.metadata["metadata_warnings"].value

        # Second run: nothing changed, so every stage after raw_documents is a cheap no-op.
        again = materialize(ASSETS, instance=instance, resources={"rag": rag_factory(root)},
                            tags=range_tags(keys[0], keys[-1]))
        assert _statuses(again, "chunks")[FILES[1]] == "unchanged"
        # ...and an unchanged file keeps the content metadata of its last real run.
        again_mats = {(ev.asset_key.to_user_string(), ev.partition): ev.step_materialization_data.materialization.metadata
                      for ev in again.get_asset_materialization_events()}
        for asset in ("raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table"):
            assert again_mats[(asset, FILES[1])]["status"].value == "unchanged", asset
            mine = {"status", "rows_written"}  # what this materialization did
            first = {k: v for k, v in mats[(asset, FILES[1])].items() if k not in mine and not k.startswith("run_")}
            kept = {k: v for k, v in again_mats[(asset, FILES[1])].items() if k not in mine and not k.startswith("run_")}
            assert kept == first, asset
        assert again_mats[("vector_table", FILES[1])]["rows_written"].value == 0
        assert "| tokens | chunks |" in again_mats[("chunks", FILES[1])]["chunk_size_histogram"].value
        assert again_mats[("raw_documents", FILES[2])]["skip_reason"].value == "template"
        # Forced: every stage redone, every vector from the embedding cache; the chunks are the
        # ones the first run's chunk_sizes check validated, so no validation process is started.
        quality._stop_validator()
        forced = materialize(ASSETS, instance=instance, resources={"rag": rag_factory(root, force=True)},
                             tags=range_tags(keys[0], keys[-1]))
        forced_emb = {(e.asset_key.to_user_string(), e.partition): e.step_materialization_data.materialization.metadata
                      for e in forced.get_asset_materialization_events()}[("embeddings", FILES[1])]
        assert forced_emb["status"].value == "ok"
        assert forced_emb["run_texts_embedded"].value == 0
        assert forced_emb["run_chunks_from_cache"].value == forced_emb["run_chunks"].value == total_chunks
        assert quality._validator is None
    with _kb(database_url, tmp_path, provider) as kb:
        doc = kb.show(RELS[1])
        assert doc["source_path"] == str((root / RELS[1]).resolve())
        assert len(doc["chunks"]) == mats[("chunks", FILES[1])]["chunks"].value


def test_vector_table_tells_the_rows_a_run_wrote_from_the_rows_a_file_serves(corpus_copy, rag_factory, database_url,
                                                                            provider, tmp_path):
    """`rows_written`: the chunk rows this materialization published (a JSONL file's unchanged
    records and an unchanged file: none); `rows_stored`: the file's chunk rows serving after it."""
    root = tmp_path / "notes"
    root.mkdir()
    records = [{"_id": f"r{i}", "title": f"Note {i}", "text": f"Desk note {i} on rates, credit spreads and the curve."}
               for i in range(3)]

    def write(rows):
        (root / "notes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def vector_table_metadata(resource, instance, key):
        result = materialize(ASSETS, instance=instance, resources={"rag": resource}, tags=range_tags(key, key))
        (meta,) = [e.step_materialization_data.materialization.metadata for e in result.get_asset_materialization_events()
                   if e.asset_key.to_user_string() == "vector_table"]
        return {k: meta[k].value for k in ("status", "rows_written", "rows_stored")}

    write(records)
    resource = rag_factory(root)
    with instance_for_test() as instance, _kb(database_url, tmp_path, provider) as kb:
        (key,) = _register(instance, root)

        def serving() -> int:  # the file's chunk rows in the serving table
            return sum(len(kb.show(d["path"], collection="default")["chunks"]) for d in kb.list_documents())

        first = vector_table_metadata(resource, instance, key)
        assert first == {"status": "ok", "rows_written": serving(), "rows_stored": serving()} and serving() >= 3
        write(records[:2] + [{**records[2], "text": "Desk note 2, revised: the curve steepened after the auction."}])
        one_changed = vector_table_metadata(resource, instance, key)
        assert one_changed["status"] == "ok" and one_changed["rows_stored"] == serving()
        assert 0 < one_changed["rows_written"] < one_changed["rows_stored"]  # one record of three
        assert vector_table_metadata(resource, instance, key) == {"status": "unchanged", "rows_written": 0,
                                                                  "rows_stored": serving()}


def test_failing_file_fails_only_its_partition(corpus_copy, rag_factory, database_url, provider, tmp_path):
    root = corpus_copy(*RELS[:2])
    with instance_for_test() as instance:
        keys = _register(instance, root)
        rag = rag_factory(root)
        tags = range_tags(keys[0], keys[-1])
        assert materialize([raw_documents], instance=instance, resources={"rag": rag}, tags=tags).success
        # The file changes after raw_documents: its later stages must refuse it, the other file goes on.
        with open(root / RELS[0], "a") as fh:
            fh.write("\nextra_note: changed underneath the run\n")
        rest = [a for a in ASSETS if a.key.to_user_string() != "raw_documents"]
        from pipelines.checks import failed_files

        result = materialize([*rest, failed_files], instance=instance, resources={"rag": rag}, tags=tags,
                             selection=[a.key for a in rest])
        assert result.success  # a many-file run carries on
        assert _statuses(result, "flattened_sections") == {FILES[0]: "failed", FILES[1]: "ok"}
        assert _statuses(result, "vector_table") == {FILES[0]: "upstream_failed", FILES[1]: "ok"}
        # ... and says so where an operator looks: the failed_files check fails, naming the file and the fix
        check = next(c for c in result.get_asset_check_evaluations() if c.check_name == "failed_files")
        assert not check.passed and check.severity.value == "ERROR"
        assert RELS[0] in check.description and f"`rag materialize {root.resolve()}`" in check.description
        assert check.metadata["failed_files"].value == 1  # one label, always a count: Dagster plots it
        assert "changed after raw_documents" in check.metadata["failures"].value
        with _kb(database_url, tmp_path, provider) as kb:
            failures = kb.status()["failures"]
            assert any(f["partition"] == FILES[0] and "changed after raw_documents" in f["message"] for f in failures)
        # A single-file run raises, so Dagster marks exactly that partition failed.
        single = materialize(rest, instance=instance, resources={"rag": rag}, partition_key=FILES[0],
                             selection=[a.key for a in rest], raise_on_error=False)
        assert not single.success


def test_a_file_that_crashes_its_stage_fails_alone(corpus_copy, rag_factory, database_url, provider, tmp_path):
    """A YAML file nested 5,000 levels deep among good files: a many-file run succeeds, the good
    files are published and searchable, the bad one is failed (or skipped) with a reason."""
    root = corpus_copy(*RELS[:2])
    deep = root / "tradegent/knowledge/aaa-deep.yaml"  # generated here, never committed
    deep.write_text("_meta:\n  type: learning\n  id: deep\nsummary: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n")
    with instance_for_test() as instance:
        keys = _register(instance, root)
        result = materialize(ASSETS, instance=instance, resources={"rag": rag_factory(root)},
                             tags=range_tags(keys[0], keys[-1]))
        assert result.success
        raw = _statuses(result, "raw_documents")
        bad = "corpus/tradegent/knowledge/aaa-deep.yaml"
        assert raw[bad] in ("failed", "skipped") and raw[FILES[0]] == raw[FILES[1]] == "ok"
        meta = {ev.partition: ev.step_materialization_data.materialization.metadata
                for ev in result.get_asset_materialization_events()
                if ev.step_materialization_data.materialization.asset_key.to_user_string() == "raw_documents"}[bad]
        assert (meta.get("error") or meta.get("skip_reason")).value
        assert _statuses(result, "vector_table") == {bad: "upstream_failed" if raw[bad] == "failed" else "skipped",
                                                      FILES[0]: "ok", FILES[1]: "ok"}
    with _kb(database_url, tmp_path, provider) as kb:
        assert any(h.path == RELS[1] for h in kb.search("NVDA earnings", top_k=5).hits)
        if raw[bad] == "failed":
            assert any(f["partition"] == bad and "RecursionError" in f["message"] for f in kb.status()["failures"])


def test_a_run_publishes_its_first_files_while_it_encodes_the_last(corpus_copy, rag_factory, database_url, provider,
                                                                   tmp_path, monkeypatch):
    """One run's stages overlap across its files as `rag ingest`'s do (the library's rounds, one
    file each here): the last file is embedded only once the first is published. Run one stage
    after the other over every file, the embedding would wait for that in vain. Every asset still
    reports every file, and the files are published and searchable."""
    monkeypatch.setattr(ingest_run, "FILES_PER_ROUND", 1)
    root = corpus_copy(*RELS[:2])
    first_published = threading.Event()
    waited: list[bool] = []
    publish, embed = StageRunner.vector_table, StageRunner.embeddings

    def vector_table(self, targets):
        done = publish(self, targets)
        first_published.set()
        return done

    def embeddings(self, targets):
        if [t.key for t in targets] == [FILES[1]]:
            waited.append(first_published.wait(timeout=60))
        return embed(self, targets)

    monkeypatch.setattr(StageRunner, "vector_table", vector_table)
    monkeypatch.setattr(StageRunner, "embeddings", embeddings)
    with instance_for_test() as instance:
        keys = _register(instance, root)
        assert keys == FILES[:2]
        result = materialize(ASSETS + CHECKS, instance=instance, resources={"rag": rag_factory(root)},
                             tags=range_tags(keys[0], keys[-1]))
    assert result.success and waited == [True]
    for asset in ("raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table"):
        assert _statuses(result, asset) == {FILES[0]: "ok", FILES[1]: "ok"}, asset
    assert all(c.passed for c in result.get_asset_check_evaluations() if c.check_name != "skipped_inputs")
    assert "metadata_warnings" in {c.check_name for c in result.get_asset_check_evaluations()}
    with _kb(database_url, tmp_path, provider) as kb:
        assert any(h.path == RELS[1] for h in kb.search("NVDA earnings", top_k=5).hits)


def test_the_first_stages_report_every_file_while_the_last_is_still_encoding(corpus_copy, rag_factory, monkeypatch):
    """The steps of the stages before embedding (raw_documents, flattened_sections, chunks) write
    their files' events (what each file's partition shows) as soon as their stage is done for
    every file, while the encoder still works on the last file; not all after it. Every asset
    still reports every file, and the checks see the run's final data."""
    monkeypatch.setattr(ingest_run, "FILES_PER_ROUND", 1)
    root = corpus_copy(*RELS[:2])
    chunks_reported = threading.Event()
    waited: list[bool] = []
    embed = StageRunner.embeddings

    def embeddings(self, targets):
        if [t.key for t in targets] == [FILES[1]]:  # the last file's encoding waits for the chunks step's end
            waited.append(chunks_reported.wait(timeout=30))
        return embed(self, targets)

    monkeypatch.setattr(StageRunner, "embeddings", embeddings)
    with instance_for_test() as instance:
        keys = _register(instance, root)
        store_event = instance.event_log_storage.store_event

        def stored(event):
            store_event(event)
            if event.dagster_event_type == DagsterEventType.STEP_SUCCESS and event.step_key == "chunks":
                chunks_reported.set()

        monkeypatch.setattr(instance.event_log_storage, "store_event", stored)
        result = materialize(ASSETS + CHECKS, instance=instance, resources={"rag": rag_factory(root)},
                             tags=range_tags(keys[0], keys[-1]))
    assert result.success and waited == [True]
    for asset in ("raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table"):
        assert _statuses(result, asset) == {FILES[0]: "ok", FILES[1]: "ok"}, asset
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    chunks = sum(e.step_materialization_data.materialization.metadata["chunks"].value
                 for e in result.get_asset_materialization_events()
                 if e.step_materialization_data.materialization.asset_key.to_user_string() == "chunks")
    assert checks["vector_table_orphans"].passed and checks["vector_table_orphans"].metadata["chunks"].value == chunks


@pytest.mark.warm_cache(False)  # a cold run: it encodes
@pytest.mark.skipif(not quality.can_validate_at_idle_priority(), reason="needs SCHED_IDLE and leave to undo it")
def test_a_cold_run_imports_the_chunk_suite_at_idle_priority_while_it_encodes(corpus_copy, rag_factory, monkeypatch):
    """A run that encodes new chunks starts the chunk_sizes check's validation process with the
    run, at idle priority (its seconds of importing Great Expectations take only CPU the encoding
    leaves), and puts it back to normal priority for the validation, whose results the check
    reports as before."""
    quality._stop_validator()  # an earlier test's process would hide when this run starts one
    root = corpus_copy(*RELS[:2])
    seen: list[tuple[bool, int | None]] = []
    embed = StageRunner.embeddings

    def embeddings(self, targets):
        pool = quality._validator
        workers = list(pool._processes.values()) if pool is not None else []
        seen.append((pool is not None, os.sched_getscheduler(workers[0].pid) if workers else None))
        return embed(self, targets)

    monkeypatch.setattr(StageRunner, "embeddings", embeddings)
    with instance_for_test() as instance:
        keys = _register(instance, root)
        result = materialize(ASSETS + CHECKS, instance=instance, resources={"rag": rag_factory(root)},
                             tags=range_tags(keys[0], keys[-1]))
    assert result.success
    assert seen and all(s == (True, os.SCHED_IDLE) for s in seen), seen  # while it encoded
    (worker,) = quality._validator._processes.values()
    assert os.sched_getscheduler(worker.pid) == os.SCHED_OTHER  # validated at normal priority
    check = next(c for c in result.get_asset_check_evaluations() if c.check_name == "chunk_sizes")
    assert check.passed and check.metadata["expectations_failed"].value == 0
    assert "expect_column_values_to_be_unique | chunk_id | True" in check.metadata["expectations"].value
    assert check.metadata["chunks"].value == sum(
        e.step_materialization_data.materialization.metadata["chunks"].value
        for e in result.get_asset_materialization_events()
        if e.step_materialization_data.materialization.asset_key.to_user_string() == "chunks")
    quality._stop_validator()


def test_a_step_per_pod_run_runs_each_stage_in_its_own_step(corpus_copy, rag_factory, monkeypatch):
    """The k8s variants (tag `rag/executor: k8s`) run each step in its own pod, sized for its
    stage: there no step runs the later stages ahead, so the encoding stays in the embeddings step
    (all the run's files in one call)."""
    from pipelines.k8s import EXECUTOR_TAG

    monkeypatch.setattr(ingest_run, "FILES_PER_ROUND", 1)
    root = corpus_copy(*RELS[:2])
    calls: list[list[str]] = []
    embed = StageRunner.embeddings

    def embeddings(self, targets):
        calls.append([t.key for t in targets])
        return embed(self, targets)

    monkeypatch.setattr(StageRunner, "embeddings", embeddings)
    with instance_for_test() as instance:
        keys = _register(instance, root)
        result = materialize(ASSETS, instance=instance, resources={"rag": rag_factory(root)},
                             tags={**range_tags(keys[0], keys[-1]), **EXECUTOR_TAG})
    assert result.success and calls == [FILES[:2]]
    assert _statuses(result, "vector_table") == {FILES[0]: "ok", FILES[1]: "ok"}


class _RecordingProvider(LocalProvider):
    """The real model; records which thread asked for it to be loaded ahead of embedding, and
    whether the validation process (Great Expectations) was already starting by then."""

    prepared_on: str | None = None
    validator_started_first: bool | None = None

    def prepare(self) -> None:
        self.prepared_on = threading.current_thread().name
        self.validator_started_first = quality._validator is not None
        super().prepare()


@pytest.mark.warm_cache(False)  # asserts the run's model calls
def test_a_run_that_embeds_loads_the_model_while_its_first_stages_run(corpus_copy, database_url, tmp_path):
    """The model (seconds to load) loads on a thread of its own once raw_documents finds files with
    new content, only in runs that embed; never for a raw_documents-only run or unchanged files.
    The validation process (seconds of importing Great Expectations) starts with a run that
    encodes new chunks at idle priority where that can be undone for the validation (taking only
    CPU the encoding leaves), else once the run's stages, which encode beside chunking, are done
    (beside the index and checks' steps, not beside the encoding), for a run with the chunk_sizes
    check, and not at all for a raw_documents-only run."""
    quality._stop_validator()  # an earlier test's process would hide when this run starts one
    root = corpus_copy(*RELS[:2])
    settings = Settings(database_url=database_url, home=tmp_path / ".rag")
    fresh = _RecordingProvider("all-MiniLM-L6-v2", 384)
    preload_provider(settings, fresh)
    with KnowledgeBase(settings, provider=fresh) as kb:
        kb.add_root(root)
    rag = RagResource(database_url=database_url, home=str(tmp_path / ".rag"))
    with instance_for_test() as instance:
        keys = _register(instance, root)
        tags = range_tags(keys[0], keys[-1])
        assert materialize([raw_documents], instance=instance, resources={"rag": rag}, partition_key=keys[0]).success
        assert fresh.prepared_on is None and "_model" not in fresh.__dict__
        assert quality._validator is None
        # keys[0] is unchanged now, keys[1] is new: its chunks need the model
        result = materialize(ASSETS + CHECKS, instance=instance, resources={"rag": rag}, tags=tags)
        assert result.success and _statuses(result, "raw_documents") == {keys[0]: "unchanged", keys[1]: "ok"}
        assert fresh.prepared_on == "rag-prepare"
        assert fresh.validator_started_first is quality.can_validate_at_idle_priority()
        assert quality._validator is not None  # for the chunk_sizes check
        assert _statuses(result, "vector_table") == {keys[0]: "ok", keys[1]: "ok"}
        fresh.prepared_on = None
        again = materialize(ASSETS, instance=instance, resources={"rag": rag}, tags=tags)
        assert again.success and set(_statuses(again, "raw_documents").values()) == {"unchanged"}
        assert fresh.prepared_on is None  # nothing new: nothing to load


def test_the_index_and_checks_run_while_the_stage_steps_report(corpus_copy, rag_factory, monkeypatch):
    """Once a run's stages are done (in its first step), the HNSW index is built (then its recall
    measured) on one thread of the run while the files' graph is reported (then the orphan and
    graph checks computed) on another, and the chunk-size check on a third, while the later stage
    steps write each file's events; the hnsw_index and knowledge_graph steps and the checks report
    those results, on the run's final data. A run without the
    chunk_sizes check starts no validation process (seconds of importing Great Expectations) for
    its new chunks."""
    from pipelines import graph_assets
    from pipelines.graph_checks import GRAPH_CHECKS
    from rag_lib.graph import checks as graph_checks
    from rag_lib.ingest.stages import Publisher

    threads: dict[str, str] = {}

    def on_thread(name, real):
        def call(*args, **kwargs):
            threads[name] = threading.current_thread().name
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(Publisher, "ensure_index", on_thread("index", Publisher.ensure_index))
    for check in ("check_hnsw", "check_vector_table", "check_chunks"):
        monkeypatch.setattr(quality, check, on_thread(check, getattr(quality, check)))
    monkeypatch.setattr(graph_assets, "graph_outcomes", on_thread("graph", graph_assets.graph_outcomes))
    for name, check in graph_checks.GRAPH_CHECKS.items():
        monkeypatch.setitem(graph_checks.GRAPH_CHECKS, name, on_thread(f"graph_{name}", check))
    quality._stop_validator()
    root = corpus_copy(*RELS[:2])
    with instance_for_test() as instance:
        keys = _register(instance, root)
        tags = range_tags(keys[0], keys[-1])
        assert materialize(ASSETS, instance=instance, resources={"rag": rag_factory(root)}, tags=tags).success
        assert quality._validator is None  # new chunks, but no chunk_sizes check in this run
        assert threads == {"index": "rag-after-index_0"}
        threads.clear()
        (root / RELS[1]).write_text((root / RELS[1]).read_text() + "\nnotes: one more section for a new chunk\n")
        result = materialize(ASSETS + graph_assets.GRAPH_ASSETS + CHECKS + GRAPH_CHECKS, instance=instance,
                             resources={"rag": rag_factory(root)}, tags=tags)
    assert result.success
    # the graph's lane beside the index build's, not behind it
    assert threads == {"index": "rag-after-index_0", "graph": "rag-after-graph_0", "check_hnsw": "rag-after-index_0",
                       "check_vector_table": "rag-after-graph_0", "check_chunks": "rag-after-chunks_0",
                       **{f"graph_{name}": "rag-after-graph_0" for name in graph_checks.GRAPH_CHECKS}}
    assert _statuses(result, "knowledge_graph") == {keys[0]: "ok", keys[1]: "ok"}  # its first report
    assert quality._validator is not None  # the changed frame was validated beside the run
    mats = {(e.asset_key.to_user_string(), e.partition): e.step_materialization_data.materialization.metadata
            for e in result.get_asset_materialization_events()}
    assert mats[("hnsw_index", None)]["valid"].value is True and mats[("hnsw_index", None)]["rows"].value >= mats[("hnsw_index", None)]["rows_at_last_build"].value > 0
    assert mats[("knowledge_graph", keys[1])]["nodes"].value > 0
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert all(checks[n].passed for n in ("hnsw_recall", "vector_table_orphans", "chunk_sizes")), checks
    assert checks["graph_orphan_nodes"].passed and checks["graph_stale_edges"].passed
    assert checks["graph_counts"].metadata["nodes"].value > 0  # the graph the run's stages wrote
    chunks = sum(mats[("chunks", k)]["chunks"].value for k in keys)
    assert checks["chunk_sizes"].metadata["chunks"].value == chunks  # the frame after this run's stages
    assert checks["vector_table_orphans"].metadata["chunks"].value == chunks


def test_only_a_process_that_ends_with_its_runs_freezes_its_heap(corpus_copy, rag_factory, monkeypatch):
    """`rag materialize` and a code server's run worker exit after their runs: the objects alive as
    a run starts (Dagster, the code location: hundreds of thousands) are left out of the garbage
    collector's passes for good (seconds of a run's CPU). A process that goes on (these tests, an
    application calling the job) keeps collecting them, or each run would keep its reference
    cycles for the process's life."""
    import gc

    from pipelines import gc_policy

    root = corpus_copy(*RELS[:2])
    frozen = gc.get_freeze_count()
    try:
        with instance_for_test() as instance:
            keys = _register(instance, root)
            tags = range_tags(keys[0], keys[-1])
            assert materialize(ASSETS, instance=instance, resources={"rag": rag_factory(root)}, tags=tags).success
            assert gc.get_freeze_count() == frozen and gc.isenabled()
            monkeypatch.setitem(gc_policy._ONE_SHOT, "process", True)  # what `rag materialize` marks
            assert materialize(ASSETS, instance=instance, resources={"rag": rag_factory(root, force=True)},
                               tags=tags).success
            assert gc.get_freeze_count() > frozen and gc.isenabled()
    finally:
        gc.unfreeze()


def test_postgres_backed_instance(corpus_copy, pg_server, database_url, provider, tmp_path, monkeypatch):
    from dagster_postgres import PostgresRunStorage

    from pipelines.instance import get_instance, sqlalchemy_url
    from pipelines.launch import materialize_corpus

    name = "dagster_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    monkeypatch.setenv("DAGSTER_PG_URL", sqlalchemy_url(pg_server, name))
    assert sqlalchemy_url(pg_server, name).startswith("postgresql+psycopg2://")
    root = corpus_copy(*RELS[:2])
    settings = Settings(database_url=database_url, home=tmp_path / ".rag")
    preload_provider(settings, provider)
    instance = get_instance(settings, home=tmp_path / "dagster_home")
    try:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        summary = materialize_corpus(instance, [CorpusRoot(root, "default")], database_url=database_url,
                                     home=str(tmp_path / ".rag"))
        assert summary.success and len(summary.run_ids) == 1 and summary.partitions == 2
        assert summary.stages["vector_table"] == {"ok": 2}
        assert {c.name for c in summary.checks if c.passed} >= {"embeddings_valid", "vector_table_orphans", "hnsw_recall"}
        run = instance.get_run_by_id(summary.run_ids[0])
        assert run.is_success and run.tags["dagster/asset_partition_range_start"] == FILES[0]
        assert set(instance.get_dynamic_partitions(CORPUS_FILES)) == set(FILES[:2])
        # The file disappears: the next materialize removes its rows and its partition.
        (root / RELS[0]).unlink()
        summary = materialize_corpus(instance, [CorpusRoot(root, "default")], database_url=database_url,
                                     home=str(tmp_path / ".rag"))
        assert summary.removed == [FILES[0]] and summary.success
        assert instance.get_dynamic_partitions(CORPUS_FILES) == [FILES[1]]
    finally:
        instance.dispose()
    with _kb(database_url, tmp_path, provider) as kb, pytest.raises(NotFoundError):
        kb.show(RELS[0])


def test_index_maintenance_job_reindexes_the_active_space(corpus_copy, rag_factory, database_url, provider, tmp_path):
    """The weekly maintenance job REINDEXes the active space's HNSW index and ANALYZEs the serving
    tables (it works on the store directly, with no KnowledgeBase forward in between)."""
    from pipelines.jobs import index_maintenance_job
    from rag_lib.store.vectors import index_name

    root = corpus_copy(RELS[1])
    rag = rag_factory(root)
    with KnowledgeBase(Settings(database_url=database_url, home=tmp_path / ".rag"), provider=provider) as kb:
        kb.ingest([root])
        space = kb.store.active_space()["space"]
    result = index_maintenance_job.execute_in_process(resources={"rag": rag})
    done = result.output_for_node("maintain_indexes")
    assert done["reindexed"] == index_name(space)
    assert done["analyzed"] == sorted([*SERVING_TABLES, "rag_embedding_cache"])
