"""ONNX Runtime encoder for search queries and ingest batches.

The local model's transformer, mean pooling and normalisation are exported once with `torch.onnx`
into a cache folder, beside a manifest holding the torch model's vectors for a few probe texts.
Every load checks the export against those vectors, so a query vector is the vector the torch
model would make (max difference ~2e-7), and a search-only process never imports torch: the
tokenizer is `rag_lib.tokens`. Measured in the search benchmark on 2 cores: 3.0/5.0 ms p50/p95
per query against torch's 12.1/16.0. `optimum` would do the export for us, but it pins
transformers < 4.58 and we run 5.x.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager, nullcontext
from importlib import metadata
from pathlib import Path

import numpy as np

from rag_lib.errors import ConfigError, StoppedError
from rag_lib.log import get_logger
from rag_lib.tokens import Tokenizer, get_tokenizer

log = get_logger(__name__)

# Bump when the exported graph or the manifest changes: old cache files are then ignored.
EXPORT_RECIPE = "2"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PROBES = (
    "NVDA bull case",
    "  which trades hit their stop?  ",
    "Ünïcödé: 日本語のテキスト and emoji 📈 — mixed scripts",
    "Earnings call notes: revenue beat by 4%, guidance raised, gross margin 71.2% vs 70.1% expected; "
    "the stop at $412 held while the position was trimmed into strength after the print.",
    "free cash flow and margin expansion " * 60,  # past the 256-token limit: truncation must match
)
MAX_ABS_DIFF = 1e-5
# Mini-batches of an ingest batch encoded at once, one thread each (see OnnxEncoder): one per core.
BATCH_WORKERS = max(1, min(4, os.cpu_count() or 1))
# Mini-batches queued for the batch workers and not started yet (see OnnxEncoder.submit_rows):
# enough that a worker finishing one always finds the next, few enough that another caller's
# mini-batches wait behind a fraction of a second of work, not a whole round's.
QUEUE_DEPTH = 2 * BATCH_WORKERS


def default_cache_dir() -> Path:
    """Where exports are kept when no folder is configured: per user, shared by every knowledge base."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rag-kb" / "onnx"


