"""Remote providers over real HTTP against the OpenAI-compatible stub: batching, retries with
Retry-After, timeouts, malformed bodies, wrong dimensions, fallback only within a space."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from openai_stub import OpenAIStub, stub_vector
from rag_lib.config import ProviderSettings, Settings
from rag_lib.embedding import get_provider, provider_for_space
from rag_lib.embedding import onnx_encoder
from rag_lib.embedding.chain import FallbackProvider
from rag_lib.embedding.local import LocalProvider
from rag_lib.embedding.onnx_encoder import load_onnx_encoder
from rag_lib.embedding.openai import OpenAIProvider
from rag_lib.embedding.ratelimit import RateLimiter
from rag_lib.embedding.retry import backoff_delay, parse_retry_after
from rag_lib.errors import ConfigError, DimensionMismatchError, EmbeddingError

MODEL = "stub-embed"
DIMS = 32


@pytest.fixture
def stub():
    with OpenAIStub() as server:
        yield server


def remote(server: OpenAIStub, **overrides) -> OpenAIProvider:
    cfg = dict(provider="openai_compatible", base_url=server.base_url, model=MODEL, dimensions=DIMS,
               api_key_env="RAG_TEST_EMBED_KEY", backoff_base=0.01, backoff_max=1.0, timeout=2.0)
    cfg.update(overrides)
    return OpenAIProvider(ProviderSettings(**cfg))


TEXTS = [f"chunk number {i} about NVDA earnings and risk_management" for i in range(10)]


def test_vectors_are_the_servers_batched_by_count(stub):
    p = remote(stub, batch_size=3, concurrency=1)
    vectors, usage = p.embed_counted(TEXTS)
    assert stub.requests == 4 and stub.inputs == 10
    expected = np.stack([stub_vector(MODEL, t, DIMS) for t in TEXTS])
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    assert usage[0].requests == 4 and usage[0].retries == 0
    assert usage[0].tokens == sum(len(t.split()) + 1 for t in TEXTS)  # the server's own count
    assert not usage[0].tokens_estimated


def test_an_unset_batch_size_is_each_providers_own(stub):
    """Small encode batches for the local model (faster on CPU), 64 texts per request remotely."""
    texts = [f"note {i}" for i in range(130)]
    p = remote(stub, concurrency=1)
    p.embed(texts)
    assert stub.requests == 3 and stub.inputs == 130  # 64 + 64 + 2
    local = get_provider(Settings(database_url="postgresql://unused/unused"))
    assert isinstance(local, LocalProvider) and local.batch_size == 8
    chosen = get_provider(Settings(database_url="postgresql://unused/unused", embedding={"batch_size": 32}))
    assert chosen.batch_size == 32  # a configured size is kept


def test_batches_also_split_by_tokens(stub):
    p = remote(stub, batch_size=100, max_batch_tokens=40, concurrency=1)
    p.embed(TEXTS)
    assert stub.requests >= 4  # ~16 tokens per text: two texts per request at most


def test_concurrency_limit_is_used(stub):
    stub.latency = 0.15
    p = remote(stub, batch_size=1, concurrency=4)
    p.embed(TEXTS[:8])
    assert stub.max_in_flight == 4  # four requests overlapped: the limit is reached, never passed


def test_429_with_retry_after_is_retried_and_honoured(stub):
    stub.retry_after = "0.3"
    stub.script(["429", "429"])
    p = remote(stub, concurrency=1)
    started = time.perf_counter()
    vectors, usage = p.embed_counted(TEXTS[:2])
    assert time.perf_counter() - started >= 0.6  # waited at least Retry-After twice
    assert usage[0].retries == 2 and usage[0].requests == 3 and stub.requests == 3
    np.testing.assert_allclose(vectors[0], stub_vector(MODEL, TEXTS[0], DIMS), atol=1e-6)


def test_5xx_timeouts_and_malformed_json_are_retried(stub):
    stub.slow_seconds = 1.0
    stub.script(["500", "slow", "malformed"])
    p = remote(stub, timeout=0.3, concurrency=1)
    vectors, usage = p.embed_counted(TEXTS[:3])
    assert usage[0].retries == 3 and stub.requests == 4
    assert stub.outcomes["ok"] == 1
    assert vectors.shape == (3, DIMS)


def test_last_failure_is_a_clear_typed_error(stub):
    stub.script(["500"] * 3)
    p = remote(stub, max_retries=2, concurrency=1)
    with pytest.raises(EmbeddingError, match=r"failed after 3 attempts \(HTTP 500") as info:
        p.embed(TEXTS[:2])
    assert stub.requests == 3
    assert info.value.usage[0].failures == 1 and info.value.usage[0].retries == 2


def test_client_errors_are_not_retried(stub):
    stub.script(["400"])
    with pytest.raises(EmbeddingError, match="HTTP 400.*not retried"):
        remote(stub).embed(TEXTS[:1])
    assert stub.requests == 1


def test_wrong_dimensions_are_refused(stub):
    stub.script(["wrong_dims"])
    with pytest.raises(DimensionMismatchError, match="33-dimensional.*expected 32"):
        remote(stub).embed(TEXTS[:2])


def test_oversize_input_is_refused_before_any_request(stub):
    p = remote(stub, max_input_tokens=50)
    with pytest.raises(EmbeddingError, match="over the provider's limit of 50"):
        p.embed(["word " * 200])
    assert stub.requests == 0
    p.embed(["short text"])  # a text of ≤ 50 bytes provably fits
    assert stub.requests == 1


def test_chunk_limit_respects_the_providers_input_limit(stub):
    assert remote(stub).tokenizer().limit == 254  # the local model's limit is the tighter one
    small = remote(stub, max_input_tokens=100)
    assert small.tokenizer().limit == 64  # 100 / 1.5 safety margin, less 2 special tokens
    assert small.tokenizer().count("risk management") == 2
    words = " ".join(["risk"] * 64)
    assert small.tokenizer().count(words) == 64
    small.embed([words])  # a text at the chunker's limit is accepted and sent
    with pytest.raises(EmbeddingError, match="over the provider's limit"):
        small.embed([words + " risk"])  # one token more is refused before sending


def test_fallback_uses_the_next_provider_of_the_same_space():
    with OpenAIStub() as a, OpenAIStub() as b:
        a.script(["500"] * 5)
        chain = FallbackProvider([remote(a, max_retries=1, name="a"), remote(b, name="b")])
        vectors, usage = chain.embed_counted(TEXTS[:2])
        assert a.requests == 2 and b.requests == 1
        np.testing.assert_allclose(vectors[1], stub_vector(MODEL, TEXTS[1], DIMS), atol=1e-6)
        assert sum(u.failures for u in usage) == 1 and sum(u.inputs for u in usage) == 2


def test_fallback_refuses_a_different_space(stub):
    with pytest.raises(ConfigError, match="fallback is only allowed between equal spaces"):
        FallbackProvider([remote(stub), remote(stub, dimensions=64)])
    with pytest.raises(ConfigError, match="only allowed between equal spaces"):
        FallbackProvider([remote(stub), remote(stub, model="other-model")])
    # a declared equivalent (same dimensions) is accepted
    chain = FallbackProvider([remote(stub), remote(stub, model="other-model", equivalent_to=[f"{MODEL}:{DIMS}"])])
    assert chain.space == f"{MODEL}:{DIMS}"


def test_every_member_failing_names_each_failure():
    with OpenAIStub() as a, OpenAIStub() as b:
        a.script(["500"] * 5)
        b.script(["wrong_dims"])
        chain = FallbackProvider([remote(a, max_retries=0, name="a"), remote(b, max_retries=0, name="b")])
        with pytest.raises(EmbeddingError, match=r"every provider in the chain failed: a: .*HTTP 500.* \| b: .*33-dim"):
            chain.embed(TEXTS[:1])


def test_settings_build_the_chain_and_reembed_targets(stub, monkeypatch):
    s = Settings(embedding={
        "provider": "openai_compatible", "base_url": stub.base_url, "model": MODEL, "dimensions": DIMS,
        "fallback": ["backup"],
        "providers": [
            {"name": "backup", "provider": "openai_compatible", "base_url": stub.base_url, "model": MODEL, "dimensions": DIMS},
            {"name": "big", "provider": "openai_compatible", "base_url": stub.base_url, "model": "big-embed", "dimensions": 48},
        ],
    })
    p = get_provider(s)
    assert isinstance(p, FallbackProvider) and p.space == f"{MODEL}:{DIMS}"
    assert p.embed(["x"]).shape == (1, DIMS)
    target = provider_for_space(s, "big-embed")
    assert target.space == "big-embed:48" and target.embed(["x"]).shape == (1, 48)
    with pytest.raises(ConfigError, match="no provider for 'nomic:768'"):
        provider_for_space(s, "nomic:768")
    bad = Settings(embedding={"fallback": ["nope"]})
    with pytest.raises(ConfigError, match="not in embedding.providers"):
        get_provider(bad)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"\$OPENAI_API_KEY"):
        provider_for_space(s, "text-embedding-3-small:512").embed(["x"])


def test_rate_limiter_spaces_requests_and_tokens():
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(requests_per_minute=60, tokens_per_minute=600, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        limiter.acquire(60)  # 10 × 60 tokens empties the token bucket
    assert now[0] == 0.0
    limiter.acquire(60)  # needs 60 tokens at 10 tokens/s
    assert now[0] == pytest.approx(6.0)
    limiter.pause(2.0)
    limiter.acquire(0)
    assert now[0] >= 8.0


def test_backoff_grows_with_jitter_and_honours_retry_after():
    import random

    rng = random.Random(1)
    delays = [backoff_delay(a, 0.5, 30, rng=rng) for a in range(6)]
    for attempt, d in enumerate(delays):
        ceiling = min(30, 0.5 * 2 ** attempt)
        assert ceiling / 2 <= d <= ceiling
    assert backoff_delay(0, 0.5, 30, retry_after=7, rng=rng) >= 7
    assert parse_retry_after({"retry-after": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "3"}) == 0.25
    assert parse_retry_after({}) is None
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert 0 <= parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) < 1  # in the past


def test_local_single_query_path_matches_batch_encoding(provider):
    # a single query and a batch take different paths: both must make the same vectors,
    # including past the model's 256-token limit (truncation) and outside ASCII
    queries = ["NVDA bull case", "which trades hit their stop loss after earnings",
               "Ünïcödé 日本語 📈 " + "margin expansion and free cash flow " * 80]
    assert provider.active_query_runtime == "onnx"
    batch = provider.embed(queries)
    singles = [provider.embed([q])[0] for q in queries]
    assert batch.dtype == singles[0].dtype == np.float32 and singles[0].shape == (384,)
    for one, many in zip(singles, batch):
        assert np.abs(one - many).max() < 1e-5 and abs(np.linalg.norm(one) - 1) < 1e-5


def test_query_threads_do_not_spin_and_batch_mini_batches_run_one_thread_each(provider):
    # a server runs many searches at once: a query's ONNX threads sleep between operators (half the
    # CPU per query on a busy machine); an ingest batch's mini-batches each run on one thread, so
    # no thread waits (or spins) for another at every operator
    encoder = provider._onnx
    spinning = "session.intra_op.allow_spinning"
    assert encoder.query_session.get_session_options().get_session_config_entry(spinning) == "0"
    assert encoder.batch_session.get_session_options().intra_op_num_threads == 1
    queries = ["NVDA bull case", "which trades hit their stop loss after earnings", "0-dimensional biomaterials"]
    singles = np.vstack([provider.embed([q]) for q in queries])
    assert np.allclose(singles, provider.embed(queries), atol=1e-5)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: mini-batches run one at a time")
def test_a_batch_encodes_its_mini_batches_at_once_with_the_same_vectors(provider, monkeypatch):
    """An ingest batch keeps every core busy with mini-batches of its own (one thread each), and a
    text's vector is the one it gets alone, whichever mini-batch and thread it lands in."""
    encoder = provider._onnx
    session = encoder.batch_session
    lock = threading.Lock()
    running, most = [0], [0]

    class Watched:  # the real session, counting the runs under way
        def run(self, *args):
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                time.sleep(0.02)  # the runs of a batch overlap if they can
                return session.run(*args)
            finally:
                with lock:
                    running[0] -= 1

    monkeypatch.setattr(encoder, "_batch_session", Watched())
    texts = [f"{t} guidance after earnings, margin {n}% " * (1 + n % 7)
             for n, t in enumerate(["NVDA", "AMD", "TSLA", "AAPL", "MSFT", "META"] * 6)]
    batch = provider.embed(texts)
    assert most[0] == min(4, os.cpu_count() or 1)  # one per core
    singles = np.vstack([provider.embed([t]) for t in texts])
    assert batch.shape == (len(texts), 384) and np.abs(batch - singles).max() < 1e-5


