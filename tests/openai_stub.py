"""An OpenAI-compatible embeddings server for tests and benchmarks, on 127.0.0.1.

Vectors are deterministic (seeded by a hash of model + text) and cheap. Faults can be scripted
(one per request, in order) or injected at a rate: "429" (with Retry-After), "500", "slow" (sleep
past the client's timeout), "malformed" (200 with a broken body), "wrong_dims", "400".
Every request is counted server-side so tests can prove cache hits make none."""

from __future__ import annotations

import base64
import hashlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np


# Vector sizes of models served without a `dimensions` parameter (an Ollama model answers in its own).
NATIVE_DIMS = {"nomic-embed-text": 768}


def stub_vector(model: str, text: str, dims: int) -> np.ndarray:
    """The stub's deterministic, L2-normalised vector for `text`."""
    seed = int.from_bytes(hashlib.sha256(f"{model}\x1f{text}".encode()).digest()[:8], "little")
    vec = np.random.default_rng(seed).standard_normal(dims).astype(np.float32)
    return vec / np.linalg.norm(vec)


class OpenAIStub:
    """Start with `with OpenAIStub() as stub:`; point clients at `stub.base_url`."""

    def __init__(self, latency: float = 0.0, fault_rate: float = 0.0, fault: str = "429",
                 retry_after: str = "0.05", slow_seconds: float = 2.0, seed: int = 7, port: int = 0):
        self.latency = latency
        self.fault_rate = fault_rate
        self.fault = fault
        self.retry_after = retry_after
        self.slow_seconds = slow_seconds
        self._rng = random.Random(seed)
        self._script: list[str] = []
        self._lock = threading.Lock()
        self.requests = 0  # every POST, faulty or not
        self.inputs = 0  # texts embedded successfully
        self.outcomes: Counter[str] = Counter()
        self.models: Counter[str] = Counter()
        self.keys: Counter[str] = Counter()  # API keys sent (Bearer tokens), for provider-default tests
        self.sent_dimensions: Counter[str] = Counter()  # requests per model that passed `dimensions`
        self.in_flight = 0
        self.max_in_flight = 0  # most requests served at once (proves the client's concurrency)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def script(self, faults: Iterable[str]) -> None:
        """Answer the next requests with these faults, in order ("ok" for a normal answer)."""
        with self._lock:
            self._script.extend(faults)

    def clear_script(self) -> None:
        with self._lock:
            self._script.clear()

    def reset_counts(self) -> None:
        with self._lock:
            self.requests = self.inputs = 0
            self.outcomes.clear()
            self.models.clear()
            self.max_in_flight = 0

    def start(self) -> OpenAIStub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict:
        with self._lock:
            return {"requests": self.requests, "inputs": self.inputs, "outcomes": dict(self.outcomes),
                    "max_in_flight": self.max_in_flight}

    def _next_fault(self) -> str:
        with self._lock:
            self.requests += 1
            if self._script:
                return self._script.pop(0)
            if self.fault_rate and self._rng.random() < self.fault_rate:
                return self.fault
            return "ok"

    def _handler(self):
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _error(self, status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> None:
                body = json.dumps({"error": {"message": message, "type": kind, "code": kind}}).encode()
                self._send(status, body, headers)

            def do_GET(self) -> None:  # noqa: N802 - counters for a stub running in another process
                if self.path.rstrip("/").endswith("/stats"):
                    return self._send(200, json.dumps(stub.stats()).encode())
                return self._error(404, "not found", "not_found")

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                raw = self.rfile.read(length)
                if not self.path.rstrip("/").endswith("/embeddings"):
                    return self._error(404, "not found", "not_found")
                if not self.headers.get("Authorization", "").startswith("Bearer "):
                    return self._error(401, "missing API key", "invalid_api_key")
                with stub._lock:
                    stub.keys[self.headers["Authorization"].removeprefix("Bearer ")] += 1
                fault = stub._next_fault()
                with stub._lock:
                    stub.in_flight += 1
                    stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
                try:
                    self._answer(fault, raw)
                finally:
                    with stub._lock:
                        stub.in_flight -= 1

            def _answer(self, fault: str, raw: bytes) -> None:
                if stub.latency:
                    time.sleep(stub.latency)
                with stub._lock:
                    stub.outcomes[fault] += 1
                if fault == "429":
                    return self._error(429, "rate limit reached", "rate_limit_exceeded",
                                       {"Retry-After": stub.retry_after})
                if fault == "500":
                    return self._error(500, "internal error", "server_error")
                if fault == "400":
                    return self._error(400, "bad request", "invalid_request_error")
                if fault == "slow":
                    time.sleep(stub.slow_seconds)
                if fault == "malformed":
                    return self._send(200, b'{"object": "list", "data": [{"embedding": [0.1, ')
                body = json.loads(raw)
                texts = body["input"]
                texts = [texts] if isinstance(texts, str) else texts
                model = body["model"]
                dims = int(body.get("dimensions") or NATIVE_DIMS.get(body["model"], 64))
                with stub._lock:
                    stub.sent_dimensions[model] += "dimensions" in body
                if fault == "wrong_dims":
                    dims += 1
                data = []
                for i, text in enumerate(texts):
                    vec = stub_vector(model, text, dims)
                    if body.get("encoding_format") == "base64":
                        emb: object = base64.b64encode(vec.astype("<f4").tobytes()).decode()
                    else:
                        emb = [float(x) for x in vec]
                    data.append({"object": "embedding", "index": i, "embedding": emb})
                tokens = sum(len(t.split()) + 1 for t in texts)
                with stub._lock:
                    stub.inputs += len(texts)
                    stub.models[model] += 1
                payload = {"object": "list", "data": data, "model": model,
                           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
                self._send(200, json.dumps(payload).encode())

        return Handler


def main() -> None:
    """Run the stub alone (benchmarks use a separate process so it does not share the client's GIL)."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--fault", default="429")
    parser.add_argument("--retry-after", default="0.05")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    stub = OpenAIStub(args.latency, args.fault_rate, args.fault, args.retry_after, seed=args.seed, port=args.port)
    print(stub.base_url, flush=True)
    try:
        stub.server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