class OnnxEncoder:
    """The exported model on ONNX Runtime: one text (a query) or many (an ingest batch).

    Two sessions of one export. A query runs on two intra-op threads that sleep between operators:
    spinning bought ~1 ms of latency on a quiet machine but cost twice the CPU per query (14.9 vs
    7.9 ms at load 12), which a server running many searches at once, or a machine busy with other
    work, pays in throughput (docs/scale.md "HTTP"). A batch's mini-batches run on one thread each,
    `BATCH_WORKERS` of them at once: two threads sharing every operator of one mini-batch wait for
    each other at each of its ~100 operators, so whatever else wants a core (reading, chunking and
    publishing the next files, PostgreSQL) stalled both, and spinning through those waits burnt the
    CPU the rest of the ingest needed; mini-batches on their own threads share nothing
    (docs/scale.md "Ingest at the encoder's pace"). The batch session loads on the first batch, so
    a search-only process holds one copy of the weights (~90 MB)."""

    def __init__(self, ort, path: Path, tokenizer: Tokenizer):
        self._ort = ort
        self.path = path
        self.tokenizer = tokenizer
        self.query_session = _session(ort, path, spinning=False)
        self._batch_session = None
        self._batch_lock = threading.Lock()
        # (pid, workers, places in their queue): made on the first batch
        self._workers: tuple[int, ThreadPoolExecutor, threading.BoundedSemaphore] | None = None

    @property
    def batch_session(self):
        with self._batch_lock:  # two first batches at once make one session, not two
            if self._batch_session is None:
                self._batch_session = _session(self._ort, self.path, spinning=False, threads=1)
            return self._batch_session

    @property
    def dimensions(self) -> int:
        return int(self.query_session.get_outputs()[0].shape[1])

    def encode(self, text: str) -> np.ndarray:
        """The normalised vector of `text`, shape (1, dimensions)."""
        return self.query_session.run(None, self.tokenizer.model_inputs(text))[0].astype(np.float32, copy=False)

    def encode_batch(self, texts: list[str], batch_size: int, slots: AbstractContextManager | None = None,
                     workers: int | None = None) -> np.ndarray:
        """Normalised vectors of `texts`, shape (len(texts), dimensions). Like sentence-transformers,
        texts of similar length go together (longest first) so a batch pads little; padding is
        masked, so a text's vector does not depend on its batch (within ~3e-7). The mini-batches
        run `workers` (default `BATCH_WORKERS`) at a time, each on its own thread; `slots` is
        entered per mini-batch, not for the whole call: with as many slots as workers, others
        sharing them (another ingest) wait one mini-batch (~0.1 s), not the whole upload (minutes)."""
        return self.encode_rows(self.tokenizer.model_inputs_many(texts), batch_size, slots, workers)

    def encode_rows(self, rows: list[dict[str, np.ndarray]], batch_size: int,
                    slots: AbstractContextManager | None = None, workers: int | None = None) -> np.ndarray:
        """`encode_batch` of texts tokenized already (`Tokenizer.model_inputs_many`)."""
        return self.submit_rows(rows, batch_size, slots, workers).result()

    def submit_rows(self, rows: list[dict[str, np.ndarray]], batch_size: int,
                    slots: AbstractContextManager | None = None, workers: int | None = None,
                    stop: threading.Event | None = None) -> Encoding:
        """Queue `rows`' mini-batches for the encoder's workers and return at once (an ingest's next
        round is queued while the current one's last mini-batches run, so no worker waits between
        rounds): `Encoding.result()` waits for the vectors. The workers take mini-batches in the
        order they were queued, whoever queued them; at most `QUEUE_DEPTH` wait unstarted, so a call
        blocks while the queue is full (what bounds the memory of tokens queued ahead, and lets
        two ingests sharing the encoder take turns). `workers` 1: encoded here, on this thread.
        Once `stop` is set (a stopped ingest), queuing and waiting raise `StoppedError` and the
        mini-batches not started yet are dropped."""
        slots = slots or nullcontext()
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]["input_ids"]))
        out = np.zeros((len(rows), self.dimensions), dtype=np.float32)
        session = self.batch_session

        def run(start: int) -> None:
            members = order[start:start + batch_size]
            width = max(len(rows[i]["input_ids"]) for i in members)
            feed = {name: np.zeros((len(members), width), dtype=np.int64) for name in INPUTS}
            for row, i in enumerate(members):
                for name in INPUTS:
                    values = rows[i][name]
                    feed[name][row, :len(values)] = values
            with slots:
                out[members] = session.run(None, feed)[0]

        starts = range(0, len(order), batch_size)
        if (workers or BATCH_WORKERS) <= 1:
            for start in starts:
                run(start)
            return Encoding(out, [])
        pool, queued = self._pool()
        futures: list[Future] = []

        def started(start: int) -> None:
            queued.release()  # a mini-batch left the queue: one more may be queued
            run(start)

        def dropped(future: Future) -> None:
            if future.cancelled():  # it never started: its place in the queue is free
                queued.release()

        try:
            for start in starts:
                while not queued.acquire(timeout=STOP_POLL_SECONDS):  # waits while QUEUE_DEPTH wait unstarted
                    _raise_if_stopped(stop)
                _raise_if_stopped(stop, queued)
                futures.append(pool.submit(started, start))
                futures[-1].add_done_callback(dropped)
        except BaseException:
            Encoding(out, futures).cancel()
            raise
        return Encoding(out, futures, stop)

    def _pool(self) -> tuple[ThreadPoolExecutor, threading.BoundedSemaphore]:
        """The batch workers, shared by every batch of this encoder, and the places in their queue
        (made again in a forked child, where the parent's threads do not exist)."""
        with self._batch_lock:
            if self._workers is None or self._workers[0] != os.getpid():
                self._workers = (os.getpid(), ThreadPoolExecutor(BATCH_WORKERS, thread_name_prefix="onnx-batch"),
                                 threading.BoundedSemaphore(QUEUE_DEPTH))
            return self._workers[1], self._workers[2]