class HeldSession:
    """The real batch session, each run held until `go` is set, recording which batch (by its
    width in tokens) starts when."""

    def __init__(self, session):
        self.session, self.go, self.lock = session, threading.Event(), threading.Lock()
        self.started: list[int] = []

    def run(self, names, feed):
        with self.lock:
            self.started.append(feed["input_ids"].shape[1])
        assert self.go.wait(timeout=120), "the test never released the encoder"
        return self.session.run(names, feed)


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + 120  # a bound for a broken run, not a measurement
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _rows(provider: LocalProvider, template: str, count: int) -> list[dict]:
    return provider.tokenizer().model_inputs_many([template.format(n) for n in range(count)])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: batches are encoded on the calling thread")
def test_batches_are_queued_without_waiting_and_run_in_the_order_they_were_queued(provider, monkeypatch):
    """An ingest queues its next round's mini-batches while the current round's last ones run, so
    the encoder's workers never wait between rounds: `submit_rows` returns before its batches are
    encoded, and the workers take mini-batches in the order they were queued (the current round's
    before the next one's, whoever queued them), each with the vector it gets alone."""
    encoder = provider._onnx
    held = HeldSession(encoder.batch_session)
    monkeypatch.setattr(encoder, "_batch_session", held)
    workers = onnx_encoder.BATCH_WORKERS
    first = _rows(provider, "risk {} alpha", workers + 3)  # every worker busy, 3 queued behind them
    second = _rows(provider, "margin guidance after the earnings call of quarter {} beta", onnx_encoder.QUEUE_DEPTH - 3)
    narrow = {len(r["input_ids"]) for r in first}
    assert not narrow & {len(r["input_ids"]) for r in second}
    try:
        queued = [encoder.submit_rows(first, 1), encoder.submit_rows(second, 1)]  # neither waits for the encoder
        _wait_for(lambda: len(held.started) == workers, "the workers took the first mini-batches")
        assert set(held.started) <= narrow
    finally:
        held.go.set()
    vectors = [q.result() for q in queued]
    # once the second call's first mini-batch started, every one of the first's had been taken: a
    # worker may record the start of its last one just after another records the next call's
    later = held.started[next(i for i, w in enumerate(held.started) if w not in narrow):]
    assert len(held.started) == len(first) + len(second)
    assert sum(1 for w in later if w in narrow) <= workers - 1
    for rows, got in zip((first, second), vectors):
        alone = np.vstack([encoder.encode_rows([r], 1, workers=1) for r in rows])
        assert np.abs(got - alone).max() < 1e-5


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: batches are encoded on the calling thread")
def test_at_most_queue_depth_mini_batches_wait_and_a_caller_queueing_more_waits(provider, monkeypatch):
    """The queue ahead of the encoder is bounded: with every worker busy and QUEUE_DEPTH
    mini-batches waiting, a caller queueing more waits for a place (memory stays bounded, and
    another caller sharing the encoder waits behind a few mini-batches, not a whole round)."""
    encoder = provider._onnx
    held = HeldSession(encoder.batch_session)
    monkeypatch.setattr(encoder, "_batch_session", held)
    workers, depth = onnx_encoder.BATCH_WORKERS, onnx_encoder.QUEUE_DEPTH
    rows = _rows(provider, "risk {} alpha", 2 * (workers + depth))
    queued = []
    caller = threading.Thread(target=lambda: queued.append(encoder.submit_rows(rows, 1)))
    caller.start()
    try:
        _wait_for(lambda: len(held.started) == workers, "the workers took the first mini-batches")
        pool = encoder._pool()[0]
        _wait_for(lambda: pool._work_queue.qsize() >= depth, "the queue filled")
        caller.join(timeout=0.5)
        assert caller.is_alive() and not queued and pool._work_queue.qsize() == depth
    finally:
        held.go.set()
        caller.join(timeout=120)
    assert len(queued[0].result()) == len(rows) and len(held.started) == len(rows)


