"""Re-take the README's Dagster UI screenshots (docs/img/*.png). Not run by the tests.

    .venv/bin/python docs/screenshots.py [NAME.png ...]   # needs Debian's `chromium`; `imagemagick`, `pngquant` optional

In a temp folder: an embedded PostgreSQL, `rag materialize` over a copy of examples/corpus (what
`make demo` does), then the webserver and daemon of `rag dev` on a free port, and headless
Chromium screenshots of the pages named in PAGES. Nothing outside the temp folder and docs/img
is touched."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from dagster_ui import BIN, running_dagster  # noqa: E402  (the tests' webserver helper)

from pipelines.instance import DAGSTER_YAML, sqlalchemy_url  # noqa: E402
from rag_lib.db import start_embedded, stop_embedded  # noqa: E402

OUT = REPO / "docs" / "img"
PARTITION = "corpus/knowledge/analysis/stock/NVDA_20260112T0930.yaml"  # <root name>/<path>
# file name → (UI path, pixel rows kept of the 1400×900 render)
PAGES = {
    "asset-lineage.png": ("/locations/rag_pipeline/asset-groups/corpus", 560),
    "chunks-partition.png": (f"/assets/chunks?view=partitions&partition={quote(PARTITION, safe='')}", 900),
    "asset-checks.png": ("/assets/chunks?view=checks", 900),
    "knowledge-graph.png": (f"/assets/knowledge_graph?view=partitions&partition={quote(PARTITION, safe='')}", 900),
    "retrieval-quality.png": ("/assets/hnsw_index?view=checks&checkDetail=retrieval_quality", 900),
}
EVAL = REPO / "examples" / "eval"  # what `make demo` configures for the retrieval_quality check


def shoot(url: str, target: Path, rows: int, budget_ms: int = 20000) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--window-size=1400,900", "--hide-scrollbars",
             f"--virtual-time-budget={budget_ms}", f"--screenshot={target}", url],
            check=True, capture_output=True, timeout=180)
    if rows < 900 and Path("/usr/bin/convert").exists():  # Debian's ImageMagick (not a stand-in on PATH)
        subprocess.run(["/usr/bin/convert", str(target), "-crop", f"1400x{rows}+0+0", "+repage", str(target)],
                       check=True)
    if shutil.which("pngquant"):  # lossy palette: about a third of the size, text stays sharp
        subprocess.run(["pngquant", "--force", "--skip-if-larger", "--quality=60-90", "--output", str(target),
                        str(target)], check=False)
    print(f"{target.relative_to(REPO)}: {target.stat().st_size // 1024} KB")


def main() -> None:
    only = set(sys.argv[1:])  # file names of PAGES to re-take (default: all)
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rag-shots-") as tmp:
        base = Path(tmp)
        pgdata = base / "pgdata"
        admin = start_embedded(pgdata)
        try:
            import psycopg

            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute('CREATE DATABASE "rag"')
                conn.execute('CREATE DATABASE "dagster"')
            root = base / "examples" / "corpus"
            shutil.copytree(REPO / "examples" / "corpus", root)
            home = base / ".rag"
            (home / "dagster_home").mkdir(parents=True)
            shutil.copyfile(DAGSTER_YAML, home / "dagster_home" / "dagster.yaml")
            (base / "rag.yaml").write_text("{}\n")  # empty: a developer's rag.yaml stays out
            env = {**os.environ, "RAG_DATABASE_URL": admin.replace("/postgres?", "/rag?", 1),
                   "RAG_HOME": str(home), "RAG_CONFIG": str(base / "rag.yaml"),
                   "DAGSTER_HOME": str(home / "dagster_home"), "DAGSTER_PG_URL": sqlalchemy_url(admin, "dagster"),
                   "DAGSTER_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                   "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                   "RAG_EVAL__QUERIES": str(EVAL / "queries.jsonl"), "RAG_EVAL__QRELS": str(EVAL / "qrels.tsv"),
                   "RAG_EVAL__NDCG_FLOOR": "0.5"}
            subprocess.run([str(BIN / "rag"), "materialize", str(root)], cwd=base, env=env, check=True)
            # a second run, so the retrieval_quality check shows a history and a baseline
            subprocess.run([str(BIN / "rag"), "materialize", str(root), "--force"], cwd=base, env=env, check=True)
            with running_dagster(env, base / "logs") as ui:
                ui.query("mutation { setNuxSeen }")  # the "Join the Dagster community" dialog covers the page
                time.sleep(5)
                for name, (path, rows) in PAGES.items():
                    if not only or name in only:
                        shoot(ui.url + path, OUT / name, rows)
        finally:
            stop_embedded(pgdata)


if __name__ == "__main__":
    main()
