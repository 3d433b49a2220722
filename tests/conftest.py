"""Shared fixtures: one real embedded PostgreSQL + pgvector server per test session, a fresh
database per test (copied from a template that already holds the migrations), and the real local
embedding model loaded once."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import psycopg
import pytest
from filelock import FileLock

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from testkit import create_database, scratch_database  # noqa: E402

from rag_lib.api import KnowledgeBase  # noqa: E402
from rag_lib.config import Settings  # noqa: E402
from rag_lib.db import start_embedded, stop_embedded  # noqa: E402
from rag_lib.embedding.local import LocalProvider  # noqa: E402
from rag_lib.store import apply_migrations  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_CORPUS = REPO.parent / "shared" / "corpus"
if not SHARED_CORPUS.is_dir():  # CI clones the repo with shared/ beside it
    SHARED_CORPUS = Path(os.environ.get("RAG_SHARED_CORPUS", "/work/shared/corpus"))
DEMO_CORPUS = REPO / "examples" / "corpus"
# The shared corpus's vectors as the local model makes them, named by _vectors_key (make test-vectors).
SHIPPED_VECTORS = Path(__file__).parent / "data" / "shared-corpus-vectors"


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory) -> str:
    """Admin URL of a session-wide embedded server (stopped at the end)."""
    pgdata = Path(tmp_path_factory.mktemp("pg")) / "pgdata"
    url = start_embedded(pgdata)
    # A throwaway cluster needs no durability: without a flush per commit and per copied database,
    # the hundreds of databases and small commits a session makes stop waiting on a shared disk.
    with psycopg.connect(url, autocommit=True) as conn:
        for name in ("fsync", "synchronous_commit", "full_page_writes"):
            conn.execute(f"ALTER SYSTEM SET {name} = off")
        conn.execute("SELECT pg_reload_conf()")
    yield url
    stop_embedded(pgdata)


@pytest.fixture(scope="session")
def migrated_template(pg_server: str) -> str:
    """Name of a template database holding every migration and nothing else: copying it is much
    cheaper than migrating each test's fresh database again."""
    name = "migrated_template"
    with psycopg.connect(create_database(pg_server, name), autocommit=True) as conn:
        apply_migrations(conn)
    return name


@pytest.fixture
def database_url(request, pg_server: str, migrated_template: str) -> Iterator[str]:
    """A fresh database for one test: the schema, no data, an empty embedding cache. Under the
    `warm_cache` marker (a module's `pytestmark`; `warm_cache(False)` on a test turns it off again)
    its cache already holds every shared-corpus vector, so ingesting copies of shared-corpus files
    calls no model: for tests of anything but embedding, which would otherwise encode the same
    files again in every test."""
    marker = request.node.get_closest_marker("warm_cache")
    warm = marker is not None and (marker.args or (True,))[0]
    with scratch_database(pg_server, request.getfixturevalue("cached_template") if warm else migrated_template) as url:
        yield url


@pytest.fixture
def empty_database_url(pg_server: str) -> Iterator[str]:
    """A fresh database without even the schema, for tests of migrating one."""
    with scratch_database(pg_server) as url:
        yield url


@pytest.fixture(scope="session")
def provider() -> LocalProvider:
    """The real all-MiniLM-L6-v2 model on ONNX Runtime, loaded once per session. Its export comes
    from the per-user cache the `rag` children use too (checked against its manifest on load), so
    a session neither exports it again nor imports torch until a test needs the torch model; the
    tests of exporting give their own folders."""
    p = LocalProvider("all-MiniLM-L6-v2", 384)
    p.load()
    return p


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Settings:
    return Settings(database_url=database_url, home=tmp_path / ".rag")


@pytest.fixture
def kb(settings: Settings, provider: LocalProvider) -> KnowledgeBase:
    base = KnowledgeBase(settings, provider=provider)
    yield base
    base.close()


@pytest.fixture
def corpus_copy(tmp_path: Path):
    """Copy files of the shared corpus into a temp root, keeping their relative paths."""

    def make(*rel_paths: str) -> Path:
        root = tmp_path / "corpus"
        for rel in rel_paths:
            src = SHARED_CORPUS / rel
            dst = root / rel
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        root.mkdir(exist_ok=True)
        return root

    return make


def _vectors_key(provider: LocalProvider, url: str) -> str:
    """A name for what the shared corpus's vectors depend on: the model's vector for a probe text
    (any change of weights, runtime or export changes it) and the cache table's columns (a
    migration that changes them)."""
    with psycopg.connect(url) as conn:
        columns = conn.execute("SELECT string_agg(column_name || ' ' || data_type, ',' ORDER BY ordinal_position)"
                               " FROM information_schema.columns WHERE table_name = 'rag_embedding_cache'").fetchone()[0]
    probe = provider.embed(["NVDA earnings: the stop held while the position was trimmed"]).round(5).tobytes()
    return hashlib.sha256(provider.space.encode() + probe + columns.encode()).hexdigest()[:16]


def _saved_vectors(config: pytest.Config, key: str) -> Path | None:
    """Where the shared corpus's vectors are kept between sessions: pytest's cache folder
    (`pytest --cache-clear` drops it; `-p no:cacheprovider` keeps nothing)."""
    cache = getattr(config, "cache", None)
    return None if cache is None else cache.mkdir("shared-corpus-vectors") / f"{key}.copy"


