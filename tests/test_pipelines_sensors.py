"""Corpus sensor (new / changed / deleted files, many changes → one run), partition keys, the
run-failure sensor and the schedules, evaluated against a real Postgres-backed instance and
database, with the corpus roots read from the registry (no run config)."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import warnings

import pytest
from dagster import (
    AddDynamicPartitionsRequest,
    DagsterEvent,
    DagsterEventType,
    DagsterRunStatus,
    DeleteDynamicPartitionsRequest,
    SkipReason,
    build_run_status_sensor_context,
    build_schedule_context,
    build_sensor_context,
)

warnings.filterwarnings("ignore", category=Warning, module="dagster")

from testkit import RotatedProvider, exited_pid, sensor_tick, started_run  # noqa: E402

from pipelines import dagster_private  # noqa: E402
from pipelines.definitions import defs  # noqa: E402
from pipelines.launch import LOCATION, location_in_process  # noqa: E402
from pipelines.partitions import (  # noqa: E402
    ASSET_JOB,
    CORPUS_FILES,
    MERGE_GAP,
    RANGE_END_TAG,
    RANGE_START_TAG,
    PartitionMap,
    decode_key,
    encode_key,
    plan_ranges,
    range_tags,
    sync_partitions,
)
from pipelines.resources import RagResource, preload_provider  # noqa: E402
from pipelines.schedules import nightly_reconcile, reembed_schedule  # noqa: E402
from pipelines.sensors import corpus_sensor, record_run_failures  # noqa: E402
from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.errors import NotFoundError  # noqa: E402
from rag_lib.models import CorpusRoot  # noqa: E402

RELS = ["tradegent/fixtures/sample_trade.yaml", "tradegent/fixtures/sample_research.yaml"]
FILES = [f"corpus/{rel}" for rel in RELS]  # partition keys: <root name>/<path under the root>
# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


@pytest.fixture
def env(corpus_copy, database_url, provider, tmp_path, pg_instance):
    root = corpus_copy(*RELS)
    home = tmp_path / ".rag"
    preload_provider(Settings(database_url=database_url, home=home), provider)
    rag = RagResource(database_url=database_url, home=str(home))  # roots come from the registry
    kb = KnowledgeBase(Settings(database_url=database_url, home=home), provider=provider)
    assert kb.add_root(root).name == "corpus"
    yield root, rag, kb, pg_instance
    kb.close()




def launch(instance, rag, run_request):
    job = defs.resolve_job_def("ingest_files")
    selection = run_request.asset_selection
    if run_request.asset_check_keys is not None:  # as the daemon submits it: these assets and checks only
        job, selection = job.get_subset(asset_selection=set(selection or ()),
                                        asset_check_selection=set(run_request.asset_check_keys)), None
    config = {"database_url": rag.database_url, "home": rag.home}
    return job.execute_in_process(instance=instance, tags=run_request.tags, asset_selection=selection,
                                  run_config={"resources": {"rag": {"config": config}},
                                              "loggers": {"console": {"config": {"log_level": "WARNING"}}}},
                                  raise_on_error=False)


def shown(instance, rag, cursor) -> str | None:
    """The text the UI shows for a corpus sensor tick that launched nothing (Dagster's evaluation)."""
    with build_sensor_context(instance=instance, cursor=cursor, resources={"rag": rag}) as context:
        return corpus_sensor.evaluate_tick(context).skip_message


def test_keys_round_trip_and_ranges():
    for raw in ("a/b.yaml", "odd...name.yaml", "x|y.md", "100%.md", "a..b.yaml"):
        key = encode_key(raw)
        assert "..." not in key and "|" not in key and decode_key(key) == raw
    ordered = [f"k{i}" for i in range(20)]
    assert plan_ranges(["k1", "k2", "k3"], ordered) == [("k1", "k3")]
    assert plan_ranges(["k1", "k5"], ordered) == [("k1", "k5")]  # three current files cost less than a run
    assert plan_ranges([f"k{i}" for i in range(0, 20, 2)], ordered) == [("k0", "k18")]


def test_scattered_changes_run_alone_not_in_one_span_over_the_corpus():
    ordered = [f"f{i:05d}" for i in range(10_000)]
    scattered = ordered[::1000]  # 10 changed files spread over 10,000
    assert plan_ranges(scattered, ordered) == [(k, k) for k in scattered]
    # files within MERGE_GAP of each other share a run: the current ones between cost less than a run
    near = [ordered[100], ordered[100 + MERGE_GAP + 1], ordered[5000]]
    assert plan_ranges(near, ordered) == [(near[0], near[1]), (near[2], near[2])]
    assert plan_ranges(near[:1] + [ordered[100 + MERGE_GAP + 2]], ordered) == [(near[0], near[0]),
                                                                                (ordered[100 + MERGE_GAP + 2],) * 2]


def test_keys_name_their_root(tmp_path):
    a, b = tmp_path / "a" / "corpus", tmp_path / "b" / "corpus"
    pmap = PartitionMap([CorpusRoot(a, "default", "corpus"), CorpusRoot(b, "default", "corpus-2"),
                         CorpusRoot(a, "other", "corpus-3")])
    for root in pmap.roots:  # same relative path under three roots: three keys, each back to its root
        key = pmap.key(root, "x...y|z%.md")
        target = pmap.target(key)
        assert (target.root, target.collection, target.rel) == (root.path, root.collection, "x...y|z%.md")
        assert "..." not in key and "|" not in key
    with pytest.raises(Exception, match="no registered corpus root"):
        pmap.target("gone/x.md")


def test_a_file_the_scan_missed_but_is_there_keeps_its_documents(tmp_path, monkeypatch):
    """The sensor, the reconcile and `rag materialize` delete the rows of files a scan no longer
    lists; a file in a folder the scan could not read is still there and keeps them."""
    import pipelines.partitions as partitions

    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    for rel in ("a.md", "sub/b.md", "c.md"):
        (root / rel).write_text("# Note\n")
    pmap = PartitionMap([CorpusRoot(root, "default", "corpus")])
    keys = {rel: pmap.key(pmap.roots[0], rel) for rel in ("a.md", "sub/b.md", "c.md")}
    (root / "c.md").unlink()
    real = partitions.file_gone
    monkeypatch.setattr(partitions, "file_gone", lambda p: False if "/sub/" in str(p) else real(p))  # unreadable
    forgotten = []
    sync = sync_partitions(list(keys.values()), pmap, [keys["a.md"]], lambda t: forgotten.append(t.rel) or ["doc"])
    assert forgotten == ["c.md"] and sync.removed == [keys["c.md"]] and sync.delete == [keys["c.md"]]


def test_a_root_that_lists_no_files_keeps_its_documents_until_they_are_deleted_on_purpose(tmp_path, caplog):
    """An unmounted mount point is an empty folder: the sensor and `rag materialize` used to delete
    every document of such a root. A root that lists some of its files loses the others as before."""
    import logging

    empty, partial = tmp_path / "mnt", tmp_path / "desk"
    empty.mkdir()
    partial.mkdir()
    (partial / "a.md").write_text("# Note\n")
    pmap = PartitionMap([CorpusRoot(empty, "default", "mnt"), CorpusRoot(partial, "default", "desk")])
    gone = [pmap.key(pmap.roots[0], rel) for rel in ("x.md", "y.md")] + [pmap.key(pmap.roots[1], "b.md")]
    kept = pmap.key(pmap.roots[1], "a.md")
    for documents, forgotten_expected in ((2, ["b.md"]), (0, ["x.md", "y.md", "b.md"])):
        forgotten: list[str] = []
        with caplog.at_level(logging.WARNING):
            caplog.clear()
            sync = sync_partitions([*gone, kept], pmap, [kept], lambda t: forgotten.append(t.rel) or ["doc"],
                                   logging.getLogger("test"), holding=lambda root: documents if root.name == "mnt" else 1)
        assert forgotten == forgotten_expected
        assert sync.delete == [key for key, rel in zip(gone, ("x.md", "y.md", "b.md")) if rel in forgotten_expected]
        warned = [r.getMessage() for r in caplog.records if "lists no files" in r.getMessage()]
        if documents:  # one line: the root, how many documents are kept, why, and the command
            assert warned == [f"corpus root mnt: kept 2 document(s) of {empty} (collection 'default'): the folder "
                              "lists no files at all, as an unmounted disk or mount point leaves it; if its files "
                              f"were deleted on purpose, delete their documents with: rag ingest {empty} "
                              "--collection default --prune-empty"]
        else:  # nothing left to keep (deleted on purpose): the partitions go
            assert warned == []


@pytest.mark.slow
def test_sensor_new_changed_deleted(env):
    root, rag, kb, instance = env
    # New files: partitions added and one run over all of them.
    first = sensor_tick(instance, rag, None)
    (add,) = first.dynamic_partitions_requests
    assert isinstance(add, AddDynamicPartitionsRequest) and sorted(add.partition_keys) == sorted(FILES)
    (run,) = first.run_requests
    keys = instance.get_dynamic_partitions(CORPUS_FILES)
    assert (run.tags["dagster/asset_partition_range_start"], run.tags["dagster/asset_partition_range_end"]) == (keys[0], keys[-1])
    assert launch(instance, rag, run).success
    assert kb.show(RELS[0])["chunk_count"] > 0

    # A tick without a cursor (`rag dev` started after `rag materialize`) finds every file current
    # and materialized: no run, and the tick says so (not Dagster's "returned an empty result").
    assert not sensor_tick(instance, rag, None).run_requests
    assert shown(instance, rag, None) == "first tick: 2 files current, nothing to run"

    # Nothing changed; a touched file (same bytes, new mtime) is not a change either.
    os.utime(root / RELS[1], ns=(1, 1))
    quiet = sensor_tick(instance, rag, first.cursor)
    assert not quiet.run_requests and quiet.skip_reason.skip_message == "no changes in 2 files"

    # A changed file: one run for that file only, no new partitions.
    original = (root / RELS[0]).read_bytes()
    with open(root / RELS[0], "a") as fh:
        fh.write("\nreviewer_note: tightened the stop after review\n")
    changed = sensor_tick(instance, rag, quiet.cursor)
    assert not changed.dynamic_partitions_requests
    (run,) = changed.run_requests
    assert run.tags["dagster/asset_partition_range_start"] == run.tags["dagster/asset_partition_range_end"] == FILES[0]
    assert launch(instance, rag, run).success
    assert "reviewer_note" in {sec["name"] for sec in kb.show(RELS[0])["sections"]}  # the new content is live
    launched = {first.run_requests[0].run_key, run.run_key}

    # Reverted to bytes a run had before: a run again (Dagster skips a run key it has seen, and the
    # path and hash are the first run's), and the old content is live again.
    (root / RELS[0]).write_bytes(original)
    reverted = sensor_tick(instance, rag, changed.cursor)
    (run,) = reverted.run_requests
    assert run.run_key not in launched and launch(instance, rag, run).success
    launched.add(run.run_key)
    assert "reviewer_note" not in {sec["name"] for sec in kb.show(RELS[0])["sections"]}

    # Changed and ingested by the library while the sensor was off: current already, no run.
    with open(root / RELS[0], "a") as fh:
        fh.write("\ndesk_note: ingested by hand\n")
    kb.ingest([root])
    assert shown(instance, rag, reverted.cursor).startswith("1 changed file current already (ingested by `rag ingest`")
    by_hand = sensor_tick(instance, rag, reverted.cursor)
    assert not by_hand.run_requests

    # Deleted and put back, twice: each return gets a run of its own.
    cursor = by_hand.cursor
    back = (root / RELS[1]).read_bytes()
    for _ in range(2):
        (root / RELS[1]).unlink()
        cursor = sensor_tick(instance, rag, cursor).cursor
        (root / RELS[1]).write_bytes(back)
        restored = sensor_tick(instance, rag, cursor)
        (run,) = restored.run_requests
        assert run.run_key not in launched and launch(instance, rag, run).success
        launched.add(run.run_key)
        assert kb.show(RELS[1])["chunk_count"] > 0
        cursor = restored.cursor

    # A deleted file: its rows go first, then its partition.
    (root / RELS[1]).unlink()
    deleted = sensor_tick(instance, rag, cursor)
    (delete,) = deleted.dynamic_partitions_requests
    assert isinstance(delete, DeleteDynamicPartitionsRequest) and list(delete.partition_keys) == [FILES[1]]
    # ... and the index and every check run on what is left (a run of no partition)
    (refresh,) = deleted.run_requests
    assert [k.to_user_string() for k in refresh.asset_selection] == ["hnsw_index"]
    assert launch(instance, rag, refresh).success
    with pytest.raises(NotFoundError):
        kb.show(RELS[1])
    assert kb.store.load_stage("default", RELS[1], "raw_documents") is None
    assert instance.get_dynamic_partitions(CORPUS_FILES) == [FILES[0]]


@pytest.mark.slow
def test_a_missing_root_is_said_and_keeps_its_documents_and_partitions(env):
    root, rag, kb, instance = env
    first = sensor_tick(instance, rag, None)
    assert launch(instance, rag, first.run_requests[0]).success
    root.rename(root.with_name("corpus.moved"))  # an unmounted disk, a moved folder
    after = sensor_tick(instance, rag, first.cursor)
    assert not after.run_requests and not after.dynamic_partitions_requests
    assert f"missing root(s): {root}" in after.skip_reason.skip_message
    assert sorted(instance.get_dynamic_partitions(CORPUS_FILES)) == sorted(FILES)
    assert kb.show(RELS[0])["chunk_count"] > 0


@pytest.mark.slow
def test_an_emptied_root_keeps_its_documents_until_pruned_on_purpose(env):
    root, rag, kb, instance = env
    first = sensor_tick(instance, rag, None)
    assert launch(instance, rag, first.run_requests[0]).success
    shutil.rmtree(root)
    root.mkdir()  # an unmounted mount point: the folder is there, empty
    after = sensor_tick(instance, rag, first.cursor)
    assert not after.dynamic_partitions_requests
    assert sorted(instance.get_dynamic_partitions(CORPUS_FILES)) == sorted(FILES)
    assert kb.show(RELS[0])["chunk_count"] > 0
    assert sorted(kb.ingest([root], prune_empty=True).pruned) == sorted(RELS)  # the command the warning names
    last = sensor_tick(instance, rag, after.cursor)
    (delete,) = last.dynamic_partitions_requests
    assert isinstance(delete, DeleteDynamicPartitionsRequest) and sorted(delete.partition_keys) == sorted(FILES)


def test_unregistered_root_drops_partitions_keeps_documents(env):
    root, rag, kb, instance = env
    first = sensor_tick(instance, rag, None)
    assert launch(instance, rag, first.run_requests[0]).success
    kb.remove_root(root)  # the last root: its partitions still go, its documents stay
    assert shown(instance, rag, first.cursor) == (  # what the UI shows for the tick below
        "no corpus roots registered: register one with `rag roots add PATH` (or `rag materialize PATH`, or "
        "pipeline.roots in rag.yaml); 2 partitions of unregistered roots removed (their documents are kept)")
    after = sensor_tick(instance, rag, first.cursor)
    (delete,) = after.dynamic_partitions_requests
    assert isinstance(delete, DeleteDynamicPartitionsRequest) and sorted(delete.partition_keys) == sorted(FILES)
    assert not after.run_requests and instance.get_dynamic_partitions(CORPUS_FILES) == []
    assert kb.show(RELS[0])["chunk_count"] > 0 and kb.show(RELS[1])["chunk_count"] > 0
    when = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
        assert isinstance(nightly_reconcile(ctx), SkipReason)  # nothing registered, nothing to do


@pytest.mark.slow
def test_a_tick_that_only_deletes_refreshes_every_check(env):
    """The checks on vector_table and the other assets look at the whole corpus; after a tick that
    only deleted a file they must not keep showing what was there before (here: the deleted file's
    failure, red in failed_files)."""
    root, rag, kb, instance = env
    first = sensor_tick(instance, rag, None)
    (root / RELS[1]).unlink()  # gone before its run: that file fails, the other is published
    run = launch(instance, rag, first.run_requests[0])
    assert {e.check_name: e.passed for e in run.get_asset_check_evaluations()}["failed_files"] is False
    (refresh,) = sensor_tick(instance, rag, first.cursor).run_requests  # the deletion: rows, then partition
    result = launch(instance, rag, refresh)
    assert result.success
    evaluations = {e.asset_check_key.to_user_string(): e for e in result.get_asset_check_evaluations()}
    assert evaluations["vector_table:failed_files"].passed, evaluations["vector_table:failed_files"].description
    assert evaluations["vector_table:vector_table_orphans"].passed
    assert set(evaluations) == {k.to_user_string() for k in defs.resolve_asset_graph().asset_check_keys}
    # ... in a run of the index alone: no file is run again
    assert {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()} == {"hnsw_index"}


@pytest.mark.slow
def test_many_new_files_become_one_run(env, tmp_path):
    root, rag, kb, instance = env
    src = root / RELS[0]
    (root / "bulk").mkdir()
    for i in range(25):
        shutil.copy(src, root / f"bulk/copy_{i:02d}.yaml")
    result = sensor_tick(instance, rag, None)
    assert len(result.dynamic_partitions_requests[0].partition_keys) == 27
    assert len(result.run_requests) == 1


@pytest.mark.slow
def test_a_few_changes_spread_over_many_files_run_only_those_files(env):
    """A tick after 6 files changed, each more than MERGE_GAP files from the next: 6 runs of one
    file each (a run over the whole span would do and record every current file between them)."""
    root, rag, kb, instance = env
    src = (root / RELS[0]).read_text()
    (root / "bulk").mkdir()
    names = [f"bulk/f{i:04d}.yaml" for i in range(6 * (MERGE_GAP + 2) + 1)]
    for name in names:
        (root / name).write_text(src)
    first = sensor_tick(instance, rag, None)
    assert len(first.run_requests) == 1  # every file new: one run
    changed = names[::MERGE_GAP + 2]
    assert len(changed) == 7
    for name in changed[:6]:
        with open(root / name, "a") as fh:
            fh.write("\nreviewer_note: revised\n")
    tick = sensor_tick(instance, rag, first.cursor)
    spans = sorted((r.tags["dagster/asset_partition_range_start"], r.tags["dagster/asset_partition_range_end"])
                   for r in tick.run_requests)
    assert spans == [(f"corpus/{n}", f"corpus/{n}") for n in changed[:6]]


@pytest.mark.slow
def test_run_failure_sensor_records_failure(env):
    root, rag, kb, instance = env
    sensor_tick(instance, rag, None)
    (root / RELS[0]).unlink()  # the partition still exists; its run fails (file not found)
    job = defs.resolve_job_def("ingest_files")
    config = {"database_url": rag.database_url, "home": rag.home}
    result = job.execute_in_process(instance=instance, partition_key=FILES[0], raise_on_error=False,
                                    run_config={"resources": {"rag": {"config": config}}})
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    failure = next(e for e in result.all_events if e.event_type == DagsterEventType.RUN_FAILURE)
    with build_run_status_sensor_context(
            sensor_name="record_run_failures", dagster_event=failure, dagster_instance=instance, dagster_run=run,
            resources={"rag": rag}) as context:
        record_run_failures(context.for_run_failure())
    failures = kb.status()["failures"]
    assert any(f["source"] == "dagster:ingest_files" and f["run_id"] == result.run_id and f["partition"] == FILES[0]
               for f in failures)


@pytest.mark.slow
def test_schedules_reconcile_and_reembed(env):
    root, rag, kb, instance = env
    when = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)
    # Nothing materialized yet: the reconcile registers both files and asks for one run.
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
        (run,) = nightly_reconcile(ctx)
    assert run.tags["rag/missing"] == "2" and sorted(instance.get_dynamic_partitions(CORPUS_FILES)) == sorted(FILES)
    assert launch(instance, rag, run).success
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
        assert isinstance(nightly_reconcile(ctx), SkipReason)
        skipped = reembed_schedule(ctx)  # says against what the files are current
    assert skipped.skip_message == "all 2 files are current (embedded with all-MiniLM-L6-v2, embed_version 1)"
    # A new embed_version makes every published file stale for the re-embed schedule.
    bumped = RagResource(database_url=rag.database_url, home=rag.home, embed_version="2")
    preload_provider(bumped.settings(), kb.provider)
    with build_schedule_context(instance=instance, resources={"rag": bumped}, scheduled_execution_time=when) as ctx:
        (run,) = reembed_schedule(ctx)
    assert run.job_name == "reembed" and run.tags["rag/stale"] == "2"
    # Evaluating a schedule (the UI's "Test schedule") changes nothing: a deleted file keeps its
    # partition and documents until the corpus sensor or `rag materialize` sees it (it once deleted them)
    documents = {d["path"] for d in kb.list_documents()}
    (root / RELS[0]).unlink()
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
        nightly_reconcile(ctx)
    assert sorted(instance.get_dynamic_partitions(CORPUS_FILES)) == sorted(FILES)
    assert {d["path"] for d in kb.list_documents()} == documents
    # a file the library ingested but this instance never materialized (a terminated run, a new
    # instance) shows Missing in the UI: the reconcile runs it, as `rag materialize` does
    (root / "extra.md").write_text("# Extra\n\n## Body\n\nA note on rates.\n")
    assert kb.ingest([root / "extra.md"], root=root).count("new") == 1
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
        (run,) = nightly_reconcile(ctx)
    assert run.tags["rag/unmaterialized"] == "1" and run.tags["rag/missing"] == "0"
    # no registered root: said so, not "all 0 files are current"
    kb.remove_root(root)
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
        none = reembed_schedule(ctx)
    assert none.skip_message.startswith("no corpus roots registered") and "3 partitions" in none.skip_message