def test_a_local_provider_that_replaces_embed_counted_is_still_called_for_batches_started_ahead(provider):
    """An ingest starts its batches through `start_counted`: a subclass that replaces
    `embed_counted` (a wrapper, a stand-in for a provider that is down) is called for them as before,
    not bypassed by the local model's own queueing."""

    class Down(LocalProvider):
        def embed_counted(self, texts):
            raise ConnectionError("embedding provider unreachable")

    down = Down(provider.model, provider.dimensions)
    down.__dict__["_onnx"] = provider._onnx  # the loaded model: only the override may stop the batch
    finish = down.start_counted(["NVDA bull case", "which trades hit their stop loss after earnings"])
    with pytest.raises(ConnectionError, match="unreachable"):
        finish()


def test_a_local_batch_counts_the_tokens_it_encodes_without_tokenizing_again(provider, monkeypatch):
    """The usage of an ingest batch (tokens per run) is the token ids the model read, [CLS] and
    [SEP] included, counted from the encoding itself: the texts are tokenized once, not again to be
    counted (that second pass ran on the thread feeding the encoder)."""
    texts = ["NVDA bull case", "which trades hit their stop loss after earnings", "Ünïcödé 日本語 📈 margin"]
    tokenizer = provider.tokenizer()
    expected = sum(tokenizer.count(t) + 2 for t in texts)
    counted = []
    monkeypatch.setattr(type(tokenizer), "count_many", lambda self, many: counted.append(many) or [])
    vectors, usage = provider.embed_counted(texts)
    assert counted == [] and usage[0].inputs == 3 and usage[0].tokens == expected
    assert np.abs(vectors - provider.embed(texts)).max() < 1e-5


