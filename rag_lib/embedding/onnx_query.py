"""ONNX Runtime encoder for single search queries.

The local model's transformer, mean pooling and normalisation are exported once with `torch.onnx`
into a cache folder and checked against the torch model on probe texts every time they are loaded,
so a query vector is the vector the torch model would make (max difference ~2e-7). Measured in
the search benchmark on 2 cores: 4.95/7.12 ms p50/p95 per query against torch's 10.96/13.9.
`optimum` would do the export for us, but it pins transformers < 4.58 and we run 5.x.
"""

from __future__ import annotations

import copy
import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rag_lib.errors import ConfigError
from rag_lib.log import get_logger

log = get_logger(__name__)

# Bump when the exported graph changes: old cache files are then ignored.
EXPORT_RECIPE = "1"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
PROBES = (
    "NVDA bull case",
    "which trades hit their stop",
    "Ünïcödé: 日本語のテキスト and emoji 📈 — mixed scripts",
    "Earnings call notes: revenue beat by 4%, guidance raised, gross margin 71.2% vs 70.1% expected; "
    "the stop at $412 held while the position was trimmed into strength after the print.",
)
MAX_ABS_DIFF = 1e-5


def default_cache_dir() -> Path:
    """Where exports are kept when no folder is configured: per user, shared by every knowledge base."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rag-kb" / "onnx"


@dataclass
class OnnxQueryEncoder:
    """Encodes one text at a time with ONNX Runtime; tokenisation is the torch model's own."""

    session: object  # onnxruntime.InferenceSession
    model: object  # the SentenceTransformer whose tokenizer and truncation we reuse
    path: Path

    def encode(self, text: str) -> np.ndarray:
        """The normalised vector of `text`, shape (1, dimensions)."""
        features = self.model.preprocess([text])
        feed = {name: features[name].numpy() for name in INPUTS}
        return self.session.run(None, feed)[0].astype(np.float32, copy=False)


def load_query_encoder(model, model_path: str, cache_dir: Path | None = None) -> OnnxQueryEncoder:
    """The cached export of `model` (exported when missing or unreadable), verified against `model`.

    Raises ConfigError when the model cannot be exported or its export disagrees with torch."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ConfigError(f"onnxruntime is not installed ({exc}); install it or set embedding.query_runtime: torch") from exc
    _check_architecture(model)
    path = (cache_dir or default_cache_dir()) / f"query-encoder-{_fingerprint(model_path)}.onnx"
    for attempt in (1, 2):
        if attempt == 2 or not path.is_file():
            _export(model, path)
        try:
            encoder = OnnxQueryEncoder(_session(ort, path), model, path)
            _verify(encoder, model)
            return encoder
        except Exception as exc:
            if attempt == 2:
                raise ConfigError(f"the ONNX query encoder at {path} does not work: {exc}") from exc
            # a truncated, foreign or stale file: export again once
            log.warning("cached ONNX query encoder %s is unusable (%s); exporting it again", path, exc)
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
        raise ConfigError(f"the ONNX query encoder supports Transformer -> mean Pooling models, not {names}")


def _fingerprint(model_path: str) -> str:
    """Changes when the weights, torch or the export recipe change (a reinstall re-exports)."""
    import torch

    parts = [EXPORT_RECIPE, torch.__version__, str(Path(model_path).resolve())]
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
    log.info("exporting the query encoder to %s (once per model)", path)
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


def _session(ort, path: Path):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Two threads without spinning: a query encodes in 4.0/5.9 ms p50/p95 vs 4.8/7.5 on one, and
    # with both cores busy (ingest running) 5.5/8.7 vs 5.8/13. A spinning idle thread would steal
    # the core PostgreSQL needs right after (torch's OpenMP threads did: search p95 33 vs 25 ms).
    options.intra_op_num_threads = min(2, os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # warnings about unused initialisers are noise
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _verify(encoder: OnnxQueryEncoder, model) -> None:
    """Refuse an export whose vectors differ from the torch model's: queries must land in the indexed space."""
    expected = model.encode(list(PROBES), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    got = np.vstack([encoder.encode(text) for text in PROBES])
    if got.shape != expected.shape:
        raise ConfigError(f"it makes {got.shape[1]}-dimensional vectors, the torch model {expected.shape[1]}")
    diff = float(np.abs(got - expected).max())
    if diff > MAX_ABS_DIFF:
        raise ConfigError(f"its vectors differ from the torch model's by up to {diff:.2e}")