def test_the_schedules_launch_nothing_while_the_settings_name_the_space_a_reembed_left(env):
    """Between `rag reembed --to` switching spaces and the settings naming the new one, every run is
    refused at publishing; the documents, carried over to the new space, looked stale to these
    schedules, which launched a run for every file."""
    from rag_lib import reembed as rm

    root, rag, kb, instance = env
    assert kb.ingest([root]).count("new") == 2
    target = RotatedProvider(kb.provider)
    assert rm.reembed(kb.settings, kb.store, target.space, target=target).switched
    when = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
        said = [schedule(ctx) for schedule in (nightly_reconcile, reembed_schedule)]
    for skipped in said:
        assert isinstance(skipped, SkipReason), skipped
        assert skipped.skip_message.startswith(
            "the settings name embedding space all-MiniLM-L6-v2:384, not the active rotated-minilm:384")
        assert skipped.skip_message.endswith("; nothing launched")


def test_the_schedules_name_files_served_from_an_older_version(env):
    """A file whose newest edit is malformed keeps serving its last good version: the reconcile and
    re-embed ticks say so (skip reason, `rag/held` tag, a warning) and re-run nothing for it, where
    they called every file current."""
    root, rag, kb, instance = env
    when = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)
    assert kb.ingest([root]).count("new") == 2
    (root / RELS[0]).write_text("pattern: [unclosed\n  bad: : yaml")
    assert kb.ingest([root]).count("skipped") == 1
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
        skipped = reembed_schedule(ctx)
    assert skipped.skip_message == (
        "1 of 2 files are current (embedded with all-MiniLM-L6-v2, embed_version 1); 1 served from an older "
        "version, as their newest edit is skipped (a run skips it again, so what they serve keeps the settings "
        f"and vectors it was published with): {FILES[0]}; fix them and run again, or rag delete them (rag status "
        "names what each serves)")
    bumped = RagResource(database_url=rag.database_url, home=rag.home, embed_version="2")
    preload_provider(bumped.settings(), kb.provider)
    with build_schedule_context(instance=instance, resources={"rag": bumped}, scheduled_execution_time=when) as ctx:
        (run,) = reembed_schedule(ctx)
    assert run.tags["rag/stale"] == "1" and run.tags["rag/held"] == "1"
    assert run.tags[RANGE_START_TAG] == run.tags[RANGE_END_TAG] == FILES[1]