def test_concurrent_single_queries_get_their_own_vectors(provider):
    # the API and MCP servers embed queries from many threads at once, without a lock on ONNX
    queries = [f"{ticker} guidance after earnings" for ticker in ("NVDA", "AMD", "TSLA", "AAPL", "MSFT", "META")] * 4
    expected = provider.embed(queries)
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda q: provider.embed([q])[0], queries))
    assert np.abs(np.vstack(got) - expected).max() < 1e-5


@pytest.mark.slow  # exports the model to ONNX again (about a minute on a busy machine)
def test_onnx_export_is_made_once_and_reused(provider, tmp_path):
    first = load_onnx_encoder(provider.model_path, tmp_path, lambda: provider._model)
    made = first.path.stat().st_mtime_ns

    def no_torch():
        raise AssertionError("a cached export must load without the torch model")

    again = load_onnx_encoder(provider.model_path, tmp_path, no_torch)
    assert again.path == first.path and again.path.stat().st_mtime_ns == made
    # the export and its manifest (the torch model's probe vectors); no temporary files left behind
    assert sorted(tmp_path.iterdir()) == [first.path.with_suffix(".json"), first.path]
    assert np.abs(again.encode("NVDA bull case") - provider.embed(["NVDA bull case", "x"])[:1]).max() < 1e-5


