"""Connections (one psycopg pool with the pgvector adapter) and numbered SQL migrations."""

from __future__ import annotations

import logging
import re
import sys
import weakref
from contextlib import contextmanager
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg_pool import ConnectionPool

from rag_lib.config import Settings
from rag_lib.db import LIBRARY_DB, check_url, database_gone, database_url
from rag_lib.errors import AdminRequiredError, DatabaseError
from rag_lib.log import get_logger, scrub_secrets

log = get_logger(__name__)

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
# Once a pool's database is known gone, a connection is waited for this long instead of the pool's 30 s:
# every later statement of a command that lost its database (its cleanup, its metrics) failed after 30 s.
GONE_WAIT_SECONDS = 2.0
_GONE: weakref.WeakSet[Connections] = weakref.WeakSet()  # open pools whose database is known gone
MIGRATION_LOCK = 7_406_130_001  # advisory lock id: one migrator at a time across processes


def like_escape(text: str) -> str:
    """`text` with LIKE's wildcards and escape character escaped, to match it literally."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def as_array(value) -> np.ndarray:
    """A vector column's value as a float32 array (pgvector's adapter returns a `Vector` or an array)."""
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)


def copy_rows(cur: psycopg.Cursor, target: str, types: Sequence[str], rows: Iterable[tuple]) -> None:
    """COPY `rows` into `target` ("table (columns)") in binary form, the columns of PostgreSQL
    `types`: pgvector's text form costs ~0.25 ms of Python per 384-d vector, its binary form ~3 µs."""
    with cur.copy(sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(sql.SQL(target))) as copy:
        copy.set_types(list(types))
        for row in rows:
            copy.write_row(row)


def migration_files(sql_dir: Path = SQL_DIR) -> list[tuple[int, Path]]:
    """`NNN_name.sql` files in order."""
    files = []
    for path in sorted(sql_dir.glob("*.sql")):
        match = re.match(r"^(\d+)_", path.name)
        if match:
            files.append((int(match.group(1)), path))
    return files