def test_a_schedule_leaves_files_to_the_run_already_queued_for_them(env):
    """Overlapping ticks: a reconcile or re-embed tick whose files an earlier run still holds
    (queued or in progress) launches nothing for them and names that run; a file no run covers
    gets its run; once the earlier run is over, the files get a run again."""
    root, rag, kb, instance = env
    job = defs.resolve_job_def("ingest_files")
    ticks = [dt.datetime(2026, 1, d, 2, 0, tzinfo=dt.timezone.utc) for d in (1, 2, 3, 4)]

    def evaluate(schedule, when, resource=rag):
        with build_schedule_context(instance=instance, resources={"rag": resource}, scheduled_execution_time=when) as ctx:
            return schedule(ctx)

    (first,) = evaluate(nightly_reconcile, ticks[0])
    with location_in_process(instance) as location:  # a run of the location's job, submitted to the queue
        queued = dagster_private.create_location_run(instance, location, LOCATION, job.name, {}, first.tags)
    instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_ENQUEUED.value, job.name), queued.run_id)
    queued = instance.get_run_by_id(queued.run_id)
    assert queued.status == DagsterRunStatus.QUEUED
    skipped = evaluate(nightly_reconcile, ticks[1])
    assert skipped.skip_message == (f"all 2 files needing a run are in runs already queued or in progress: "
                                    f"{queued.run_id} (ingest_files, queued, nightly_reconcile); nothing launched")
    (root / "extra.md").write_text("# Extra\n\n## Body\n\nA note on rates.\n")  # a file that run does not hold
    (extra,) = evaluate(nightly_reconcile, ticks[2])
    assert extra.tags[RANGE_START_TAG] == extra.tags[RANGE_END_TAG] == "corpus/extra.md"
    instance.report_run_canceled(queued)  # over: its files need a run again
    (again,) = evaluate(nightly_reconcile, ticks[3])
    order = instance.get_dynamic_partitions(CORPUS_FILES)
    assert (again.tags[RANGE_START_TAG], again.tags[RANGE_END_TAG]) == (order[0], order[-1]) and len(order) == 3

    # The re-embed schedule leaves stale files to a re-embed run in progress, and to an ingest run
    # (which does a re-embed's work and more).
    assert kb.ingest([root]).count("failed") == 0
    bumped = RagResource(database_url=rag.database_url, home=rag.home, embed_version="2")
    preload_provider(bumped.settings(), kb.provider)
    (reembed,) = evaluate(reembed_schedule, ticks[0], bumped)
    running = instance.create_run_for_job(defs.resolve_job_def("reembed"), tags=reembed.tags,
                                          status=DagsterRunStatus.STARTED)
    assert f"{running.run_id} (reembed, started, reembed_schedule)" in evaluate(reembed_schedule, ticks[1], bumped).skip_message
    instance.report_run_canceled(running)
    instance.create_run_for_job(job, tags={"dagster/partition": order[0]}, status=DagsterRunStatus.STARTED)
    (rest,) = evaluate(reembed_schedule, ticks[2], bumped)  # the files the ingest run does not hold
    assert (rest.tags[RANGE_START_TAG], rest.tags[RANGE_END_TAG]) == (order[1], order[2])


