"""CPU per query encoding with ONNX Runtime's intra-op threads spinning between operators or not
(onnx_encoder.py: queries do not spin, ingest batches do), in one run: SciFact claims encoded one
at a time, from 1 thread and from --clients threads at once (a server at capacity), then SciFact
abstract chunks encoded as ingest batches. Rounds alternate the two sessions so a change of the
machine's load hits both. Prints ONE JSON line with the load average.

    nice -n 5 .venv/bin/python benchmarks/onnx_spinning.py [--queries 200] [--chunks 200] [--clients 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import SHARED  # noqa: E402

import numpy as np  # noqa: E402

from rag_lib.embedding import onnx_encoder  # noqa: E402
from rag_lib.embedding.local import LOCAL_BATCH_SIZE, LocalProvider  # noqa: E402


def timed(fn) -> tuple[float, float]:
    """(CPU seconds of this process, wall seconds) that fn() took."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def concurrently(fn, items, clients: int) -> list:
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(fn, items))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--chunks", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    with open(SHARED / "datasets" / "scifact" / "queries.jsonl", encoding="utf-8") as fh:
        claims = [json.loads(line)["text"] for line in fh][: args.queries]
    with open(SHARED / "datasets" / "scifact" / "corpus.jsonl", encoding="utf-8") as fh:
        chunks = [json.loads(line)["text"][:1200] for line, _ in zip(fh, range(args.chunks))]

    encoder = LocalProvider("all-MiniLM-L6-v2", 384)._onnx
    import onnxruntime as ort

    sessions = {
        "spinning": onnx_encoder._session(ort, encoder.path, spinning=True),
        "not_spinning": encoder.query_session,
    }
    load_before = os.getloadavg()
    totals = {name: {"seq": [0.0, 0.0], "conc": [0.0, 0.0], "batch": [0.0, 0.0]} for name in sessions}
    vectors = {}
    for name, session in sessions.items():  # warm: each session's memory arena grows to the longest batch once
        encoder.query_session = encoder._batch_session = session
        encoder.encode(claims[0])
        encoder.encode_batch(chunks[:LOCAL_BATCH_SIZE], LOCAL_BATCH_SIZE, workers=1)
    for round_ in range(args.rounds):
        for name, session in sorted(sessions.items(), reverse=bool(round_ % 2)):  # alternate which goes first
            encoder.query_session = encoder._batch_session = session  # what encode and encode_batch run on
            for key, fn in (
                ("seq", lambda: [encoder.encode(c) for c in claims]),
                ("conc", lambda: concurrently(encoder.encode, claims, args.clients)),
                ("batch", lambda: vectors.__setitem__(name, encoder.encode_batch(chunks, LOCAL_BATCH_SIZE, workers=1))),
            ):
                cpu, wall = timed(fn)
                totals[name][key][0] += cpu
                totals[name][key][1] += wall
    n_q, n_c = args.queries * args.rounds, args.chunks * args.rounds
    result = {"queries": args.queries, "chunks": args.chunks, "clients": args.clients, "rounds": args.rounds,
              "cpus": os.cpu_count(), "load_before": [round(x, 1) for x in load_before],
              "load_after": [round(x, 1) for x in os.getloadavg()],
              "same_vectors": bool(np.allclose(vectors["spinning"], vectors["not_spinning"], atol=1e-5))}
    for name, t in totals.items():
        result[name] = {
            "query_cpu_ms": round(1000 * t["seq"][0] / n_q, 2), "query_wall_ms": round(1000 * t["seq"][1] / n_q, 2),
            f"query_cpu_ms_{args.clients}_clients": round(1000 * t["conc"][0] / n_q, 2),
            f"queries_per_s_{args.clients}_clients": round(n_q / t["conc"][1], 1),
            "batch_chunks_per_s": round(n_c / t["batch"][1], 1),
            "batch_cpu_ms_per_chunk": round(1000 * t["batch"][0] / n_c, 2),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