def apply_migrations(conn: psycopg.Connection, sql_dir: Path = SQL_DIR) -> list[str]:
    """Apply each migration once (recorded in `rag_schema_migrations`), each in its own transaction
    under a transaction-level advisory lock: one migrator at a time across processes, and nothing
    held on the session, which PgBouncer's transaction pooling would hand to another client."""
    applied_now: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        # checked first: CREATE TABLE IF NOT EXISTS needs CREATE on the schema even when the table exists
        if conn.execute("SELECT to_regclass('rag_schema_migrations')").fetchone()[0] is None:
            conn.execute(
                "CREATE TABLE rag_schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
    done = {row[0] for row in conn.execute("SELECT version FROM rag_schema_migrations")}
    for version, path in migration_files(sql_dir):
        if version in done:
            continue
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            if conn.execute("SELECT 1 FROM rag_schema_migrations WHERE version = %s", (version,)).fetchone():
                continue  # another process applied it while we waited for the lock
            conn.execute(path.read_text())
            conn.execute(
                "INSERT INTO rag_schema_migrations (version, name) VALUES (%s, %s)", (version, path.name)
            )
        applied_now.append(path.name)
        log.info("applied migration %s", path.name)
    return applied_now


def check_vector_extension(conn: psycopg.Connection) -> None:
    """Raise `AdminRequiredError` when pgvector is missing and this role cannot create it itself
    (pgvector is not a trusted extension: only a superuser may run CREATE EXTENSION vector)."""
    if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
        return
    db, user, superuser = conn.execute(
        "SELECT current_database(), current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    available = conn.execute(
        """SELECT v.trusted FROM pg_available_extensions a
           JOIN pg_available_extension_versions v ON v.name = a.name AND v.version = a.default_version
           WHERE a.name = 'vector'""").fetchone()
    if available is None:
        raise AdminRequiredError(
            f"the pgvector extension is not installed on the server of database {db}: an administrator must "
            f"install pgvector (e.g. package postgresql-NN-pgvector) and run `CREATE EXTENSION vector;` in {db}")
    may_create = conn.execute("SELECT has_database_privilege(current_database(), 'CREATE')").fetchone()[0]
    if superuser or (available[0] and may_create):
        return  # migration 001 creates it
    raise AdminRequiredError(
        f"extension vector is missing in database {db} and role {user} is not allowed to create it: an "
        f"administrator must connect to {db} as a superuser and run `CREATE EXTENSION vector;` once")


def _privilege_error(conn: psycopg.Connection, exc: psycopg.Error) -> AdminRequiredError:
    db, user = conn.execute("SELECT current_database(), current_user").fetchone()
    return AdminRequiredError(
        f"role {user} may not create the schema in database {db} ({str(exc).strip()}): an administrator must "
        f"run `ALTER DATABASE {db} OWNER TO {user};` (or `GRANT CREATE ON SCHEMA public TO {user};`), "
        f"or apply the migrations once as the owner")


def library_url(settings: Settings) -> str:
    """URL of the library's database: `RAG_DATABASE_URL`, or database `rag` on the embedded server."""
    if settings.database_url:
        return check_url(settings.database_url, "database_url ($RAG_DATABASE_URL)")
    url = database_url(settings, dbname=LIBRARY_DB)
    ensure_database(database_url(settings), LIBRARY_DB)
    return url


def ensure_database(admin_url: str, name: str, event_log: bool = False) -> None:
    """Create database `name` if missing; safe when several processes do it at once (`rag dev` and
    `rag materialize` on a fresh home). A role that may not create databases gets
    `AdminRequiredError` naming the statement an administrator must run.
    `event_log`: the database holds an event log (Dagster's), whose commits need not wait for the
    disk: `synchronous_commit = off` there (a crash can lose the last fraction of a second of events,
    never corrupt them), which makes a many-partition run's thousands of event writes several
    times cheaper. The library's own database keeps synchronous commits."""
    with psycopg.connect(admin_url, autocommit=True, prepare_threshold=None) as conn:
        _create_database(conn, name)
        if event_log:
            _relax_commits(conn, name)


def _create_database(conn: psycopg.Connection, name: str) -> None:
    exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    if not exists:
        try:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
            # CREATE DATABASE cannot run in a transaction (so under no transaction-level lock):
            # a concurrent creator committed it first, and it exists as wanted
            log.debug("database %s was created by a concurrent process", name)
        except psycopg.errors.InsufficientPrivilege as exc:
            user = conn.execute("SELECT current_user").fetchone()[0]
            raise AdminRequiredError(
                f"database {name} does not exist and role {user} may not create it: an administrator must run "
                f"`CREATE DATABASE {name} OWNER {user};` (or point DAGSTER_PG_URL at an existing database)"
            ) from exc


def _relax_commits(conn: psycopg.Connection, name: str) -> None:
    """`synchronous_commit = off` as database `name`'s default, unless already set (needs ownership).
    Checked and set under a transaction-level advisory lock: two processes that both saw it unset
    both inserted its pg_db_role_setting row, and the second failed with a UniqueViolation."""
    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"database settings\x1f{name}",))
            already = conn.execute(
                "SELECT 1 FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase"
                " WHERE d.datname = %s AND s.setrole = 0 AND 'synchronous_commit=off' = ANY(s.setconfig)", (name,)
            ).fetchone()
            if not already:
                conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET synchronous_commit = off").format(
                    psycopg.sql.Identifier(name)))
    except psycopg.errors.InsufficientPrivilege:
        log.warning("database %s keeps synchronous commits (this role does not own it); Dagster runs with many "
                    "partitions write their events more slowly. An owner may run "
                    "`ALTER DATABASE %s SET synchronous_commit = off`.", name, name)


