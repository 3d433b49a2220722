"""Serving commands: `rag serve` (HTTP API) and `rag mcp` (MCP tools over stdio or HTTP)."""

from __future__ import annotations

from typing import Optional

import typer

from rag_lib.cli.app import app


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default settings.server.host, "
                                       "127.0.0.1). Non-loopback needs API keys."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default settings.server.port, 8081)."),
    log_level: str = typer.Option("info", "--log-level", help="debug | info | warning | error"),
) -> None:
    """Run the HTTP API (FastAPI + uvicorn). Keys come from $RAG_API_KEYS / $RAG_API_READ_ONLY_KEYS."""
    from rag_lib.server import serve as run

    run(host=host, port=port, log_level=log_level)


@app.command("mcp")
def mcp_command(
    transport: str = typer.Option("stdio", "--transport", "-t", help="stdio | http (streamable HTTP at /mcp)."),
    host: Optional[str] = typer.Option(None, "--host", help="HTTP only: address to bind."),
    port: Optional[int] = typer.Option(None, "--port", help="HTTP only: port."),
    read_only: bool = typer.Option(False, "--read-only", help="Leave out the rag_embed tool."),
) -> None:
    """Run the MCP server: tools rag_search, rag_similar, rag_context, rag_embed, rag_status, rag_list."""
    from rag_lib.mcp_server import run_mcp

    run_mcp(transport=transport, host=host, port=port, read_only=read_only)
