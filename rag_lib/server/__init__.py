"""HTTP API (FastAPI) over the knowledge base: `create_app()` builds it, `serve()` runs it."""

from __future__ import annotations

from rag_lib.config import Settings, get_settings
from rag_lib.server.app import create_app
from rag_lib.server.security import KeyRing, check_bind


def serve(settings: Settings | None = None, host: str | None = None, port: int | None = None,
          log_level: str = "info") -> None:
    """Run the API with uvicorn (one process; sync routes use its threadpool). Refuses a
    non-loopback address when no API key is configured."""
    import uvicorn

    from rag_lib.log import setup_server_logging

    settings = settings or get_settings()
    host = host or settings.server.host
    port = port if port is not None else settings.server.port
    keys = KeyRing.from_env(settings)
    check_bind(host, keys)
    setup_server_logging(log_level)
    app = create_app(settings, keys=keys, bind=(host, port))
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False, log_level=log_level.lower(),
                server_header=False, **proxy_options(settings))


def proxy_options(settings: Settings) -> dict:
    """uvicorn's proxy-header options: X-Forwarded-* are believed only from settings.server.trusted_proxies
    (uvicorn's own default trusts 127.0.0.1, so any local process could forge the logged client)."""
    trusted = settings.server.trusted_proxies
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": ",".join(trusted) if trusted else ""}


__all__ = ["create_app", "proxy_options", "serve"]
