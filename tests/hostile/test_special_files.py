"""Special files and links in a corpus root (issue 29, findings 1-4): a FIFO, links to /dev/zero,
to /proc/self/environ and to a file outside the root, a 2,899-character relative path and a
1.5 GB file. Through the library, `rag ingest`, the corpus sensor, the stage runs, the nightly
reconcile, `rag materialize` and `POST /api/rag/embed`, each is skipped with its reason, in bounded
time and memory, and the good file beside them is ingested. Memory bounds hold in a child process
(RLIMIT_AS set there only); big files are sparse, so they use no disk."""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
import textwrap
import uuid
import warnings
from pathlib import Path

import httpx
import psycopg
import pytest
from testkit import child_env, create_database, sensor_tick, start_server

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.corpus_files import Digests, ReadLimits, refused_digest, walk

warnings.filterwarnings("ignore", category=Warning, module="dagster")

GOOD = "# Good note\n\n## Thesis\n\nCopper miners gain from grid electrification.\n"
SECRET = "# Private\n\n## Vault\n\nThe outside passphrase is zebra-quartz-lantern.\n"
# + "long.md": a 2,899-character relative path, every part under NAME_MAX; random letters, so
# PostgreSQL cannot compress the key under its index row limit (a run of one letter would fit)
_random = random.Random(29)
LONG_PARTS = ["".join(_random.choices(string.ascii_letters + string.digits, k=240)) for _ in range(12)]
LONG_REL = "/".join([*LONG_PARTS, "long.md"])
# What each special entry is skipped for (path under the root → reason)
EXPECTED = {
    "pipe.md": "not_regular_file",
    "zero.md": "outside_root",
    "environ.md": "outside_root",
    "notes/link_out.md": "outside_root",
    "inner_pipe.md": "not_regular_file",  # a link inside the root to the FIFO
    "loop.md": "link_loop",  # a link to itself: it was left out of the listing, unreported
}
GIB = 1024 ** 3
BIN = Path(sys.executable).parent
RAG = str(BIN / "rag")


def make_root(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "notes").mkdir(parents=True)
    (root / "good.md").write_text(GOOD)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(SECRET)
    os.symlink(outside / "secret.md", root / "notes" / "link_out.md")
    os.symlink("/dev/zero", root / "zero.md")
    os.symlink("/proc/self/environ", root / "environ.md")
    os.mkfifo(root / "pipe.md")
    os.symlink("pipe.md", root / "inner_pipe.md")
    os.symlink("loop.md", root / "loop.md")
    (root / LONG_REL).parent.mkdir(parents=True)
    (root / LONG_REL).write_text("# Long\n\n## Body\n\nA note at a very long path.\n")
    assert len(LONG_REL) == 2899
    return root


def sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)  # a hole: no disk blocks, reads as zeros
    return path


def assert_skips(outcomes: dict[str, dict]) -> None:
    """`outcomes`: path → {status, reason}; every special entry skipped with its reason."""
    assert outcomes["good.md"]["status"] in ("new", "unchanged"), outcomes["good.md"]
    for rel, reason in EXPECTED.items():
        assert (outcomes[rel]["status"], outcomes[rel]["reason"]) == ("skipped", reason), outcomes[rel]
    (long,) = [p for p in outcomes if p.startswith(LONG_REL[:100])]
    assert outcomes[long]["reason"] == "path_too_long" and len(long) < 200, long


def outside_text_found(kb: KnowledgeBase) -> bool:
    docs = {d["path"] for d in kb.store.list_documents(None)}
    hits = kb.search("outside passphrase zebra quartz lantern", mode="lexical", top_k=5).hits
    return bool(hits) or any("link_out" in p or "environ" in p for p in docs)