def _in_a_fresh_process(provider, tmp_path, body: str) -> list[str]:
    """What `body` prints (split), run in a new interpreter with `p`, a local provider whose ONNX
    export is already cached in `tmp_path`."""
    load_onnx_encoder(provider.model_path, tmp_path, lambda: provider._model)
    code = ("import sys, numpy as np\nfrom rag_lib.embedding.local import LocalProvider\n"
            f"p = LocalProvider('all-MiniLM-L6-v2', 384, onnx_cache_dir={str(tmp_path)!r})\n" + body)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.subprocess
def test_a_search_process_does_not_import_torch(provider, tmp_path):
    runtime, torch_loaded, no_batch_session, *_ = _in_a_fresh_process(provider, tmp_path, (
        "v = p.embed(['NVDA bull case'])\n"
        "print(p.active_query_runtime, 'torch' in sys.modules, p._onnx._batch_session is None, v.shape)\n"))
    # nor does it load the batch session: one copy of the weights (~90 MB) in a search-only server
    assert (runtime, torch_loaded, no_batch_session) == ("onnx", "False", "True")


@pytest.mark.slow  # exports the model to ONNX again (about a minute on a busy machine)
def test_a_damaged_onnx_export_is_made_again(provider, tmp_path, caplog):
    path = load_onnx_encoder(provider.model_path, tmp_path, lambda: provider._model).path
    path.write_bytes(b"not an onnx model")  # a torn download or a full disk
    with caplog.at_level("WARNING"):
        encoder = load_onnx_encoder(provider.model_path, tmp_path, lambda: provider._model)
    assert "exporting it again" in caplog.text and path.stat().st_size > 1_000_000
    assert np.abs(encoder.encode("stop loss") - provider.embed(["stop loss", "x"])[:1]).max() < 1e-5


