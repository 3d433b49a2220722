"""What `rag ingest PATH` reads to name the documents still served though their files are gone (the
report's `stale`; with --prune, what it deletes): the plan (`rag_lib.ingest.run._gone_documents`)
over a collection of --docs synthetic documents (rows written with COPY, no embedding), as it read
before (every document path of the collection) and now (only the documents under the ingested
paths, found by the path-prefix index of sql/024), timed in one run. Prints ONE JSON line.

Three ingests: one file (`one_file`), one folder of --per-folder documents given with --root
(`folder`), and the whole root (`root`: both read every document, the baseline). Per ingest: the
median milliseconds of each plan over --rounds, their ratio, the documents each read, and whether
both named the same stale documents.

    .venv/bin/python benchmarks/stale_plan.py [--docs 100000] [--per-folder 1000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._bench_db import create_database, scratch_server  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.ingest.run import PruneScope, _gone_documents  # noqa: E402
from rag_lib.store import Store, apply_migrations  # noqa: E402

import psycopg  # noqa: E402

COLLECTION = "bench"
INDEX = "rag_documents_path_prefix"


def doc_path(n: int, per_folder: int) -> str:
    return f"desk{n // per_folder:04d}/note{n:07d}.md"


def fill(url: str, root: Path, docs: int, per_folder: int) -> None:
    """`docs` document rows read from files under `root` (which are not on disk: all stale)."""
    with psycopg.connect(url, autocommit=True) as conn:
        apply_migrations(conn)
        with conn.cursor().copy("COPY rag_documents (collection, path, doc_id, doc_type, format, content_hash,"
                                " fingerprint, source_path) FROM STDIN") as cp:
            for n in range(docs):
                path = doc_path(n, per_folder)
                cp.write_row((COLLECTION, path, f"D{n}", "note", "md", "h", "f", str(root / path)))
        conn.execute("ANALYZE rag_documents")


class ReadsEveryPath:
    """The store as the plan used it before: the sources of every document of the collection."""

    def __init__(self, store: Store):
        self._store = store

    def __getattr__(self, name: str):
        return getattr(self._store, name)

    def document_sources_under(self, collection: str, folders, files) -> dict[str, str | None]:
        return {d["path"]: d["source_path"] for d in self._store.document_sources(collection)}


def compare(store: Store, root: Path, path: Path, on_disk: set[str], rounds: int) -> dict:
    """Old and new plan of an ingest of `path` (under `root`), alternating, `rounds` times each."""
    return timed({"old": ReadsEveryPath(store), "new": store}, root, path, on_disk, rounds)


def timed(plans: dict, root: Path, path: Path, on_disk: set[str], rounds: int) -> dict:
    """The median milliseconds of each store's plan (old, new), the documents each read, its stale ones."""
    scopes = [PruneScope.of(path, root)]
    times: dict[str, list[float]] = {name: [] for name in plans}
    result = {}
    for _ in range(rounds):
        for name, plan_store in plans.items():
            started = time.perf_counter()
            result[name] = _gone_documents(plan_store, COLLECTION, set(on_disk), scopes, on_disk, [], quiet=True)
            times[name].append((time.perf_counter() - started) * 1000)
    if len(plans) == 1:
        return {"ms": round(statistics.median(times["new"]), 2), "read": len(result["new"].sources)}
    old_ms, new_ms = (statistics.median(times[n]) for n in ("old", "new"))
    return {"old_ms": round(old_ms, 2), "new_ms": round(new_ms, 2), "ratio": round(old_ms / new_ms, 1),
            "old_read": len(result["old"].sources), "new_read": len(result["new"].sources),
            "stale": len(result["new"].gone), "same_stale": result["old"].gone == result["new"].gone}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--docs", type=int, default=100_000, help="documents in the collection (default: 100000)")
    ap.add_argument("--per-folder", type=int, default=1000, help="documents per folder (default: 1000)")
    ap.add_argument("--rounds", type=int, default=15, help="times each plan is timed; the median is reported")
    args = ap.parse_args()
    with scratch_server("rag-stale-plan-") as (admin, work):
        url = create_database(admin, "stale_plan")
        root = work / "corpus"
        fill(url, root, args.docs, args.per_folder)
        middle = doc_path(args.docs // 2, args.per_folder)  # the one file ingested: on disk, the others not
        (root / middle).parent.mkdir(parents=True)
        (root / middle).write_text("# Note\n\nThe desk's note.\n")
        store = Store(Settings(database_url=url, home=work / "home"))
        try:
            store.register_root(root, COLLECTION)
            with psycopg.connect(url) as conn:
                collation = conn.execute("SELECT datcollate FROM pg_database WHERE datname = current_database()"
                                         ).fetchone()[0]
            out = {"benchmark": "stale_plan", "documents": args.docs, "rounds": args.rounds, "collation": collation,
                   "one_file": compare(store, root, root / middle, {middle}, args.rounds),
                   "folder": compare(store, root, (root / middle).parent, {middle}, args.rounds),
                   "root": compare(store, root, root, {middle}, max(1, args.rounds // 5))}
            with psycopg.connect(url, autocommit=True) as conn:  # what the index adds: the new plan without it
                conn.execute(f"DROP INDEX {INDEX}")
            out["one_file_without_index"] = timed({"new": store}, root, root / middle, {middle}, args.rounds)
        finally:
            store.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