def test_the_walk_and_a_scans_digests_treat_every_entry_as_one_file_at_a_time(tmp_path: Path):
    """The corpus sensor walks every root each tick and hashes a scan's files through one `Digests`
    (each folder resolved once): the walk lists what `os.walk` listed (links to folders, ignored
    folders and dangling links left out), the digests equal one-by-one `ReadLimits.digest`, special
    entries refused alike, and a folder that becomes a link out of the root after it was resolved
    does not lead a read outside."""
    root = make_root(tmp_path)
    os.symlink(tmp_path / "outside", root / "dir_link")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD.md").write_text(GOOD)
    os.symlink(root / "nowhere.md", root / "dangling.md")
    (root / "sub").mkdir()
    (root / "sub" / "a.md").write_text(GOOD)
    (root / "sub" / "secret.md").write_text(GOOD.replace("Copper", "Zinc"))

    entries = walk(root)
    assert [e.rel for e in entries] == sorted([*EXPECTED, "good.md", LONG_REL, "sub/a.md", "sub/secret.md"])
    limits = ReadLimits(1 << 20, 1 << 20)
    digests = Digests(limits)
    assert [digests(e.path, root) for e in entries] == [limits.digest(e.path, root) for e in entries]
    for rel, reason in EXPECTED.items():
        assert digests(root / rel, root) == refused_digest(reason, root / rel)

    # sub/ was resolved above; now it is a link to the folder holding the outside secret
    (root / "sub").rename(root / "sub_before")
    os.symlink(tmp_path / "outside", root / "sub")
    swapped = root / "sub" / "secret.md"
    assert digests(swapped, root) == limits.digest(swapped, root) == refused_digest("outside_root", swapped)


# ---- the library ------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_library_ingest_skips_special_files_and_links_out_of_the_root(kb, tmp_path: Path):
    root = make_root(tmp_path)
    report = kb.ingest([root])
    assert report.count("failed") == 0, report.to_dict()
    assert_skips({o.path: {"status": o.status, "reason": o.reason} for o in report.outcomes})
    (loop,) = [o for o in report.outcomes if o.path == "loop.md"]
    assert "(loop.md → loop.md) that leads back to itself" in loop.detail, loop.detail
    listed = {s["path"]: s["reason"] for s in kb.store.list_skipped()}  # what `rag status` shows
    assert {rel: listed.get(rel) for rel in EXPECTED} == EXPECTED
    assert "path_too_long" in listed.values()
    assert {d["path"] for d in kb.store.list_documents(None)} == {"good.md"}
    assert not outside_text_found(kb)

    # a link named on its own is confined to its folder, as the HTTP API confines it
    (single,) = kb.ingest([root / "notes" / "link_out.md"]).outcomes
    assert (single.status, single.reason) == ("skipped", "outside_root")
    assert not outside_text_found(kb)

    # dangling links named on their own: one skip each, no failure (was a FileNotFoundError)
    os.symlink("/nonexistent/gone.md", root / "notes" / "gone_out.md")
    os.symlink("missing.md", root / "notes" / "gone_in.md")
    report = kb.ingest([root / "notes" / "gone_out.md", root / "notes" / "gone_in.md"])
    assert {o.path: (o.status, o.reason) for o in report.outcomes} == {  # paths under the registered root
        "notes/gone_out.md": ("skipped", "outside_root"), "notes/gone_in.md": ("skipped", "unreadable")}

    # a link loop named on its own, pruning too: one skip, where Path.resolve() raised RuntimeError
    report = kb.ingest([root / "loop.md"], prune=True)
    assert [(o.path, o.status, o.reason) for o in report.outcomes] == [("loop.md", "skipped", "link_loop")]
    assert {d["path"] for d in kb.store.list_documents(None)} == {"good.md"}


