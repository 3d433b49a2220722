"""The server's databases (the library's `rag`, Dagster's `dagster`) are created on first use, and
first use may be several `rag` processes at once on a fresh home (`rag dev` beside `rag
materialize`, a poller): each of them must find the database ready, none may fail."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from rag_lib.store.connection import _relax_commits, ensure_database

STARTERS = 4  # processes starting at once


def _start_at_once(admin_url: str, name: str, event_log: bool) -> tuple[list[threading.Thread], list[BaseException]]:
    """STARTERS threads released together, each calling `ensure_database` for `name` on a connection
    named `name` (to find them in pg_stat_activity); the threads and the list their errors go to."""
    url = make_conninfo(admin_url, application_name=name)
    barrier = threading.Barrier(STARTERS)
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            ensure_database(url, name, event_log=event_log)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(STARTERS)]
    for t in threads:
        t.start()
    return threads, errors


def _wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)  # polling the server for a state, not a sleep standing in for one


def _waiting_on_locks(conn: psycopg.Connection, name: str) -> int:
    """How many of the starters named `name` wait for a lock (a transaction's or an advisory one)."""
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
                        " AND wait_event_type = 'Lock'", (name,)).fetchone()[0]


def _settings_of(conn: psycopg.Connection, name: str) -> list[tuple]:
    """One row per database `name`: its own default settings (NULL for none)."""
    return conn.execute(
        "SELECT s.setconfig FROM pg_database d LEFT JOIN pg_db_role_setting s"
        " ON s.setdatabase = d.oid AND s.setrole = 0 WHERE d.datname = %s", (name,)).fetchall()


def test_processes_configuring_the_new_dagster_database_at_once_all_succeed(pg_server):
    """Before: starters that saw `synchronous_commit` still unset on the new database while another
    one was setting it each ran ALTER DATABASE … SET too, and failed with a raw UniqueViolation on
    pg_db_role_setting. Deterministic: the other one is held just before its commit until every
    starter waits on it."""
    name = f"race_{uuid.uuid4().hex[:8]}"
    ensure_database(pg_server, name)  # created, not yet configured
    with psycopg.connect(pg_server) as other, psycopg.connect(pg_server, autocommit=True) as watch:
        other.execute("SELECT 1")  # a transaction left open: its settings are not committed yet
        _relax_commits(other, name)
        threads, errors = _start_at_once(pg_server, name, event_log=True)
        _wait_until(lambda: _waiting_on_locks(watch, name) == STARTERS)
        other.commit()
        for t in threads:
            t.join()
        assert not errors, [repr(e) for e in errors]
        assert _settings_of(watch, name) == [(["synchronous_commit=off"],)]


@pytest.mark.parametrize("event_log", [True, False], ids=["dagster", "library"])
def test_processes_creating_a_database_at_once_all_succeed(pg_server, event_log):
    """All starters reach CREATE DATABASE together: one creates it, the others find it made."""
    name = f"race_{uuid.uuid4().hex[:8]}"
    threads, errors = _start_at_once(pg_server, name, event_log)
    for t in threads:
        t.join()
    assert not errors, [repr(e) for e in errors]
    with psycopg.connect(pg_server) as conn:
        # created once; the event log's database has its relaxed commits, the library's keeps the default
        assert _settings_of(conn, name) == [(["synchronous_commit=off"] if event_log else None,)]