def _load_vectors(url: str, path: Path) -> None:
    """Add a binary COPY of embedding-cache rows (gzip-compressed when its name says so) to a database."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    with psycopg.connect(url) as conn, conn.cursor().copy("COPY rag_embedding_cache FROM STDIN (FORMAT binary)") as into:
        into.write(data)


def _cache_rows(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM rag_embedding_cache").fetchone()[0]


def _copy_cache(src_url: str, dst_url: str) -> None:
    """Copy every row of one database's embedding cache into another's."""
    with psycopg.connect(src_url) as src, psycopg.connect(dst_url) as dst:
        with src.cursor().copy("COPY rag_embedding_cache TO STDOUT (FORMAT binary)") as out, \
                dst.cursor().copy("COPY rag_embedding_cache FROM STDIN (FORMAT binary)") as into:
            for block in out:
                into.write(block)


@pytest.fixture(scope="session")
def corpus_template(request, pg_server: str, migrated_template: str, provider: LocalProvider, tmp_path_factory) -> str:
    """Name of a template database holding the whole shared corpus, ingested once per session
    (collection `default`, root = shared/corpus, so unit ids match the eval sets). Its embedding
    cache makes any later ingest of shared-corpus files free of model calls.

    Encoding the corpus's ~3,200 chunks would be most of a fresh session's setup (about 170 s of CPU
    on 2 cores): the vectors the model made for it in an earlier session (pytest's cache) or, on a
    fresh clone, the ones kept in tests/data (`make test-vectors`) are loaded into the cache first
    when the model still gives the same vectors for a probe, so only the ingest itself runs again
    (and the model encodes only chunks that are new since)."""
    name = "corpus_template"
    url = create_database(pg_server, name, template=migrated_template)
    key = _vectors_key(provider, url)
    saved, shipped = _saved_vectors(request.config, key), SHIPPED_VECTORS / f"{key}.copy.gz"
    # `make test` runs the suite in two worker processes, each with its own server and template:
    # on a cold cache the first one encodes and saves the vectors while the other waits to load them.
    with FileLock(saved.with_suffix(".lock")) if saved is not None else nullcontext():
        source = saved if saved is not None and saved.is_file() else shipped if shipped.is_file() else None
        if source is not None:
            _load_vectors(url, source)
        loaded = _cache_rows(url)
        home = tmp_path_factory.mktemp("template_home")
        with KnowledgeBase(Settings(database_url=url, home=home), provider=provider) as base:
            report = base.ingest([SHARED_CORPUS])
            assert report.count("failed") == 0, report.to_dict()
            base.store.ensure_hnsw_index(provider.space, provider.dimensions)
        if saved is not None and _cache_rows(url) > loaded:  # new chunks were encoded: keep theirs too
            partial = saved.with_suffix(".partial")
            with psycopg.connect(url) as conn, conn.cursor().copy("COPY rag_embedding_cache TO STDOUT (FORMAT binary)") as out, \
                    open(partial, "wb") as f:
                for block in out:
                    f.write(block)
            partial.replace(saved)  # a session stopped half-way leaves no truncated file behind
    return name


@pytest.fixture(scope="session")
def cached_template(pg_server: str, migrated_template: str, corpus_template: str) -> str:
    """Name of a template database holding the migrations and the shared corpus's embedding cache
    (copied from `corpus_template`), and nothing else."""
    name = "cached_template"
    url = create_database(pg_server, name, template=migrated_template)
    _copy_cache(pg_server.replace("/postgres?", f"/{corpus_template}?", 1), url)
    return name


@pytest.fixture
def corpus_db_url(pg_server: str, corpus_template: str) -> Iterator[str]:
    """A fresh database that already holds the whole shared corpus (copied from the template)."""
    with scratch_database(pg_server, corpus_template) as url:
        yield url


@pytest.fixture
def corpus_kb(corpus_db_url: str, provider: LocalProvider, tmp_path: Path) -> KnowledgeBase:
    """A knowledge base over the whole shared corpus (own database copy: safe to modify)."""
    base = KnowledgeBase(Settings(database_url=corpus_db_url, home=tmp_path / ".rag"), provider=provider)
    yield base
    base.close()


@pytest.fixture
def rag(monkeypatch, database_url, provider, tmp_path, capsys):
    """Run `rag ARGS…` in-process against a fresh database; returns (exit code, stdout, stderr)."""
    import sys

    import rag_lib.api
    from rag_lib.cli import main
    from rag_lib.config import get_settings

    monkeypatch.setenv("RAG_DATABASE_URL", database_url)
    monkeypatch.setenv("RAG_HOME", str(tmp_path / ".rag"))
    # stdout is captured, as a pipe: rows unwrapped unless COLUMNS is set (a pytest-xdist worker inherits 80)
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(rag_lib.api, "get_provider", lambda settings: provider)

    def run(*args: str) -> tuple[int, str, str]:
        get_settings.cache_clear()  # a test may change the environment between commands
        monkeypatch.setattr(sys, "argv", ["rag", *args])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    get_settings.cache_clear()


@pytest.fixture
def pg_instance(pg_server, database_url, tmp_path, monkeypatch):
    """A Postgres-backed Dagster instance (its own database on the session's server)."""
    import uuid

    import psycopg

    from pipelines.instance import get_instance, sqlalchemy_url

    name = "dagster_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    monkeypatch.setenv("DAGSTER_PG_URL", sqlalchemy_url(pg_server, name))
    instance = get_instance(Settings(database_url=database_url, home=tmp_path / ".rag"),
                            home=tmp_path / "dagster_home")
    yield instance
    instance.dispose()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with the most `slow` tests first (otherwise in their order): `make test`'s two
    workers take whole modules in this order, so the longest start early and no worker is left
    alone with one at the end."""
    slow = Counter(item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])  # a stable sort
