"""A `/rerank` server for tests on 127.0.0.1, in Hugging Face TEI's shape (`{query, texts}` →
`[{index, score}]`) or Cohere's (`{results: [{index, relevance_score}]}`). A text scores the number
of query words it contains. Faults are scripted one per request: "429" (with Retry-After), "500",
"slow" (sleep past the client's timeout), "short" (one score too few), "ok"."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def stub_score(query: str, text: str) -> float:
    words = {w for w in query.lower().split() if len(w) > 2}
    return float(sum(1 for w in words if w in text.lower()))


class RerankStub:
    def __init__(self, shape: str = "tei", retry_after: str = "0.2", slow_seconds: float = 1.5):
        self.shape = shape
        self.retry_after = retry_after
        self.slow_seconds = slow_seconds
        self.script: list[str] = []
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> RerankStub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: object, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with stub._lock:
                    stub.requests.append({"path": self.path, "body": body, "at": time.monotonic()})
                    fault = stub.script.pop(0) if stub.script else "ok"
                if self.path != "/rerank":
                    return self._send(404, {"error": "not found"})
                if fault == "429":
                    return self._send(429, {"error": "rate limited"}, {"Retry-After": stub.retry_after})
                if fault == "500":
                    return self._send(500, {"error": "boom"})
                if fault == "slow":
                    time.sleep(stub.slow_seconds)
                texts = body.get("texts") or body.get("documents")
                scores = [stub_score(body["query"], t) for t in texts]
                if fault == "short":
                    scores = scores[:-1]
                if stub.shape == "tei":
                    items = sorted(({"index": i, "score": s} for i, s in enumerate(scores)), key=lambda r: -r["score"])
                    return self._send(200, items)
                return self._send(200, {"results": [{"index": i, "relevance_score": s} for i, s in enumerate(scores)]})

        return Handler
