"""Ingest benchmark: the shared corpus, copied N times into separate databases (each with its own
embedding cache, so every copy is really encoded) to exceed 5,000 chunks. Prints one JSON line:
end-to-end chunks/s against the raw encoder on the same texts and batch size (each copy's raw
encoding right after its ingest, so the load's drift meets both sides), the unchanged
re-run speed-up, peak RSS and the machine's load average before and after (the machine is shared:
read the figures beside it). The CPU each phase used (this process; the database server's
processes) is beside it: on a busy machine the wall-time ratio moves with the other jobs, while
`cpu_ratio` (the raw encoder's CPU per chunk over the ingest's, database included) says how much
work an ingest does beyond encoding.

    .venv/bin/python benchmarks/ingest.py [--corpus ../shared/corpus] [--copies 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_db import SHARED, create_database, scratch_server, tree_cpu  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.embedding.local import LOCAL_BATCH_SIZE, LocalProvider  # noqa: E402


def server_cpu(pgdata: Path) -> float:
    """CPU seconds the database server's processes have used so far, backends gone since included
    (their time is added to the server's `children_*` once reaped)."""
    return tree_cpu(int((pgdata / "postmaster.pid").read_text().split()[0]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--corpus", type=Path, default=SHARED / "corpus")
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=LOCAL_BATCH_SIZE)
    args = parser.parse_args()

    load_before = [round(x, 2) for x in os.getloadavg()]
    provider = LocalProvider("all-MiniLM-L6-v2", 384, batch_size=args.batch_size)
    provider.load()
    provider.embed(["warm up"])
    # and the batch session (a batch of two texts): the raw encoder below finds it made, so the
    # first copy's ingest does not pay for making it either
    provider.embed(["warm up", "the batch session"])
    with scratch_server() as (admin, work):
        documents = chunks = embedded = raw_texts = 0
        seconds = cpu = db_cpu = raw_seconds = raw_cpu = 0.0
        per_copy = []
        bases = []
        for n in range(args.copies):
            root = work / f"copy{n}"
            shutil.copytree(args.corpus, root)
            url = create_database(admin, f"bench{n}")
            base = KnowledgeBase(Settings(database_url=url, home=work / ".rag"), provider=provider)
            bases.append((base, root))
            started, cpu0, db0 = time.perf_counter(), time.process_time(), server_cpu(work / "pgdata")
            report = base.ingest([root])
            copy_seconds = time.perf_counter() - started
            seconds += copy_seconds
            cpu += time.process_time() - cpu0
            db_cpu += server_cpu(work / "pgdata") - db0
            documents += report.count("new")
            chunks += report.chunks
            embedded += report.embedded
            # Raw encoder: the same texts (this copy's unique chunks), same model and batch size, right
            # after the copy's ingest, so a change of the machine's load meets both sides of the ratio.
            with base.store.db.connection() as conn:
                texts = [r[0] for r in conn.execute(
                    "SELECT DISTINCT ON (content_hash) embed_text FROM rag_chunks ORDER BY content_hash")]
            started, cpu0 = time.perf_counter(), time.process_time()
            provider.embed(texts)
            copy_raw = time.perf_counter() - started
            raw_seconds += copy_raw
            raw_cpu += time.process_time() - cpu0
            raw_texts += len(texts)
            per_copy.append(round((report.embedded / copy_seconds) / (len(texts) / copy_raw), 3))
        raw_rate = raw_texts / raw_seconds
        # Re-run on the unchanged corpus: nothing to embed or publish.
        started = time.perf_counter()
        for base, root in bases:
            rerun = base.ingest([root])
            assert rerun.count("unchanged") == rerun.count("new") + rerun.count("unchanged") and rerun.embedded == 0
        rerun_seconds = time.perf_counter() - started
        for base, _ in bases:
            base.close()
    e2e_encoded_rate = embedded / seconds
    print(json.dumps({
        "benchmark": "ingest",
        "copies": args.copies,
        "documents": documents,
        "chunks": chunks,
        "chunks_encoded": embedded,
        "seconds": round(seconds, 2),
        "end_to_end_chunks_per_s": round(chunks / seconds, 2),
        "end_to_end_encoded_chunks_per_s": round(e2e_encoded_rate, 2),
        "raw_encoder_chunks_per_s": round(raw_rate, 2),
        "ratio": round(e2e_encoded_rate / raw_rate, 3),
        "ratio_per_copy": per_copy,
        "batch_size": args.batch_size,
        "ingest_cpu_s": {"python": round(cpu, 1), "database": round(db_cpu, 1)},
        "raw_cpu_s": round(raw_cpu, 1),
        "cpu_ratio": round((raw_cpu / raw_texts) / ((cpu + db_cpu) / embedded), 3),
        "rerun_seconds": round(rerun_seconds, 2),
        "rerun_speedup": round(seconds / rerun_seconds, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }))


if __name__ == "__main__":
    main()
