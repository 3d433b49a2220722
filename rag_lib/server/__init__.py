"""HTTP API (FastAPI) over the knowledge base: `create_app()` builds it, `serve()` runs it."""

from __future__ import annotations

import functools
import os
import socket
import sys

from rag_lib.config import Settings, get_settings
from rag_lib.errors import ConfigError
from rag_lib.server.app import create_app
from rag_lib.server.security import KeyRing, check_bind


def serve(settings: Settings | None = None, host: str | None = None, port: int | None = None,
          log_level: str = "info") -> None:
    """Run the API with uvicorn: `server.workers` processes (default one; sync routes use each one's
    threadpool). Refuses a non-loopback address when no API key is configured."""
    import uvicorn

    from rag_lib.log import setup_server_logging

    explicit = settings is not None
    settings = settings or get_settings()
    host = host or settings.server.host
    port = port if port is not None else settings.server.port
    keys = KeyRing.from_env(settings)
    check_bind(host, keys)
    setup_server_logging(log_level)
    options = dict(host=host, port=port, log_config=None, access_log=False, log_level=log_level.lower(),
                   server_header=False, **proxy_options(settings))
    workers = settings.server.workers
    if workers == 1:
        uvicorn.run(create_app(settings, keys=keys, bind=(host, port)), **options)
        return
    if explicit:
        raise ConfigError("server.workers > 1 starts fresh processes, which read their settings from rag.yaml "
                         "and the environment: call serve() without settings, or with workers 1")
    # each worker process builds its app from the environment, told the address and log level here
    os.environ.update({"RAG_SERVER__HOST": host, "RAG_SERVER__PORT": str(port), _LOG_LEVEL_ENV: log_level})
    if not hasattr(socket, "SO_REUSEPORT") or not sys.platform.startswith("linux"):
        uvicorn.run("rag_lib.server:worker_app", factory=True, workers=workers, **options)
        return
    from uvicorn.supervisors import Multiprocess

    # uvicorn's own supervisor (health checks, restarts, signals), but each worker listens on a
    # socket of its own: see WorkerSocket
    config = uvicorn.Config("rag_lib.server:worker_app", factory=True, workers=workers,
                            timeout_worker_healthcheck=HEALTHCHECK_SECONDS, **options)
    Multiprocess(config, sockets=[WorkerSocket.reserve(host, port)]).run()


# How long uvicorn's supervisor waits for a worker to answer its health check before killing it and
# starting another (uvicorn's default: 5 s). A worker answers from a thread that starts only once the
# process has imported uvicorn: on a busy 2-core machine that took over 5 s, so workers were killed
# while starting, each time loading the model again, and one served alone meanwhile. Not much more:
# the supervisor handles a stop signal only between checks, so a hung worker delays stopping by this.
HEALTHCHECK_SECONDS = 20


class WorkerSocket(socket.socket):
    """The port, reserved in the supervisor, and re-bound by each worker process to a listening
    socket of its own (SO_REUSEPORT), so the kernel spreads new connections over the workers.

    On one shared socket (uvicorn's way) the worker whose event loop wakes first accepts every
    connection waiting, so 8 clients connecting together landed 8/0, 6/2, 6/2, 7/1, 6/2, 7/1 (six
    trials): the busier worker's Python ran most searches on one core while the other idled. With a socket per worker the kernel picks one per connection by a hash of its addresses.
    uvicorn hands its sockets to the workers it spawns by pickling them: this one pickles as the
    address, and unpickles in the worker as a new socket bound to it (which uvicorn then listens on)."""

    @classmethod
    def reserve(cls, host: str, port: int) -> WorkerSocket:
        """Bound, not listening: the kernel hands connections only to the workers' listening sockets.
        A port already taken fails here, once, not in every worker uvicorn restarts; a plain bind
        first, as SO_REUSEPORT alone would let a second `rag serve` share the port unnoticed."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = cls(family, socket.SOCK_STREAM)
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
                probe.bind((host, port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}; choose another --port "
                              f"(server.port) or stop what uses it") from exc
        return sock

    def __reduce__(self):
        # stdlib only: a worker unpickles this before uvicorn's health-check thread starts, and
        # importing rag_lib there took over uvicorn's 5 s limit on a busy machine (workers killed)
        host, port = self.getsockname()[:2]
        return functools.partial(socket.create_server, family=self.family, reuse_port=True), ((host, port),)


_LOG_LEVEL_ENV = "RAG_SERVE_LOG_LEVEL"


def worker_app():
    """The app of one `rag serve` worker process (uvicorn's factory when server.workers > 1)."""
    from rag_lib.log import setup_server_logging

    setup_server_logging(os.environ.get(_LOG_LEVEL_ENV, "info"))
    settings = get_settings()
    return create_app(settings, keys=KeyRing.from_env(settings), bind=(settings.server.host, settings.server.port))


def proxy_options(settings: Settings) -> dict:
    """uvicorn's proxy-header options: X-Forwarded-* are believed only from settings.server.trusted_proxies
    (uvicorn's own default trusts 127.0.0.1, so any local process could forge the logged client)."""
    trusted = settings.server.trusted_proxies
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": ",".join(trusted) if trusted else ""}


__all__ = ["WorkerSocket", "create_app", "proxy_options", "serve", "worker_app"]