def test_the_sensor_and_the_schedules_run_the_files_of_a_started_run_whose_process_is_gone(env):
    """A run killed mid-way (SIGKILL, a machine restart) stays STARTED: the sensor and the schedules
    left its files to it on every tick, for ever. They mark it failed, say so, and request the run."""
    root, rag, kb, instance = env
    (request,) = sensor_tick(instance, rag, None).run_requests  # the partitions, and a run over both files
    both = (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG])
    assert set(both) == set(FILES)
    dead = started_run(instance, "ingest_files", request.tags, exited_pid())
    (again,) = sensor_tick(instance, rag, None).run_requests
    assert (again.tags[RANGE_START_TAG], again.tags[RANGE_END_TAG]) == both
    assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
    tick = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)
    dead = started_run(instance, "ingest_files", request.tags, exited_pid())
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=tick) as ctx:
        (run,) = nightly_reconcile(ctx)
    assert (run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) == both
    assert instance.get_run_by_id(dead.run_id).status == DagsterRunStatus.FAILURE
    # A run whose process runs keeps its files
    alive = started_run(instance, "ingest_files", request.tags, os.getpid())
    with build_schedule_context(instance=instance, resources={"rag": rag}, scheduled_execution_time=tick) as ctx:
        assert alive.run_id in nightly_reconcile(ctx).skip_message


