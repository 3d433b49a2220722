"""The Postgres-backed Dagster instance: DAGSTER_HOME under the rag home, dagster.yaml from the
repo, and DAGSTER_PG_URL pointing at database `dagster` on the library's server."""

from __future__ import annotations

import os
import shutil
import weakref
from pathlib import Path

from rag_lib.config import Settings
from rag_lib.db import database_url
from rag_lib.store.connection import ensure_database

REPO = Path(__file__).resolve().parents[1]
DAGSTER_YAML = REPO / "dagster.yaml"
WORKSPACE_YAML = REPO / "workspace.yaml"
DAGSTER_DB = "dagster"
# Dagster's Postgres storage opens a new connection for every event it writes (NullPool) and
# writes a step's per-partition materializations one at a time unless batching is on: a
# many-file step paid two connections per file per asset. Batches are opt-in in Dagster OSS.
EVENT_BATCH_SIZE = "500"


def sqlalchemy_url(libpq_url: str, dbname: str) -> str:
    """`postgresql+psycopg2://…` for `dbname` on the server of a libpq URL (unix sockets go in ?host=)."""
    from psycopg.conninfo import conninfo_to_dict
    from sqlalchemy.engine import URL

    info = conninfo_to_dict(libpq_url)
    host = info.get("host")
    socket = bool(host and str(host).startswith("/"))
    url = URL.create(
        "postgresql+psycopg2",
        username=info.get("user") or None,
        password=info.get("password") or None,
        host=None if socket else host,
        port=int(info["port"]) if info.get("port") and not socket else None,
        database=dbname,
        query={"host": host, **({"port": str(info["port"])} if info.get("port") else {})} if socket else {},
    )
    return url.render_as_string(hide_password=False)


def dagster_pg_url(settings: Settings) -> str:
    """DAGSTER_PG_URL if set; else database `dagster` on the library's server (started, created)."""
    if os.environ.get("DAGSTER_PG_URL"):
        return os.environ["DAGSTER_PG_URL"]
    admin = database_url(settings, dbname="postgres")
    ensure_database(admin, DAGSTER_DB, event_log=True)
    return sqlalchemy_url(admin, DAGSTER_DB)


def prepare_dagster_home(settings: Settings, home: Path | None = None) -> Path:
    """Create DAGSTER_HOME with the repo's dagster.yaml and export DAGSTER_HOME / DAGSTER_PG_URL."""
    home = (home or settings.home / "dagster_home").resolve()
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if not target.exists() or target.read_bytes() != DAGSTER_YAML.read_bytes():
        # written beside and renamed: a process starting at the same moment reads the old file or the
        # new one, never half of it
        partial = target.with_name(f".dagster.yaml.{os.getpid()}.tmp")
        shutil.copyfile(DAGSTER_YAML, partial)
        os.replace(partial, target)
    os.environ["DAGSTER_PG_URL"] = dagster_pg_url(settings)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def tune_event_writes(instance=None) -> None:
    """Batch a step's per-partition event writes (this process and the ones it starts) and, given
    an instance, keep its storage connections open instead of one connection per event (what
    dagster-webserver does for its own instance). Planned materializations are batched by the
    event log storage dagster.yaml names (pipelines/event_log.py)."""
    os.environ.setdefault("DAGSTER_EVENT_BATCH_SIZE", EVENT_BATCH_SIZE)
    if instance is not None and instance not in _POOLED:
        # 0 = no statement timeout for runs
        instance.optimize_for_webserver(statement_timeout=0, pool_recycle=3600, max_overflow=10)
        _POOLED.add(instance)


# instances whose connections are pooled already (a run worker's resource sets up once per step)
_POOLED: weakref.WeakSet = weakref.WeakSet()


def get_instance(settings: Settings, home: Path | None = None):
    """The Postgres-backed instance (creating DAGSTER_HOME and database `dagster` if needed)."""
    from dagster import DagsterInstance

    prepare_dagster_home(settings, home)
    instance = DagsterInstance.get()
    tune_event_writes(instance)
    return instance