@pytest.mark.slow  # exports the model to ONNX again (about a minute on a busy machine)
def test_an_onnx_export_that_disagrees_with_torch_is_refused(provider, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(onnx_encoder, "MAX_ABS_DIFF", -1.0)  # nothing can agree: as if the export were wrong
    with pytest.raises(ConfigError, match="differ from the torch model"):
        load_onnx_encoder(provider.model_path, tmp_path, lambda: provider._model)
    # the provider keeps serving queries on torch, and says so once
    fresh = LocalProvider("all-MiniLM-L6-v2", 384, onnx_cache_dir=tmp_path)
    fresh.__dict__["_model"] = provider._model  # the loaded model, not a second copy
    with caplog.at_level("WARNING"):
        assert fresh.active_query_runtime == "torch"
    assert "single queries and batches use torch" in caplog.text
    assert np.abs(fresh.embed(["NVDA bull case"]) - provider.embed(["NVDA bull case"])).max() < 1e-5


def test_query_runtime_setting(tmp_path):
    torch_only = get_provider(Settings(home=tmp_path, embedding={"query_runtime": "torch"}))
    assert torch_only.query_runtime == "torch" and torch_only.active_query_runtime == "torch"
    assert torch_only.batch_runtime == "onnx"  # the two are set apart
    with pytest.raises(ValueError, match="query_runtime"):
        Settings(home=tmp_path, embedding={"query_runtime": "tensorrt"})
    assert get_provider(Settings(home=tmp_path, embedding={"batch_runtime": "torch"})).batch_runtime == "torch"
    with pytest.raises(ValueError, match="batch_runtime"):
        Settings(home=tmp_path, embedding={"batch_runtime": "tensorrt"})


@pytest.mark.slow  # long texts on torch and at four ONNX batch sizes (about a minute on a busy machine)
def test_onnx_batches_make_the_torch_models_vectors(provider):
    # ingest batches run on ONNX Runtime by default: every vector must be the one torch makes, in
    # any batch (padding to the batch's longest text is masked), past the 256-token limit, any script
    texts = ["NVDA bull case", "stop", "Ünïcödé 日本語 📈 " + "margin expansion and free cash flow " * 80,
             "which trades hit their stop loss after earnings", "", "x " * 30, "guidance raised; beat by 4%"] * 3
    on_torch = LocalProvider(provider.model, provider.dimensions, batch_size=4, batch_runtime="torch")
    on_torch.__dict__["_model"] = provider._model  # the loaded model, not a second copy
    expected = on_torch.embed(texts)
    assert provider.batch_runtime == "onnx" and provider._batch_encoder is not None
    for size in (1, 3, 8, 64):
        provider.batch_size, before = size, provider.batch_size
        try:
            got = provider.embed(texts)
        finally:
            provider.batch_size = before
        assert got.shape == expected.shape and got.dtype == np.float32
        assert np.abs(got - expected).max() < 1e-5, size


@pytest.mark.subprocess
def test_an_ingest_process_does_not_import_torch(provider, tmp_path):
    printed = _in_a_fresh_process(provider, tmp_path, (
        "before = p.loaded\n"
        "p.prepare()\n"  # what a Dagster run does ahead of its embeddings stage
        "v = p.embed(['NVDA bull case', 'which trades hit their stop', 'free cash flow ' * 200])\n"
        "print(before, p.loaded, 'torch' in sys.modules, v.shape, round(float(np.linalg.norm(v, axis=1).min()), 4))\n"))
    # loaded (what /health waits for) once the export is in memory, torch never imported
    assert printed == ["False", "True", "False", "(3,", "384)", "1.0"]


def test_a_local_models_key_names_its_files_read_once_per_version_of_them(tmp_path, monkeypatch):
    """The installed model keeps its bare name (existing caches and spaces stay its); another local
    model's key adds the identity of the files that make its vectors (not its documentation),
    read once per version of them (kept by size and mtime, across processes in the user's cache)."""
    from rag_lib.embedding import identity
    from rag_lib.embedding.local import default_model_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(identity, "_known", {})  # as a new process
    assert identity.model_key("all-MiniLM-L6-v2", None) == "all-MiniLM-L6-v2"
    assert identity.model_key("all-MiniLM-L6-v2", default_model_path()) == "all-MiniLM-L6-v2"

    folder = tmp_path / "tuned"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (folder / "model.safetensors").write_bytes(b"weights-1")
    (folder / "README.md").write_text("A tuned copy.")
    first = identity.model_identity(folder)
    assert identity.model_key("all-MiniLM-L6-v2", folder) == f"all-MiniLM-L6-v2@{first}"
    (folder / "README.md").write_text("A tuned copy, documented.")
    assert identity.model_identity(folder) == first  # documentation makes no vectors

    weights = folder / "model.safetensors"
    stat = weights.stat()
    weights.write_bytes(b"weights-2")  # same size: known by its new mtime
    second = identity.model_identity(folder)
    assert second != first
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    monkeypatch.setattr(identity, "_known", {})
    # the first version's size and mtime again: its identity comes from the cache, the file is not read
    assert identity.model_identity(folder) == first
    with pytest.raises(ConfigError, match="embedding.model_path"):
        identity.model_key("all-MiniLM-L6-v2", tmp_path / "missing")
