"""Serving commands: `rag serve` (HTTP API) and `rag mcp` (MCP tools over stdio or HTTP)."""

from __future__ import annotations

from typing import Optional

import typer
from typer.core import TyperCommand

from rag_lib.cli.app import app


class _McpCommand(TyperCommand):
    """`rag mcp --help` lists the tools the server serves, read from the server when help is shown
    (building it costs the MCP SDK import, which other commands should not pay)."""

    def format_help(self, ctx, formatter) -> None:
        from rich.markup import escape

        from rag_lib.mcp_server import tool_list

        writes = {name for name, _ in tool_list()} - {name for name, _ in tool_list(read_only=True)}
        lines = [f"{name}{' (not with --read-only)' if name in writes else ''}: {escape(text)}"
                 for name, text in tool_list()]
        self.epilog = "Tools served:\n\n" + "\n\n".join(lines)
        super().format_help(ctx, formatter)


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default settings.server.host, "
                                       "127.0.0.1). Non-loopback needs API keys."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="Port (default settings.server.port, 8081)."),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning | error"),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Server processes (default "
                                          "settings.server.workers, 1); each loads the model."),
) -> None:
    """Run the HTTP API (FastAPI + uvicorn). Keys come from $RAG_API_KEYS / $RAG_API_READ_ONLY_KEYS."""
    import os

    from rag_lib.config import get_settings
    from rag_lib.server import serve as run

    if workers is not None:  # through the environment, which the worker processes read too
        os.environ["RAG_SERVER__WORKERS"] = str(workers)
        get_settings.cache_clear()
    run(host=host, port=port, log_level=log_level)


@app.command("mcp", cls=_McpCommand)
def mcp_command(
    transport: str = typer.Option("stdio", "--transport", "-t", help="stdio | http (streamable HTTP at /mcp)."),
    host: Optional[str] = typer.Option(None, "--host", help="HTTP only: address to bind."),
    port: Optional[int] = typer.Option(None, "--port", min=1, max=65535, help="HTTP only: port."),
    read_only: bool = typer.Option(False, "--read-only", help="Leave out the rag_embed tool."),
) -> None:
    """Run the MCP server (also `python -m rag_lib.mcp_server`); the tools it serves are listed below."""
    from rag_lib.mcp_server import run_mcp

    run_mcp(transport=transport, host=host, port=port, read_only=read_only)