STOP_POLL_SECONDS = 0.25  # how often a wait for the encoder looks at its `stop` (a Ctrl-C's latency)


def _raise_if_stopped(stop: threading.Event | None, slot: threading.BoundedSemaphore | None = None) -> None:
    """Raise `StoppedError` once `stop` is set (giving back the queue place `slot` taken for nothing)."""
    if stop is not None and stop.is_set():
        if slot is not None:
            slot.release()
        raise StoppedError("the ingest was stopped")


class Encoding:
    """The mini-batches of one `OnnxEncoder.submit_rows` call, queued or running."""

    def __init__(self, out: np.ndarray, futures: list[Future], stop: threading.Event | None = None):
        self._out = out
        self._futures = futures
        self._stop = stop

    def result(self) -> np.ndarray:
        """The vectors, once every mini-batch ran; a mini-batch's error is raised here (the others
        not started yet are dropped), and so is `StoppedError` once the call's `stop` is set."""
        try:
            for future in self._futures:
                while True:
                    try:
                        future.result(timeout=None if self._stop is None else STOP_POLL_SECONDS)
                        break
                    except FutureTimeout:
                        _raise_if_stopped(self._stop)
        except BaseException:
            self.cancel()
            raise
        return self._out

    def cancel(self) -> None:
        """Drop the mini-batches not started yet (an ingest that stopped does not encode them)."""
        for future in self._futures:
            future.cancel()


