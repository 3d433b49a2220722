"""An OpenAI-compatible chat-completions server on 127.0.0.1 for tests of the RAGAS judge and the
query expander: `reply(system, user)` writes each answer, every request is kept in `requests`,
and with `fail` every request gets a 500."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatStub:
    def __init__(self, reply: Callable[[str, str], str], fail: bool = False) -> None:
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                stub.requests.append(request)
                if fail:
                    self.send_response(500)
                    self.end_headers()
                    return
                system, user = (m["content"] for m in request["messages"][:2])
                body = json.dumps({
                    "id": "chat-1", "object": "chat.completion", "created": 0, "model": request["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": reply(system, user)}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ChatStub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