def test_the_sensor_leaves_changed_files_to_the_run_already_queued_for_them(env):
    """A file that changes again while a run for it is queued or in progress gets no second run
    beside it: the tick names that run. The file is not marked seen: once the run is over the next
    tick looks at it again, and runs it if the run read it before the change."""
    root, rag, kb, instance = env
    job = defs.resolve_job_def("ingest_files")
    first = sensor_tick(instance, rag, None)
    (request,) = first.run_requests
    with location_in_process(instance) as location:  # the first tick's run, in the daemon's queue
        queued = dagster_private.create_location_run(instance, location, LOCATION, job.name, {}, request.tags)
    instance.report_dagster_event(DagsterEvent(DagsterEventType.RUN_ENQUEUED.value, job.name), queued.run_id)
    queued = instance.get_run_by_id(queued.run_id)
    assert queued.status == DagsterRunStatus.QUEUED
    with open(root / RELS[0], "a") as fh:  # changed before that run starts
        fh.write("\ndesk_note: sized down before the open\n")
    waiting = (f"1 file needing a run is in runs already queued or in progress: {queued.run_id} (ingest_files, "
               "queued, corpus_sensor); nothing launched, it is looked at again once that run ends; 2 files")
    cursor = first.cursor
    for _ in range(2):  # every tick while the run waits
        tick = sensor_tick(instance, rag, cursor)
        assert not tick.run_requests and tick.skip_reason.skip_message == waiting, tick.skip_reason
        cursor = tick.cursor

    # The run does its work (it reads the file as changed) and ends: nothing left to run.
    assert launch(instance, rag, request).success
    instance.report_run_canceled(queued)
    done = sensor_tick(instance, rag, cursor)
    assert not done.run_requests
    assert done.skip_reason.skip_message.startswith("1 changed file current already"), done.skip_reason

    # Changed after a run over it started (it may have read the file already): left to that run while
    # it runs, and run once it is over. Another changed file no run covers gets its run meanwhile.
    started = instance.create_run_for_job(job, tags={"dagster/partition": FILES[0]}, status=DagsterRunStatus.STARTED)
    for rel in RELS:
        with open(root / rel, "a") as fh:
            fh.write("\nreviewer_note: tightened the stop after review\n")
    during = sensor_tick(instance, rag, done.cursor)
    (other,) = during.run_requests
    assert other.tags[RANGE_START_TAG] == other.tags[RANGE_END_TAG] == FILES[1]
    instance.report_run_canceled(started)
    after = sensor_tick(instance, rag, during.cursor)
    (run,) = after.run_requests
    assert run.tags[RANGE_START_TAG] == run.tags[RANGE_END_TAG] == FILES[0]
    assert launch(instance, rag, run).success
    assert "reviewer_note" in {sec["name"] for sec in kb.show(RELS[0])["sections"]}  # the newest content is live
    assert sensor_tick(instance, rag, after.cursor).skip_reason.skip_message == "no changes in 2 files"

    # A file left to a run and then deleted loses its rows and its partition as any deleted file.
    instance.create_run_for_job(job, tags={"dagster/partition": FILES[0]}, status=DagsterRunStatus.STARTED)
    with open(root / RELS[0], "a") as fh:
        fh.write("\nexit_note: closed early\n")
    left = sensor_tick(instance, rag, after.cursor)
    assert not left.run_requests and left.skip_reason.skip_message.startswith("1 file needing a run is in runs")
    (root / RELS[0]).unlink()
    gone = sensor_tick(instance, rag, left.cursor)
    (delete,) = gone.dynamic_partitions_requests
    assert isinstance(delete, DeleteDynamicPartitionsRequest) and list(delete.partition_keys) == [FILES[0]]
    with pytest.raises(NotFoundError):
        kb.show(RELS[0])