def load_onnx_encoder(model_path: str, cache_dir: Path | str | None, load_model: Callable[[], object]) -> OnnxEncoder:
    """The cached export of the model at `model_path`, checked against its manifest. `load_model`
    (the SentenceTransformer) is called only to export when the cache has no usable export.

    Raises ConfigError when the model cannot be exported or its export disagrees with torch."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ConfigError(f"onnxruntime is not installed ({exc}); install it or set embedding.query_runtime and embedding.batch_runtime: torch") from exc
    # The file name predates batches on ONNX; renaming it would re-export on every machine.
    path = Path(cache_dir or default_cache_dir()) / f"query-encoder-{_fingerprint(model_path)}.onnx"
    manifest = path.with_suffix(".json")
    tokenizer = get_tokenizer(model_path)
    for attempt in (1, 2):
        if attempt == 2 or not (path.is_file() and manifest.is_file()):
            model = load_model()
            _check_architecture(model)
            _export(model, path)
            _write_manifest(model, tokenizer, manifest)
        try:
            encoder = OnnxEncoder(ort, path, tokenizer)
            _verify(encoder, manifest)
            return encoder
        except Exception as exc:
            if attempt == 2:
                raise ConfigError(f"the ONNX export at {path} does not work: {exc}") from exc
            # a truncated, foreign or stale file: export again once
            log.warning("cached ONNX export %s is unusable (%s); exporting it again", path, exc)
    raise AssertionError("unreachable")


def _check_architecture(model) -> None:
    """Only Transformer -> mean Pooling (-> Normalize) is exported; anything else stays on torch."""
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    modules = list(model)
    ok = (
        len(modules) in (2, 3)
        and isinstance(modules[0], Transformer)
        and isinstance(modules[1], Pooling)
        and getattr(modules[1], "pooling_mode", None) == "mean"
        and all(isinstance(m, Normalize) for m in modules[2:])
    )
    if not ok:
        names = " -> ".join(type(m).__name__ for m in modules)
        raise ConfigError(f"the ONNX export supports Transformer -> mean Pooling models, not {names}")


def _fingerprint(model_path: str) -> str:
    """Changes when the weights, torch or the export recipe change (a reinstall re-exports)."""
    parts = [EXPORT_RECIPE, metadata.version("torch"), str(Path(model_path).resolve())]
    for name in sorted(os.listdir(model_path)):
        stat = (Path(model_path) / name).stat()
        parts.append(f"{name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _export(model, path: Path) -> None:
    """Export transformer + mean pooling + L2 normalisation into `path`, atomically."""
    import torch

    class MeanPooled(torch.nn.Module):
        def __init__(self, transformer):
            super().__init__()
            self.transformer = transformer

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.transformer(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1)

    # Eager attention exports as plain MatMul/Softmax nodes that ONNX Runtime fuses (sdpa's export
    # ran ~8% slower); a copy, so the torch model serving batches keeps its own attention.
    transformer = copy.deepcopy(model[0].auto_model).eval()
    transformer.set_attn_implementation("eager")
    features = model.preprocess(["an example query"])
    args = tuple(features[name] for name in INPUTS)
    axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS} | {"embedding": {0: "batch"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    log.info("exporting the model to ONNX at %s (once per model)", path)
    try:
        # the tracer warns about every Python-level shape check in transformers' code: noise here
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                MeanPooled(transformer), args, str(partial), input_names=list(INPUTS), output_names=["embedding"],
                dynamic_axes=axes, opset_version=17, dynamo=False,
            )
        os.replace(partial, path)  # concurrent exporters each write their own file; the last one wins
    except Exception as exc:
        partial.unlink(missing_ok=True)
        raise ConfigError(f"cannot export the local model to ONNX at {path}: {exc}") from exc


def _session(ort, path: Path, spinning: bool, threads: int | None = None):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Queries: two threads: a query encodes in 4.0/5.9 ms p50/p95 vs 4.8/7.5 on one (both cores
    # busy with an ingest: 5.5/8.7 vs 5.8/13). Spinning between operators (see OnnxEncoder) stops
    # when a run ends: a thread still spinning would steal the core PostgreSQL needs right after
    # (torch's OpenMP threads did: search p95 33 vs 25 ms). Batches: one thread per mini-batch.
    options.intra_op_num_threads = threads or min(2, os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    options.log_severity_level = 3  # warnings about unused initialisers are noise
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _write_manifest(model, tokenizer: Tokenizer, manifest: Path) -> None:
    """The torch model's vectors for the probes, after checking our tokenizer gives the model's
    own token ids (stripping, truncation, special tokens)."""
    for text in PROBES:
        ours = tokenizer.model_inputs(text)["input_ids"][0].tolist()
        theirs = model.preprocess([text])["input_ids"][0].tolist()
        if ours != theirs:
            raise ConfigError(f"rag_lib's tokenizer and the model's disagree on {text[:40]!r}")
    vectors = model.encode(list(PROBES), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    body = json.dumps({"recipe": EXPORT_RECIPE, "probes": list(PROBES), "vectors": vectors.tolist()})
    partial = manifest.with_name(f".{manifest.name}.{os.getpid()}.tmp")
    partial.write_text(body, encoding="utf-8")
    os.replace(partial, manifest)


def _verify(encoder: OnnxEncoder, manifest: Path) -> None:
    """Refuse an export whose vectors differ from the torch model's: queries must land in the indexed space."""
    recorded = json.loads(manifest.read_text(encoding="utf-8"))
    if recorded.get("recipe") != EXPORT_RECIPE or recorded.get("probes") != list(PROBES):
        raise ConfigError("its manifest was written by another version")
    expected = np.asarray(recorded["vectors"], dtype=np.float32)
    got = np.vstack([encoder.encode(text) for text in PROBES])
    if got.shape != expected.shape:
        raise ConfigError(f"it makes {got.shape[1]}-dimensional vectors, the torch model {expected.shape[1]}")
    diff = float(np.abs(got - expected).max())
    if diff > MAX_ABS_DIFF:
        raise ConfigError(f"its vectors differ from the torch model's by up to {diff:.2e}")
