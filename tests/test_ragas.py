"""RAGAS metrics (context precision, context recall, faithfulness) judged by an OpenAI-compatible chat
model: a stub chat server on 127.0.0.1 whose verdicts are known, so the scores are exact."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.errors import ConfigError, RagError
from rag_lib.eval import average_precision, parse_verdicts

NVDA = "tradegent/knowledge/analysis/earnings/NVDA_20250120T0900.yaml"
NFLX = "tradegent/knowledge/analysis/earnings/NFLX_20250118T0800.yaml"

# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache
ANSWER = "NVDA beat its earnings estimate.\nThe moon is made of cheese."


class ChatStub:
    """Relevance: a context is relevant iff it names NVDA; support: a statement is supported iff it
    names NVDA; the answer is ANSWER (one supported sentence, one not)."""

    def __init__(self, fail: bool = False):
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                if fail:
                    self.send_response(500)
                    self.end_headers()
                    return
                system, user = body["messages"][0]["content"], body["messages"][1]["content"]
                if system.startswith("TASK: context relevance"):
                    items = re.findall(r"^(\d+): (.*)$", user.split("\n\n", 1)[1], re.M)
                    content = "\n".join(f"{n}: {'yes' if 'nvda' in t.lower() else 'no'}" for n, t in items)
                elif system.startswith("TASK: answer"):
                    content = ANSWER
                else:
                    items = re.findall(r"^(\d+): (.*)$", user.split("Statements:\n", 1)[1], re.M)
                    content = "\n".join(f"{n}: {'yes' if 'nvda' in t.lower() else 'no'}" for n, t in items)
                reply = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_verdict_parsing_and_average_precision():
    assert parse_verdicts("1: yes\n2: NO\n[3] - yes\nnoise", 4) == [True, False, True, False]
    assert average_precision([True, False, True]) == pytest.approx((1 + 2 / 3) / 2)
    assert average_precision([False, False]) == 0.0


@pytest.fixture
def judged_kb(database_url, provider, tmp_path, corpus_copy, monkeypatch):
    def make(base_url: str) -> KnowledgeBase:
        # the seeds' LLM_BASE_URL names the judge's server too
        monkeypatch.setenv("LLM_BASE_URL", base_url)
        settings = Settings(database_url=database_url, home=tmp_path / ".rag", eval={"judge_model": "judge-1"})
        base = KnowledgeBase(settings, provider=provider)
        report = base.ingest([corpus_copy(NVDA, NFLX)])
        assert report.count("new") == 2
        return base

    return make


def test_evaluate_with_the_judge(judged_kb):
    with ChatStub() as stub:
        base = judged_kb(stub.base_url)
        try:
            assert base.settings.eval.judge_base_url == stub.base_url
            hits = base.search("NVDA earnings results", mode="hybrid", top_k=3).hits
            queries = {"q1": "NVDA earnings results"}
            qrels = {"q1": {hits[0].unit_id: 1}}
            out = base.evaluate(queries, qrels, mode="hybrid", judge=True, top_k=3,
                                references={"q1": "NVDA reported record revenue. Apples are red."})
        finally:
            base.close()
    assert out["ndcg@10"] == 1.0 and out["queries"] == 1
    ragas = out["ragas"]
    expected = average_precision(["nvda" in h.text.lower() for h in hits])
    assert ragas["context_precision"] == pytest.approx(expected, abs=1e-4)
    assert ragas["faithfulness"] == 0.5 and ragas["context_recall"] == 0.5
    assert ragas["judge_calls"] == 4 and all(r["model"] == "judge-1" for r in stub.requests)


def test_without_a_reference_context_recall_is_not_claimed(judged_kb):
    with ChatStub() as stub:
        base = judged_kb(stub.base_url)
        try:
            out = base.evaluate({"q1": "NVDA earnings"}, {"q1": {"x#y": 1}}, judge=True)
        finally:
            base.close()
    assert out["ragas"]["context_recall"] is None and out["ragas"]["faithfulness"] == 0.5


def test_judge_failures_are_typed(judged_kb):
    with ChatStub(fail=True) as stub:
        base = judged_kb(stub.base_url)
        try:
            with pytest.raises(RagError, match="judge model judge-1 failed"):
                base.evaluate({"q1": "NVDA earnings"}, {"q1": {"x#y": 1}}, judge=True)
        finally:
            base.close()
    base = KnowledgeBase(Settings(), provider=None)
    from rag_lib.eval import judge_from_settings

    with pytest.raises(ConfigError, match="judge_model"):
        judge_from_settings(base.settings)
