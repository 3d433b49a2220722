"""A PostgreSQL the product did not start, under a role that is not superuser (as on managed
services): ingest, search and a Dagster run through `RAG_DATABASE_URL`; typed errors naming what an
administrator must run; PgBouncer in transaction pooling mode; searches read from a real streaming
replica (`search.database_url`). One standalone server (tests/pg_standalone.py) serves the module."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.errors import AdminRequiredError
from rag_lib.store import apply_migrations, migration_files
from pg_standalone import Cluster, url, wait_for_replay

ROLE, PASSWORD = "rag_app", "app-secret"
TRADE = "tradegent/fixtures/sample_trade.yaml"
RESEARCH = "tradegent/fixtures/sample_research.yaml"
EARNINGS = "tradegent/fixtures/sample_earnings.yaml"
LEARNING = "tradegent/knowledge/learnings/biases/loss-aversion-pre-earnings.yaml"
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    """The standalone server: superuser `postgres` (password), role `rag_app` (no superuser, no
    CREATEDB), databases it owns with `vector` created by the admin, and `dagster` for Dagster."""
    c = Cluster()
    try:
        c.init_primary()
        c.create_role(ROLE, PASSWORD)
        for name in ("rag", "rag_bouncer", "rag_replica", "rag_migrate"):
            c.create_database(name, ROLE)
        c.create_database("dagster", ROLE, vector=False)
        c.create_database("rag_noext", ROLE, vector=False)
        yield c
    finally:
        c.close()


def role_url(cluster: Cluster, dbname: str, port: int | None = None) -> str:
    return url(ROLE, PASSWORD, port or cluster.primary.port, dbname)


@pytest.mark.subprocess
@pytest.mark.slow
def test_non_superuser_role_runs_ingest_search_and_a_dagster_run(cluster, corpus_copy, provider, tmp_path):
    rag_url = role_url(cluster, "rag")
    with psycopg.connect(rag_url) as conn:
        assert conn.execute("SELECT rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user").fetchone() \
            == (False, False)
    root = corpus_copy(TRADE, RESEARCH, LEARNING)
    settings = Settings(database_url=rag_url, home=tmp_path / ".rag")
    with KnowledgeBase(settings, provider=provider) as kb:
        report = kb.ingest([root / LEARNING], root=root)
        assert report.count("new") == 1 and report.count("failed") == 0
        hits = kb.search("loss aversion before earnings", mode="hybrid", top_k=3).hits
        assert hits and hits[0].path == LEARNING
        assert kb.metrics_summary()["searches"] == 1  # metrics rows written by the role
    with psycopg.connect(rag_url) as conn:
        owners = {r[0] for r in conn.execute("SELECT tableowner FROM pg_tables WHERE tablename LIKE 'rag\\_%'")}
        assert owners == {ROLE}

    # `rag materialize` as a user runs it: runs, event logs and ticks in database `dagster` on this
    # server (made by the admin, owned by the role), the ingest in database `rag`.
    env = {k: v for k, v in os.environ.items() if k not in ("DAGSTER_PG_URL", "DAGSTER_HOME", "RAG_CONFIG")}
    env.update({"RAG_DATABASE_URL": rag_url, "RAG_HOME": str(tmp_path / ".rag"), "HF_HUB_OFFLINE": "1",
                "DAGSTER_DISABLE_TELEMETRY": "1"})
    proc = subprocess.run([str(BIN / "rag"), "materialize", str(root), "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["success"] and summary["partitions"] == 3 and not summary["failed_partitions"]
    with psycopg.connect(role_url(cluster, "dagster")) as conn:
        assert conn.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'runs'").fetchone() == (ROLE,)
        assert conn.execute("SELECT count(*) FROM runs WHERE status = 'SUCCESS'").fetchone()[0] == 1
    with KnowledgeBase(settings, provider=provider) as kb:
        assert {kb.show(rel)["path"] for rel in (TRADE, RESEARCH, LEARNING)} == {TRADE, RESEARCH, LEARNING}


@pytest.mark.subprocess
@pytest.mark.slow
def test_what_needs_an_admin_is_a_typed_error_naming_the_statement(cluster, tmp_path, provider, monkeypatch, rag):
    # pgvector is not a trusted extension: the role cannot create it, and is told who must
    settings = Settings(database_url=role_url(cluster, "rag_noext"), home=tmp_path / ".rag")
    with pytest.raises(AdminRequiredError, match=r"rag_noext.*`CREATE EXTENSION vector;`"):
        KnowledgeBase(settings, provider=provider).store
    with psycopg.connect(role_url(cluster, "rag_noext")) as conn:  # nothing half-made was left behind
        assert conn.execute("SELECT to_regclass('rag_schema_migrations')").fetchone()[0] is None

    # a database the role does not own (PostgreSQL 15+: no CREATE on its public schema)
    cluster.create_database("rag_notowner", "postgres")
    settings = Settings(database_url=role_url(cluster, "rag_notowner"), home=tmp_path / ".rag")
    with pytest.raises(AdminRequiredError, match=f"ALTER DATABASE rag_notowner OWNER TO {ROLE};"):
        KnowledgeBase(settings, provider=provider).store

    # no CREATEDB: the Dagster database must come from the admin, and the message says so
    from pipelines.instance import dagster_pg_url

    monkeypatch.delenv("DAGSTER_PG_URL", raising=False)
    with psycopg.connect(cluster.primary.admin_url(), autocommit=True) as conn:
        conn.execute("ALTER DATABASE dagster RENAME TO dagster_saved")
    try:
        with pytest.raises(AdminRequiredError, match=f"CREATE DATABASE dagster OWNER {ROLE};"):
            dagster_pg_url(Settings(database_url=role_url(cluster, "rag"), home=tmp_path / ".rag"))
    finally:
        with psycopg.connect(cluster.primary.admin_url(), autocommit=True) as conn:
            conn.execute("ALTER DATABASE dagster_saved RENAME TO dagster")

    # the CLI shows it as one line and a non-zero exit
    monkeypatch.setenv("RAG_DATABASE_URL", role_url(cluster, "rag_noext"))
    code, _, err = rag("status")
    assert code == 1 and "Traceback" not in err
    assert "CREATE EXTENSION vector;" in err and len(err.strip().splitlines()) == 1, err

    # status lines name the server without its password
    monkeypatch.setenv("RAG_DATABASE_URL", role_url(cluster, "rag"))
    code, out, _ = rag("db", "status")
    assert code == 0 and f"{ROLE}:***@127.0.0.1" in out and PASSWORD not in out


SESSION_SET = re.compile(r"""(?<![\w.])SET\s+(?!LOCAL\b)(?:SESSION\s+)?[a-z_]+(?:\.[a-z_]+)?\s*(?:=|TO\b)""",
                         re.IGNORECASE)


def test_no_session_level_settings_in_the_code():
    """Per-query settings are transaction-local (`SET LOCAL`, `set_config(..., true)`): a session
    `SET` would stay on a pooled server connection that PgBouncer hands to the next client."""
    offenders = []
    for path in [*REPO.glob("rag_lib/**/*.py"), *REPO.glob("pipelines/**/*.py"), *REPO.glob("sql/*.sql")]:
        text = path.read_text()
        for match in SESSION_SET.finditer(text):
            line = text[: match.start()].count("\n") + 1
            if re.search(r"\bUPDATE\b|ON CONFLICT|ALTER (TABLE|COLUMN|DATABASE)|MERGE \(|\bDO UPDATE\b",
                         text[max(0, match.start() - 200): match.start()].split("\n")[-1] + text[match.start(): match.end()]):
                continue  # UPDATE … SET col = …, ALTER TABLE … SET (…) are not settings; ALTER DATABASE … SET is
                # a default every new server connection gets alike
            offenders.append(f"{path.relative_to(REPO)}:{line}: {match.group(0)}")
        for match in re.finditer(r"set_config\([^)]*\b(false|False)\s*\)", text):
            offenders.append(f"{path.relative_to(REPO)}: {match.group(0)}")
        if re.search(r"pg_(try_)?advisory_lock(_shared)?\(|ALTER SYSTEM", text) and path.name != "db.py":
            offenders.append(f"{path.relative_to(REPO)}: session advisory lock or ALTER SYSTEM")
    assert not offenders, ("session-level state breaks behind PgBouncer's transaction pooling; use SET LOCAL or "
                           f"set_config(name, value, true) inside the query's transaction, pg_advisory_xact_lock: {offenders}")


@pytest.mark.subprocess
@pytest.mark.slow
def test_search_through_pgbouncer_transaction_pooling_leaks_no_setting(cluster, corpus_copy, provider, tmp_path):
    exe = shutil.which("pgbouncer") or next((p for p in ("/usr/sbin/pgbouncer",) if Path(p).exists()), None)
    if exe is None:
        pytest.skip("the `pgbouncer` binary is not installed (Debian/Ubuntu package `pgbouncer`): "
                    "PgBouncer transaction pooling is not tested on this machine")
    port = cluster.start_bouncer(exe, {"rag_bouncer": "rag_bouncer", "rag_migrate": "rag_migrate"}, {ROLE: PASSWORD},
                                 pool_size=1)
    bouncer_url = role_url(cluster, "rag_bouncer", port=port)
    root = corpus_copy(LEARNING, TRADE)
    query = "loss aversion before earnings"
    with KnowledgeBase(Settings(database_url=bouncer_url, home=tmp_path / ".rag"), provider=provider) as kb:
        assert kb.ingest([root]).count("failed") == 0  # migrations and publishing through the bouncer
        via_bouncer = kb.search(query, mode="semantic", top_k=5)
        hybrid = kb.search(query, mode="hybrid", top_k=5)
        assert kb.metrics_summary()["searches"] == 2

    def session_state(conn: psycopg.Connection) -> tuple:
        return conn.execute(
            "SELECT pg_backend_pid(), current_setting('hnsw.ef_search', true), current_setting('hnsw.iterative_scan', true),"
            " current_setting('hnsw.max_scan_tuples', true), current_setting('jit'), current_setting('statement_timeout')"
        ).fetchone()

    with psycopg.connect(bouncer_url, autocommit=True) as a, psycopg.connect(bouncer_url, autocommit=True) as b:
        # One server connection for every client (pool size 1): a session SET by one client is seen by
        # the next, which is what this test would catch if the search set anything for the session.
        pid, *state = session_state(a)
        assert session_state(b)[0] == pid
        assert state == ["40", "off", "20000", "on", "0"], state  # the server's defaults, not the search's
        a.execute("SET hnsw.ef_search = 123")
        assert session_state(b)[1] == "123"  # the leak this pool shape exposes
        a.execute("RESET ALL")

    direct = role_url(cluster, "rag_bouncer")
    with KnowledgeBase(Settings(database_url=direct, home=tmp_path / ".rag"), provider=provider) as kb:
        expected = kb.search(query, mode="semantic", top_k=5)
    assert via_bouncer.hits and via_bouncer.hits[0].path == LEARNING
    assert [(h.chunk_id, round(h.score, 5)) for h in via_bouncer.hits] == \
        [(h.chunk_id, round(h.score, 5)) for h in expected.hits]
    assert hybrid.hits and hybrid.hits[0].path == LEARNING

    # Four clients migrating one empty database at once through the bouncer: each migration applied
    # exactly once (a session advisory lock would be shared by every client of the one server session).
    def migrate(_: int) -> list[str]:
        with psycopg.connect(role_url(cluster, "rag_migrate", port=port), autocommit=True,
                             prepare_threshold=None) as conn:
            return apply_migrations(conn)

    with ThreadPoolExecutor(4) as pool:
        applied = [name for names in pool.map(migrate, range(4)) for name in names]
    assert sorted(applied) == sorted(path.name for _, path in migration_files())


@pytest.mark.subprocess
@pytest.mark.slow
def test_search_reads_from_a_streaming_replica(cluster, corpus_copy, provider, tmp_path):
    replica = cluster.start_replica()
    primary_url, replica_url = role_url(cluster, "rag_replica"), role_url(cluster, "rag_replica", port=replica.port)
    root = corpus_copy(LEARNING)
    home = tmp_path / ".rag"
    settings = Settings(database_url=primary_url, home=home, search={"database_url": replica_url})
    with psycopg.connect(replica_url) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]
    with KnowledgeBase(settings, provider=provider) as kb, \
            KnowledgeBase(Settings(database_url=primary_url, home=home), provider=provider) as on_primary:
        assert kb.ingest([root]).count("new") == 1  # written on the primary
        wait_for_replay(cluster.primary.admin_url(), replica.admin_url())
        assert kb.search_store is not kb.store and kb.search_store.db.url == replica_url
        hits = kb.search("loss aversion before earnings", mode="hybrid", top_k=3).hits
        assert hits and hits[0].path == LEARNING

        # With replay paused, a new document is on the primary only: searches do not see it yet,
        # which shows they read from the replica; once replayed, they do.
        with psycopg.connect(replica.admin_url(), autocommit=True) as admin:
            admin.execute("SELECT pg_wal_replay_pause()")
            try:
                corpus_copy(EARNINGS)
                assert kb.ingest([root]).count("new") == 1
                query = "NVDA earnings"
                assert EARNINGS in {h.path for h in on_primary.search(query, mode="lexical", top_k=5).hits}
                assert EARNINGS not in {h.path for h in kb.search(query, mode="lexical", top_k=5).hits}
            finally:
                admin.execute("SELECT pg_wal_replay_resume()")
        wait_for_replay(cluster.primary.admin_url(), replica.admin_url())
        assert EARNINGS in {h.path for h in kb.search(query, mode="semantic", top_k=5).hits}

        # The search metrics went to the primary (a standby refuses writes): none was dropped.
        assert kb.metrics.flush() and kb.metrics.dropped == 0
    with psycopg.connect(primary_url) as conn:
        assert conn.execute("SELECT count(*) FROM rag_search_metrics").fetchone()[0] == 4  # 3 + on_primary's 1