@pytest.mark.timeout(120)
def test_a_file_that_becomes_a_link_or_pipe_is_skipped_and_keeps_its_live_version(kb, tmp_path: Path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "a.md").write_text(GOOD)
    (root / "b.md").write_text(GOOD.replace("Copper", "Nickel"))
    assert kb.ingest([root]).count("new") == 2
    (root / "a.md").unlink()
    os.symlink("/dev/zero", root / "a.md")
    (root / "b.md").unlink()
    os.mkfifo(root / "b.md")
    report = kb.ingest([root], prune=True)
    by_path = {o.path: (o.status, o.reason) for o in report.outcomes}
    assert by_path == {"a.md": ("skipped", "outside_root"), "b.md": ("skipped", "not_regular_file")}
    assert {d["path"] for d in kb.store.list_documents(None)} == {"a.md", "b.md"}  # bad input never deletes


# ---- `rag ingest` and `rag validate` as a user runs them -----------------------------------------

@pytest.mark.subprocess
@pytest.mark.timeout(600)
def test_rag_ingest_and_validate_skip_special_files_with_one_line_each(kb, database_url, tmp_path: Path):
    root = make_root(tmp_path)
    env = child_env(database_url, tmp_path / ".rag")
    done = subprocess.run([RAG, "ingest", str(root), "--json"], env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["failed"] == 0
    assert_skips({f["path"]: f for f in report["files"]})
    assert not outside_text_found(kb)

    checked = subprocess.run([RAG, "validate", str(root), "--json"], env=env, capture_output=True, text=True,
                             timeout=500)
    assert checked.returncode == 1, checked.stderr[-2000:]  # problems found: exit 1, not a crash
    problems = {f["path"]: f.get("problem") or "" for f in json.loads(checked.stdout)["files"]}
    for rel, reason in EXPECTED.items():
        assert problems[rel].startswith(f"{reason}: "), (rel, problems[rel])


# ---- bounded memory: a 1.5 GB file costs no memory -----------------------------------------------

CHILD = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from rag_lib.api import KnowledgeBase
    from rag_lib.config import Settings

    kb = KnowledgeBase(Settings(database_url=sys.argv[1], home=sys.argv[2]))
    kb.engine  # the model and engine load before the limit
    kb.embed_text("warm up")
    vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
    limit = vm + int(sys.argv[4])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # this child only
    report = kb.ingest([Path(sys.argv[3])])
    print(json.dumps({f["path"]: f for f in report.to_dict()["files"]}))
""")


@pytest.mark.subprocess
@pytest.mark.timeout(600)
def test_ingest_checks_the_size_before_reading_under_a_memory_limit(database_url, tmp_path: Path):
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "good.md").write_text(GOOD)
    sparse(root / "big.md", 3 * GIB // 2)
    sparse(root / "big.jsonl", 200 * 1024 * 1024)  # over limits.max_jsonl_bytes (128 MiB)
    env = child_env(database_url, tmp_path / ".rag")
    done = subprocess.run([sys.executable, "-c", CHILD, database_url, str(tmp_path / ".rag"), str(root),
                           str(512 * 1024 * 1024)], env=env, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    files = json.loads(done.stdout.strip().splitlines()[-1])
    assert files["good.md"]["status"] == "new", files
    assert (files["big.md"]["status"], files["big.md"]["reason"]) == ("skipped", "too_large"), files["big.md"]
    assert "max_file_bytes" in files["big.md"]["detail"]
    assert (files["big.jsonl"]["status"], files["big.jsonl"]["reason"]) == ("skipped", "too_large"), files["big.jsonl"]
    assert "limits.max_jsonl_bytes" in files["big.jsonl"]["detail"]


def peak_rss(pid: int) -> int:
    """Peak resident memory of a process, in bytes (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


@pytest.mark.subprocess
@pytest.mark.timeout(900)
def test_http_embed_of_an_oversized_file_costs_the_server_no_memory(pg_server, tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "good.md").write_text(GOOD)
    sparse(root / "big.md", 3 * GIB // 2)
    url = create_database(pg_server)
    env = child_env(url, tmp_path / ".rag", RAG_SERVER__CORPUS_ROOTS=json.dumps([str(root)]))
    server = start_server(["serve"], env, tmp_path / "server.log")
    try:
        with httpx.Client(base_url=server.url, timeout=300) as client:
            assert client.post("/api/rag/embed", json={"path": "good.md"}).json()["new"] == 1  # warm: model, pool
            before = peak_rss(server.proc.pid)
            r = client.post("/api/rag/embed", json={"path": "big.md"})
            after = peak_rss(server.proc.pid)
            assert r.status_code in (200, 422), r.text
            assert "too_large" in r.text, r.text
            # the reviewer saw 1.0 → 2.1 GB for one such request: the file was read whole
            assert after - before < 200 * 1024 * 1024, (before, after)
            assert client.get("/health").status_code == 200
    finally:
        server.stop()


# ---- Dagster: the corpus sensor, the stage runs, the nightly reconcile, `rag materialize` ----------



RECONCILE = textwrap.dedent("""
    import json, resource, sys
    from rag_lib.api import KnowledgeBase
    from rag_lib.config import Settings
    from pipelines.partitions import PartitionMap
    from rag_lib.ingest.state import plan_reconcile

    kb = KnowledgeBase(Settings(database_url=sys.argv[1], home=sys.argv[2]))
    pmap = PartitionMap(kb.roots())
    targets = [pmap.target(k) for k in pmap.files()]
    vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
    limit = vm + 512 * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # this child only
    plan = plan_reconcile(kb.store, kb.settings, targets, kb.settings.pipeline_fingerprint())
    print(json.dumps({"stale": plan.stale, "missing": plan.missing, "failed": plan.failed}))
""")


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_corpus_sensor_stage_runs_and_reconcile_skip_special_files(pg_instance, database_url, provider,
                                                                   tmp_path: Path):
    from pipelines.partitions import CORPUS_FILES, PartitionMap
    from pipelines.resources import RagResource, preload_provider
    from pipelines.resources import stage_runner

    root = make_root(tmp_path)
    (root / "became.md").write_text(GOOD.replace("Copper", "Uranium"))
    home = tmp_path / ".rag"
    settings = Settings(database_url=database_url, home=home)
    preload_provider(settings, provider)
    rag = RagResource(database_url=database_url, home=str(home))
    with KnowledgeBase(settings, provider=provider) as kb:
        kb.add_root(root)
        first = sensor_tick(pg_instance, rag, None)  # a FIFO blocked this tick forever; /dev/zero read forever
        keys = set(pg_instance.get_dynamic_partitions(CORPUS_FILES))
        assert {f"corpus/{rel}" for rel in [*EXPECTED, "good.md", "became.md"]} == keys  # no key for the long path
        assert first.run_requests
        listed = {s["path"]: s["reason"] for s in kb.store.list_skipped()}
        assert "path_too_long" in listed.values()

        pmap = PartitionMap(kb.roots())
        targets = [pmap.target(k) for k in sorted(keys)]
        outcomes = {o.key: o for o in stage_runner(kb).raw_documents(targets)}
        assert outcomes["corpus/good.md"].status == "ok"
        for rel, reason in EXPECTED.items():
            o = outcomes[f"corpus/{rel}"]
            assert (o.status, o.metadata.get("skip_reason")) == ("skipped", reason), o
        listed = {s["path"]: s["reason"] for s in kb.store.list_skipped()}
        assert {rel: listed.get(rel) for rel in EXPECTED} == EXPECTED

        # an ingested file becomes a link to /dev/zero: the next tick and the nightly reconcile see a
        # change without reading it (the reviewer's `rag materialize` hashed 22.5 GB here)
        (root / "became.md").unlink()
        os.symlink("/dev/zero", root / "became.md")
        second = sensor_tick(pg_instance, rag, first.cursor)
        assert second.run_requests, "a file that became a link is a change"
    done = subprocess.run([sys.executable, "-c", RECONCILE, database_url, str(home)], capture_output=True, text=True,
                          timeout=300, env={**child_env(database_url, home), "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    assert plan["stale"] == ["corpus/became.md"], plan


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_nightly_reconcile_syncs_every_root_past_a_long_path(pg_instance, database_url, provider, tmp_path: Path):
    """The schedule syncs the partitions of every root: one unkeyable path stopped it for all."""
    import datetime as dt

    from dagster import build_schedule_context

    from pipelines.partitions import CORPUS_FILES
    from pipelines.resources import RagResource, preload_provider
    from pipelines.schedules import nightly_reconcile

    root = make_root(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "b.md").write_text(GOOD.replace("Copper", "Lithium"))
    home = tmp_path / ".rag"
    settings = Settings(database_url=database_url, home=home)
    preload_provider(settings, provider)
    rag = RagResource(database_url=database_url, home=str(home))
    with KnowledgeBase(settings, provider=provider) as kb:
        kb.add_root(root)
        kb.add_root(other)
        when = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.timezone.utc)
        with build_schedule_context(instance=pg_instance, resources={"rag": rag}, scheduled_execution_time=when) as ctx:
            (run,) = nightly_reconcile(ctx)
        keys = set(pg_instance.get_dynamic_partitions(CORPUS_FILES))
        assert "other/b.md" in keys and "corpus/good.md" in keys and max(len(k) for k in keys) < 100
        assert run.tags["rag/missing"] == str(len(keys))
        assert "path_too_long" in {s["reason"] for s in kb.store.list_skipped()}


@pytest.mark.subprocess
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_rag_materialize_skips_special_files_and_long_paths_without_sql(pg_server, database_url, provider,
                                                                        tmp_path: Path, monkeypatch):
    from pipelines.instance import get_instance, sqlalchemy_url
    from pipelines.partitions import CORPUS_FILES

    name = "dagster_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    pg_url = sqlalchemy_url(pg_server, name)
    root = make_root(tmp_path)
    home = tmp_path / ".rag"
    env = {**child_env(database_url, home), "DAGSTER_PG_URL": pg_url, "DAGSTER_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run([RAG, "materialize", str(root), "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=800)
    assert "SQL" not in proc.stderr and "INSERT" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["success"] and not summary["failed_partitions"], summary
    skipped = {s["path"]: s["reason"] for s in summary["skipped"]}
    assert {rel: skipped.get(rel) for rel in EXPECTED} == EXPECTED
    (long,) = [p for p, reason in skipped.items() if reason == "path_too_long"]
    assert long.startswith(LONG_REL[:100])

    monkeypatch.setenv("DAGSTER_PG_URL", pg_url)
    settings = Settings(database_url=database_url, home=home)
    instance = get_instance(settings)
    try:
        keys = instance.get_dynamic_partitions(CORPUS_FILES)
        assert "corpus/good.md" in keys and max(len(k) for k in keys) < 100, keys
    finally:
        instance.dispose()
    with KnowledgeBase(settings, provider=provider) as kb:
        assert kb.show("good.md")["chunk_count"] > 0
        assert not outside_text_found(kb)

    # the next materialize (every root syncs together) still works
    again = subprocess.run([RAG, "materialize", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=800)
    assert again.returncode == 0, again.stdout + again.stderr[-3000:]


# ---- the CLI's error boundary --------------------------------------------------------------------

def test_an_unexpected_database_error_prints_one_line_without_its_statement(rag, monkeypatch):
    import rag_lib.api

    def boom(self, *args, **kwargs):
        raise RuntimeError('(psycopg2.errors.ProgramLimitExceeded) index row size 2936 exceeds btree version 4 '
                           'maximum 2704 for index "idx_dynamic_partitions"\n'
                           "[SQL: INSERT INTO dynamic_partitions (partitions_def_name, partition) VALUES (%(p)s)]\n"
                           "[parameters: {'p': 'secret-ish'}]")

    monkeypatch.setattr(rag_lib.api.KnowledgeBase, "status", boom)
    code, out, err = rag("status")
    assert code == 1
    assert "INSERT" not in err and "[SQL" not in err and "parameters" not in err, err
    assert "index row size 2936" in err and "idx_dynamic_partitions" in err
