"""Local model runtime and batch size: seconds to embed the shared corpus's chunk texts (as ingest
makes them) with the local model on each `--runtimes` runtime (ONNX Runtime, torch) at each
`--sizes` batch size, after one untimed pass that loads it; `--rounds` passes per combination in
ABBA order (a neighbour's drifting load cancels out). Prints one JSON line: the files that failed
to load, each runtime's load seconds (ONNX first, so its figure has no torch import), seconds per
`runtime:size` (summed over rounds), each one's ratio to the fastest, and the CPU spent in the
kernel (page faults of the attention tensors) per combination.

    .venv/bin/python benchmarks/local_batch_size.py [--corpus DIR] [--chunks 800] [--sizes 8,16,64]
        [--runtimes onnx,torch] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _bench_db import SHARED  # noqa: E402  (the shared folder beside the repo, or RAG_SHARED)
from rag_lib.chunking import Chunker  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.documents import load_file  # noqa: E402
from rag_lib.embedding.local import LocalProvider, default_model_path  # noqa: E402
from rag_lib.flatten import flatten, load_mapping  # noqa: E402
from rag_lib.ingest import collect_files  # noqa: E402
from rag_lib.models import Document  # noqa: E402
from rag_lib.tokens import get_tokenizer  # noqa: E402


def corpus_texts(settings: Settings, corpus: Path) -> tuple[list[str], int]:
    """The embed texts of every chunk of the corpus, as ingest would make them, and how many files
    failed to load (the shared corpus holds real bad files; ingest records them and goes on)."""
    chunker = Chunker(get_tokenizer(settings.embedding.model_path or default_model_path()), settings.chunking)
    mapping = load_mapping(Path(settings.sections_file))
    texts: list[str] = []
    failed = 0
    for base, file in collect_files([corpus]):
        try:
            items = load_file(file, base, "bench", settings.max_file_bytes, settings.limits)
        except Exception:  # noqa: BLE001 - counted in the output, as ingest counts its failed files
            failed += 1
            continue
        for doc in (i for i in items if isinstance(i, Document)):
            raw = file.read_text(encoding="utf-8-sig") if doc.format == "yaml" else None
            texts.extend(c.embed_text for c in chunker.chunk(doc, flatten(doc, mapping, raw)))
    return texts, failed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", default=str(SHARED / "corpus"))
    parser.add_argument("--chunks", type=int, default=800, help="a random sample of this many chunk texts")
    parser.add_argument("--sizes", default="8,16,64")
    parser.add_argument("--runtimes", default="onnx,torch")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    settings = Settings(database_url="postgresql://unused/unused")
    texts, failed = corpus_texts(settings, Path(args.corpus))
    sample = random.Random(0).sample(texts, min(args.chunks, len(texts)))
    cfg = settings.embedding
    providers, load = {}, {}
    for runtime in sorted(args.runtimes.split(","), key=lambda r: r != "onnx"):
        t = time.perf_counter()
        providers[runtime] = LocalProvider(cfg.model, cfg.dimensions, batch_size=64, model_path=cfg.model_path,
                                           onnx_cache_dir=cfg.onnx_cache_dir, batch_runtime=runtime)
        providers[runtime].prepare()
        load[runtime] = round(time.perf_counter() - t, 2)
        providers[runtime].embed(sample[:128])  # untimed: first-call costs land outside every figure
    combos = [(r, int(s)) for r in args.runtimes.split(",") for s in args.sizes.split(",")]
    seconds = {f"{r}:{s}": 0.0 for r, s in combos}
    kernel = dict.fromkeys(seconds, 0.0)
    for n in range(args.rounds):
        for runtime, size in combos if n % 2 == 0 else reversed(combos):
            provider, key = providers[runtime], f"{runtime}:{size}"
            provider.batch_size = size
            before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            provider.embed(sample)
            seconds[key] += time.perf_counter() - t
            kernel[key] += resource.getrusage(resource.RUSAGE_SELF).ru_stime - before.ru_stime
    fastest = min(seconds.values())
    print(json.dumps({
        "corpus_chunks": len(texts), "files_failed_to_load": failed, "sample_chunks": len(sample),
        "rounds": args.rounds, "load_seconds": load,
        "seconds": {s: round(v, 2) for s, v in seconds.items()},
        "ratio_to_fastest": {s: round(v / fastest, 3) for s, v in seconds.items()},
        "kernel_cpu_seconds": {s: round(v, 2) for s, v in kernel.items()},
    }))


if __name__ == "__main__":
    main()
