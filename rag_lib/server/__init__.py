"""HTTP API (FastAPI) over the knowledge base: `create_app()` builds it, `serve()` runs it."""

from __future__ import annotations

import os

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
    uvicorn.run("rag_lib.server:worker_app", factory=True, workers=workers, **options)


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


__all__ = ["create_app", "proxy_options", "serve", "worker_app"]
