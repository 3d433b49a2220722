"""Connections (one psycopg pool with the pgvector adapter) and numbered SQL migrations."""

from __future__ import annotations

import re
from contextlib import contextmanager
from collections.abc import Iterator
from pathlib import Path

import psycopg
from pgvector.psycopg import register_vector
from psycopg_pool import ConnectionPool

from rag_lib.config import Settings
from rag_lib.db import database_url
from rag_lib.errors import DatabaseError
from rag_lib.log import get_logger

log = get_logger(__name__)

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
MIGRATION_LOCK = 7_406_130_001  # advisory lock id: one migrator at a time across processes
LIBRARY_DB = "rag"


def like_escape(text: str) -> str:
    """`text` with LIKE's wildcards and escape character escaped, to match it literally."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def migration_files(sql_dir: Path = SQL_DIR) -> list[tuple[int, Path]]:
    """`NNN_name.sql` files in order."""
    files = []
    for path in sorted(sql_dir.glob("*.sql")):
        match = re.match(r"^(\d+)_", path.name)
        if match:
            files.append((int(match.group(1)), path))
    return files


def apply_migrations(conn: psycopg.Connection, sql_dir: Path = SQL_DIR) -> list[str]:
    """Apply each migration once (recorded in `rag_schema_migrations`) under an advisory lock."""
    applied_now: list[str] = []
    conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK,))
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS rag_schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT version FROM rag_schema_migrations")}
        for version, path in migration_files(sql_dir):
            if version in done:
                continue
            with conn.transaction():
                conn.execute(path.read_text())
                conn.execute(
                    "INSERT INTO rag_schema_migrations (version, name) VALUES (%s, %s)", (version, path.name)
                )
            applied_now.append(path.name)
            log.info("applied migration %s", path.name)
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK,))
    return applied_now


def library_url(settings: Settings) -> str:
    """URL of the library's database: `RAG_DATABASE_URL`, or database `rag` on the embedded server."""
    if settings.database_url:
        return settings.database_url
    url = database_url(settings, dbname=LIBRARY_DB)
    ensure_database(database_url(settings), LIBRARY_DB)
    return url


def ensure_database(admin_url: str, name: str) -> None:
    """Create database `name` if missing (a concurrent creator is fine)."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            try:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                pass


class Connections:
    """Owns the pool. Created once per process (or per test) and shared by every store method."""

    def __init__(self, settings: Settings):
        self.settings = settings
        try:
            self.url = library_url(settings)
            with psycopg.connect(self.url, autocommit=True) as conn:
                apply_migrations(conn)
        except psycopg.OperationalError as exc:
            raise DatabaseError(f"cannot connect to the database: {exc}".strip()) from exc
        self.pool = ConnectionPool(
            self.url,
            min_size=1,
            max_size=settings.pool_max_size,
            configure=register_vector,
            # No server-side prepared statements: after 5 runs psycopg would prepare a query and
            # PostgreSQL may switch to a generic plan that cannot see a filter's selectivity; one
            # such plan turned a 1 ms index-only count into a 45 ms sequential scan.
            kwargs={"prepare_threshold": None},
            open=True,
            name="rag_lib",
        )

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        with self.pool.connection() as conn:
            yield conn

    def close(self) -> None:
        self.pool.close()