def application_name() -> str:
    """This process as pg_stat_activity names it (`rag ingest`, `dagster-daemon run`): `rag db stop`
    names the commands still connected."""
    words = [Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"]
    words += [a for a in sys.argv[1:] if not a.startswith("-")][:1]
    return " ".join(words)[:63]


class _PoolWarningsToLog(logging.Filter):
    """psycopg_pool's warnings ("error connecting in 'rag_lib'", "discarding closed connection", ten
    of them as a server stops) go to our log at INFO, not bare on stderr: a command that loses its
    database says so in one line, a pool that reconnects needs no word."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        log.info("%s: %s", record.name, record.getMessage())
        return False


logging.getLogger("psycopg.pool").addFilter(_PoolWarningsToLog())


class Connections:
    """Owns the pool. Created once per process (or per test) and shared by every store method."""

    def __init__(self, settings: Settings, read_url: str | None = None):
        """The library's database (migrated on open); or, with `read_url`, a read-only pool on that
        server (a replica: `search.database_url`), never migrated nor written."""
        self.settings = settings
        self.read_only = read_url is not None
        try:
            if read_url is not None:
                self.url = check_url(read_url, "search.database_url ($RAG_SEARCH__DATABASE_URL)")
                with psycopg.connect(self.url, autocommit=True, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1")
            else:
                self.url = library_url(settings)
                # no prepared statements: a transaction-mode PgBouncer would hand them to other clients
                with psycopg.connect(self.url, autocommit=True, prepare_threshold=None) as conn:
                    check_vector_extension(conn)
                    try:
                        apply_migrations(conn)
                    except psycopg.errors.InsufficientPrivilege as exc:
                        raise _privilege_error(conn, exc) from exc
        except psycopg.OperationalError as exc:
            which = "the search database (search.database_url)" if read_url is not None else "the database"
            raise DatabaseError(f"cannot connect to {which}: {scrub_secrets(str(exc))}".strip()) from exc
        self.pool = ConnectionPool(
            self.url,
            min_size=1,
            max_size=settings.pool_max_size,
            configure=register_vector,
            # No server-side prepared statements: after 5 runs psycopg would prepare a query and
            # PostgreSQL may switch to a generic plan that cannot see a filter's selectivity; one
            # such plan turned a 1 ms index-only count into a 45 ms sequential scan.
            kwargs={"prepare_threshold": None, "application_name": application_name()},
            open=True,
            name="rag_lib_search" if self.read_only else "rag_lib",
        )

    @property
    def gone(self) -> bool:
        """Whether this pool's database was seen gone (and not answering since)."""
        return self in _GONE

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """A pooled connection; after the database was seen gone, a short wait for one, not 30 s."""
        try:
            with self.pool.connection(timeout=GONE_WAIT_SECONDS if self.gone else None) as conn:
                _GONE.discard(self)  # the database answers again
                try:
                    yield conn
                except Exception as exc:
                    self._note(exc)  # before the pool warns of the broken connection given back
                    raise
        except Exception as exc:
            self._note(exc)
            raise

    def _note(self, exc: Exception) -> None:
        from psycopg_pool import PoolTimeout

        # a PoolTimeout with connections in the pool is a busy server, not a gone one
        busy = isinstance(exc, PoolTimeout) and self.pool.get_stats().get("pool_size", 0) > 0
        if database_gone(exc) and not busy and not self.gone:
            log.info("the database of pool %s is gone (%s): later connections are waited for %.0f s",
                     self.pool.name, type(exc).__name__, GONE_WAIT_SECONDS)
            _GONE.add(self)

    @contextmanager
    def reading(self) -> Iterator[psycopg.Connection]:
        """A pooled connection in autocommit for reads that need no transaction: each statement is
        one round trip, where a transaction adds a BEGIN and a COMMIT (three per search query)."""
        with self.connection() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                if not conn.broken:  # a broken one is discarded by the pool
                    conn.autocommit = False

    @contextmanager
    def pipelined(self) -> Iterator[psycopg.Connection]:
        """A pooled connection in pipeline mode: the block's statements go to the server together and
        their results come back in one round trip, at the end of the block (read the cursors after
        it). They run as one transaction, the pipeline's implicit one (autocommit: no BEGIN nor
        COMMIT), so `set_config(..., true)` holds for the statements after it and ends with them;
        after an error the rest are skipped and the connection is idle again. A `transaction()`
        inside a pipeline would cost four round trips: psycopg syncs on entering and leaving it."""
        with self.reading() as conn, conn.pipeline():
            yield conn

    def fill(self) -> None:
        """Open every connection the pool may hold now, and keep them (a server's): otherwise the pool
        grows one connection at a time while requests queue for one, in every burst after an idle spell."""
        self.pool.resize(min_size=self.pool.max_size)
        self.pool.wait()

    def close(self) -> None:
        # a gone database's pool has nothing to wait for: its workers only retry connecting
        self.pool.close(timeout=0.5 if self.gone else 5.0)
        _GONE.discard(self)