PARTITIONED = ["raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table", "knowledge_graph"]


def asset_job_run(instance, keys: list[str], assets: list[str], status: DagsterRunStatus, backfill: str = ""):
    """A run of Dagster's implicit asset job over `keys` as the UI's "Materialize" creates it (one
    partition: its tag) or as an asset backfill's single run does (a range, with the backfill's tag),
    queued as the run coordinator does, or started."""
    tags = {**range_tags(keys[0], keys[-1]), "dagster/backfill": backfill} if backfill else \
        {"dagster/partition": keys[0], "dagster/from_ui": "true"}
    with location_in_process(instance) as location:
        run = dagster_private.create_location_run(instance, location, LOCATION, ASSET_JOB, {}, tags, assets)
    event = DagsterEventType.RUN_ENQUEUED if status == DagsterRunStatus.QUEUED else DagsterEventType.RUN_START
    instance.report_dagster_event(DagsterEvent(event.value, ASSET_JOB), run.run_id)
    run = instance.get_run_by_id(run.run_id)
    assert run.status == status and run.job_name == ASSET_JOB
    return run


def test_runs_launched_from_the_ui_hold_their_files_as_ingest_runs_do(env):
    """An operator's "Materialize" in the UI (Dagster's implicit asset job over a file's partition)
    and an asset backfill's run do what an ingest_files run does for their files: the sensor and the
    schedules launch no second run beside them, and say which run holds the files. A run of fewer
    stages than a tick's job (`vector_table` alone) does not: its file gets its run."""
    root, rag, kb, instance = env
    when = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)

    def evaluate(schedule, resource=rag):
        with build_schedule_context(instance=instance, resources={"rag": resource}, scheduled_execution_time=when) as ctx:
            return schedule(ctx)

    instance.add_dynamic_partitions(CORPUS_FILES, FILES)  # the files' partitions, which the operator picks
    ui = asset_job_run(instance, [FILES[0]], PARTITIONED, DagsterRunStatus.QUEUED)
    backfill = asset_job_run(instance, [FILES[1]], PARTITIONED, DagsterRunStatus.STARTED, backfill="xkqzbtvm")
    runs = (f"{backfill.run_id} (__ASSET_JOB, started, backfill), "  # in the files' order
            f"{ui.run_id} (__ASSET_JOB, queued, launched from the UI)")
    first = sensor_tick(instance, rag, None)
    assert not first.run_requests
    assert first.skip_reason.skip_message == (
        f"first tick: 2 files needing a run are in runs already queued or in progress: {runs}; nothing launched, "
        "they are looked at again once those runs end; 2 files")
    assert evaluate(nightly_reconcile).skip_message == (
        f"all 2 files needing a run are in runs already queued or in progress: {runs}; nothing launched")

    instance.report_run_canceled(ui)  # the operator publishes that file again, and nothing before it
    asset_job_run(instance, [FILES[0]], ["vector_table"], DagsterRunStatus.STARTED)
    (run,) = sensor_tick(instance, rag, first.cursor).run_requests
    assert run.tags[RANGE_START_TAG] == run.tags[RANGE_END_TAG] == FILES[0]
    (run,) = evaluate(nightly_reconcile)
    assert run.tags[RANGE_START_TAG] == run.tags[RANGE_END_TAG] == FILES[0]

    # A UI run of the stages a re-embed runs holds its file for the re-embed schedule, not the reconcile.
    instance.report_run_canceled(backfill)
    assert kb.ingest([root]).count("new") == 2
    asset_job_run(instance, [FILES[1]], ["chunks", "embeddings", "vector_table"], DagsterRunStatus.STARTED)
    bumped = RagResource(database_url=rag.database_url, home=rag.home, embed_version="2")
    preload_provider(bumped.settings(), kb.provider)
    (run,) = evaluate(reembed_schedule, bumped)
    assert run.tags[RANGE_START_TAG] == run.tags[RANGE_END_TAG] == FILES[0]
    (run,) = evaluate(nightly_reconcile)  # both never materialized here, and neither UI run reads its file
    assert {run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]} == set(FILES)


@pytest.mark.slow
def test_a_file_deleted_through_the_sensor_takes_its_ticker_profile_with_it(env):
    """Entity linking must not keep linking questions to a ticker whose documents were deleted until
    the next knowledge_graph run: the sensor's deletion path rebuilds the collection's profiles."""
    root, rag, kb, instance = env
    assert kb.ingest([root]).count("failed") == 0  # the library ingest builds the profiles
    before = {p["ticker"]: p for p in kb.ticker_profiles()}
    assert "NVDA" in before and RELS[0] in str(before["NVDA"]["sources"]), before
    first = sensor_tick(instance, rag, None)
    (root / RELS[0]).unlink()  # NVDA's trade journal
    sensor_tick(instance, rag, first.cursor)
    with pytest.raises(NotFoundError):
        kb.show(RELS[0])
    after = {p["ticker"]: p for p in kb.ticker_profiles()}
    assert all(RELS[0] not in str(p["sources"]) for p in after.values()), after
    # what the next knowledge_graph run would build: nothing left to change
    fresh = kb.rebuild_profiles()
    assert not fresh["rebuilt"] and not fresh["removed"], fresh
