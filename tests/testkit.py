"""Helpers for tests and benchmarks: a scratch database, a free loopback port, a clean environment
for a child `rag` process, a `rag serve` / `rag mcp --transport http` child that is waited for
and stopped, and a second embedding space made from the local model (`RotatedProvider`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import numpy as np
import psycopg

from rag_lib.embedding import EmbeddingProvider

RAG = str(Path(sys.executable).with_name("rag"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def create_database(admin_url: str, name: str | None = None, template: str | None = None) -> str:
    """URL of database `name` (default: a new unique `t_<hex>`) on the server behind `admin_url`,
    created when missing, as a copy of `template` when that exists."""
    name = name or "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = lambda db: conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,)).fetchone()  # noqa: E731
        if exists(name) is None:
            if template and exists(template):
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
            else:
                conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.replace("/postgres?", f"/{name}?", 1)


@contextmanager
def scratch_database(admin_url: str, template: str | None = None) -> Iterator[str]:
    """URL of a new database (a copy of `template` when given) that is dropped when the block ends,
    closing whatever still holds it: a run's hundreds of test databases (24 MB each with the warm
    cache, 63 MB with the shared corpus) otherwise filled 12 GB of disk by its end."""
    name = "t_" + uuid.uuid4().hex[:12]
    try:
        yield create_database(admin_url, name, template)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def child_env(database_url: str, home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any `RAG_*` setting, pointed at `database_url` and `home`,
    offline, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(RAG_DATABASE_URL=database_url, RAG_HOME=str(home), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", **extra)
    return env


@dataclass
class ServerProcess:
    """A running `rag` server child; `url` is its base URL."""

    proc: subprocess.Popen
    url: str
    log_path: Path
    _log: IO[str] = field(repr=False)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout: float = 15) -> None:
        """Terminate, then kill if it does not exit within `timeout` seconds."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


def start_server(args: Sequence[str], env: dict[str, str], log_path: Path, *, host: str = "127.0.0.1",
                 port: int | None = None, health: str | None = "/health", timeout: float = 480) -> ServerProcess:
    """Run `rag <args> --host <host> --port <port>` and wait until `health` answers 200 (`None`: until
    any HTTP answer, for `rag mcp`). The wait is long: importing and loading the model on a busy
    2-core machine takes minutes. Raises RuntimeError with the log's tail if it dies or never answers."""
    port = port or free_port(host)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")
    proc = subprocess.Popen([RAG, *args, "--host", host, "--port", str(port)], env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    server = ServerProcess(proc, f"http://{host}:{port}", log_path, log)
    deadline = time.monotonic() + timeout
    while True:
        try:
            r = httpx.get(server.url + (health or "/"), timeout=2)
            if health is None or r.status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if not server.alive() or time.monotonic() > deadline:
            server.stop(timeout=5)
            raise RuntimeError(f"`rag {' '.join(args)}` did not start: {server.log_tail()}")
        time.sleep(0.3)


def sensor_tick(instance, rag, cursor):
    """Evaluate the corpus sensor and apply its partition requests as the daemon would."""
    from dagster import AddDynamicPartitionsRequest, build_sensor_context

    from pipelines.sensors import corpus_sensor

    with build_sensor_context(instance=instance, cursor=cursor, resources={"rag": rag}) as context:
        result = corpus_sensor(context)
    for req in result.dynamic_partitions_requests or []:
        if isinstance(req, AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
        else:
            for key in req.partition_keys:
                instance.delete_dynamic_partition(req.partitions_def_name, key)
    return result


def exited_pid() -> int:
    """The pid of a process that ran and exited."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def started_run(instance, job_name: str, tags: dict[str, str], pid: int, host: str | None = None):
    """A run of `job_name`, STARTED, whose process `pid` on `host` (this machine) reported itself as
    a run worker does (a run whose process is gone: `exited_pid()`)."""
    from dagster import DagsterRunStatus
    from dagster._core.events import EngineEventData  # test-only private name: what a run worker reports

    from pipelines.definitions import defs
    from pipelines.workers import WORKER_HOST_TAG

    run = instance.create_run_for_job(defs.resolve_job_def(job_name), status=DagsterRunStatus.STARTED,
                                      tags={**tags, WORKER_HOST_TAG: host or socket.gethostname()})
    instance.report_engine_event(f"Started process for run (pid: {pid}).", run, EngineEventData.in_process(pid))
    return instance.get_run_by_id(run.run_id)


def payload(result) -> dict:
    """An MCP tool call's result as a dict (its structured content, else its JSON text)."""
    assert not result.is_error, result.content
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


def error_text(result) -> str:
    """An MCP tool call's error message (the call must have failed)."""
    assert result.is_error, result.content
    return " ".join(getattr(c, "text", "") for c in result.content)


def round_trips(path: Path, call):
    """(`call()`, the round trips to the server it made): the server's ReadyForQuery messages (one
    ends each round trip) in libpq's protocol trace of every connection that executed a statement."""
    from psycopg import pq

    traced: list[psycopg.Connection] = []
    execute = psycopg.Connection.execute
    with open(path, "w") as log:
        def tracing(conn, query, params=None, **kw):
            if all(c is not conn for c in traced):
                conn.pgconn.trace(log.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
                traced.append(conn)
            return execute(conn, query, params, **kw)

        psycopg.Connection.execute = tracing
        try:
            result = call()
        finally:
            psycopg.Connection.execute = execute
            for conn in traced:
                conn.pgconn.untrace()  # flushes the trace
    return result, path.read_text().count("\tReadyForQuery")


class RotatedProvider(EmbeddingProvider):
    """The local model's vectors turned by a fixed orthogonal rotation: another space in which every
    cosine equals the local model's, i.e. a model change that changes nothing retrieval sees."""

    def __init__(self, base: EmbeddingProvider):
        self.base, self.name, self.model, self.dimensions = base, "rotated", "rotated-minilm", base.dimensions
        q, _ = np.linalg.qr(np.random.default_rng(3).standard_normal((base.dimensions, base.dimensions)))
        self.rotation = q.astype(np.float32)

    def tokenizer(self):
        return self.base.tokenizer()

    def embed(self, texts: list[str]) -> np.ndarray:
        return (self.base.embed(texts) @ self.rotation.T).astype(np.float32)


def ingest_fixture(kb, root: Path, files: dict[str, object]) -> None:
    """Write `files` under `root` (a mapping as YAML, a string as it is) and ingest them; none may fail."""
    import yaml

    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False),
                        encoding="utf-8")
    report = kb.ingest([root], root=root)
    assert report.count("failed") == 0, report
