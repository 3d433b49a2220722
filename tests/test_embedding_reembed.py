"""Re-embed without downtime: a new space (the stub's model over real HTTP) is filled beside the
local model's space while searches run; the switch is atomic, gated on coverage and dimensions
(and optionally quality), catches up documents published meanwhile; rollback restores the old."""

from __future__ import annotations

import json
import shutil
import threading
import time

import numpy as np
import psycopg
import pytest

from conftest import SHARED_CORPUS
from openai_stub import OpenAIStub, stub_vector
from testkit import RotatedProvider
from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.embedding import EmbeddingProvider, provider_for_space
from rag_lib.embedding.local import LocalProvider, default_model_path
from rag_lib.errors import DimensionMismatchError, EmbeddingError, ValidationError
from rag_lib.models import SourceFile
from rag_lib import reembed as rm

MODEL, DIMS = "stub-embed", 32
NEW = f"{MODEL}:{DIMS}"
OLD = "all-MiniLM-L6-v2:384"
FILES = ("tradegent/fixtures/sample_trade.yaml", "tradegent/fixtures/sample_earnings.yaml")
EXTRA = "tradegent/fixtures/sample_research.yaml"
QUERY = "earnings surprise and guidance for NVDA"
DEV_EVAL = SHARED_CORPUS.parent / "eval" / "tradegent-dev"
PLAIN_QUERY = "how position size should shrink when volatility rises"  # no ticker/type hints: raw cosines


@pytest.fixture
def stub():
    with OpenAIStub() as server:
        yield server


@pytest.fixture
def rkb(database_url, tmp_path, provider, stub, corpus_copy):
    """A knowledge base on the local model holding two files, with the stub registered as a target."""
    s = Settings(database_url=database_url, home=tmp_path / ".rag", embedding={
        "providers": [{"name": "stub", "provider": "openai_compatible", "base_url": stub.base_url,
                       "model": MODEL, "dimensions": DIMS, "batch_size": 8, "backoff_base": 0.01,
                       "max_retries": 1}],
        "reembed": {"batch_size": 16},
    })
    base = KnowledgeBase(s, provider=provider)
    root = corpus_copy(*FILES, EXTRA)
    base.ingest([root / FILES[0], root / FILES[1]], root=root)
    base.store.ensure_hnsw_index(OLD, 384)
    base.root = root
    yield base
    base.close()


def chunk_texts(kb: KnowledgeBase) -> dict[str, str]:
    with kb.store.db.connection() as conn:
        return dict(conn.execute("SELECT chunk_id, embed_text FROM rag_chunks").fetchall())


def space_vectors(kb: KnowledgeBase, space: str) -> dict[str, np.ndarray]:
    with kb.store.db.connection() as conn:
        rows = conn.execute("SELECT chunk_id, embedding FROM rag_chunk_vectors WHERE space = %s", (space,)).fetchall()
    return {cid: np.asarray(vec.to_numpy(), dtype=np.float32) for cid, vec in rows}


def classify(hits, queries: dict[str, np.ndarray], vectors: dict[str, dict[str, np.ndarray]]) -> str:
    """Which space every hit's similarity (its cosine with the query; the score may be weighted)
    came from ('mixed' if no single space explains all)."""
    for space, q in queries.items():
        if all(h.chunk_id in vectors[space]
               and abs(h.similarity - float(np.dot(q, vectors[space][h.chunk_id]))) < 1e-3 for h in hits):
            return space
    return "mixed"


def test_switch_is_atomic_while_searches_run(rkb, stub, provider):
    stub.latency = 0.03  # the fill takes a while, so searches overlap it
    seen: list = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def searcher() -> None:  # the public API, exactly as a server thread calls it
        while not stop.is_set():
            try:
                result = rkb.search(PLAIN_QUERY, mode="semantic", top_k=5)
                assert len(result.hits) == 5
                seen.append(result.hits)
            except BaseException as exc:  # noqa: BLE001 - any failure fails the test
                errors.append(exc)
                return

    thread = threading.Thread(target=searcher)
    thread.start()
    while len(seen) < 3 and not errors:
        time.sleep(0.01)
    settings = rkb.settings.model_copy(deep=True)
    settings.embedding.reembed.batch_size = 2  # many small fill rounds: searches interleave with them
    before = len(seen)
    report = rm.reembed(settings, rkb.store, NEW)
    n = len(seen)
    assert n - before >= 3  # searches kept being answered while the new space was being built
    while len(seen) < n + 3 and not errors:
        time.sleep(0.01)
    stop.set()
    thread.join()

    assert not errors, errors
    assert report.switched and all(g.passed for g in report.gates), report.gates
    assert report.index["created"] and report.chunks_from_cache == 0 and report.texts_embedded == report.chunks > 0
    queries = {OLD: provider.embed([PLAIN_QUERY])[0], NEW: stub_vector(MODEL, PLAIN_QUERY, DIMS)}
    vectors = {OLD: space_vectors(rkb, OLD), NEW: space_vectors(rkb, NEW)}
    spaces = [classify(hits, queries, vectors) for hits in seen]
    if "mixed" in spaces:  # debugging aid: show the first unexplained result
        hits = seen[spaces.index("mixed")]
        detail = [(h.chunk_id, h.similarity, {sp: (float(np.dot(queries[sp], vectors[sp][h.chunk_id]))
                                              if h.chunk_id in vectors[sp] else None) for sp in queries}) for h in hits]
        raise AssertionError(f"{spaces}: {detail}")
    first_new = spaces.index(NEW)
    assert set(spaces[:first_new]) == {OLD} and set(spaces[first_new:]) == {NEW}  # one switch, never back
    status = rm.status(rkb.store)
    by_space = {s["space"]: s for s in status["spaces"]}
    assert status["active"] == NEW and by_space[OLD]["status"] == "retired" and status["rollback_to"] == OLD
    assert by_space[NEW]["coverage"] == 1.0 and by_space[NEW]["hnsw_index"]
    usage = rkb.store.run_usage(report.run_id)
    assert usage["cache_misses"] == report.texts_embedded == usage["providers"][0]["inputs"]
    assert usage["requests"] >= report.texts_embedded / 8 and usage["tokens"] > 0  # batches of 8 texts


def test_rollback_restores_the_old_space_and_a_second_reembed_is_free(rkb, stub, provider):
    before = [h.chunk_id for h in rkb.search(QUERY, top_k=5).hits]
    rm.reembed(rkb.settings, rkb.store, NEW)
    assert rkb.store.active_space()["space"] == NEW
    report = rm.rollback(rkb.settings, rkb.store)
    assert report.switched and report.space == OLD and report.chunks == 0
    assert report.seconds > 0  # what `rag reembed --rollback` reports it took
    assert rkb.store.active_space()["space"] == OLD
    assert [h.chunk_id for h in rkb.search(QUERY, top_k=5).hits] == before

    n_new = rkb.store.get_space(NEW)["vectors"]
    assert rm.drop_old(rkb.store) == {NEW: n_new} and n_new > 0
    assert NEW not in {s["space"] for s in rkb.store.list_spaces()}
    requests = stub.requests
    again = rm.reembed(rkb.settings, rkb.store, NEW)  # the cache still holds every vector
    assert again.switched and again.texts_embedded == 0 and again.chunks_from_cache == again.chunks > 0
    assert stub.requests == requests


def test_documents_published_during_a_build_are_caught_up(rkb, stub):
    from typer.testing import CliRunner

    from rag_lib.cli import app
    from rag_lib.cli.app import STATE

    partial = rm.reembed(rkb.settings, rkb.store, NEW, switch=False)
    assert not partial.switched and rkb.store.active_space()["space"] == OLD
    rkb.ingest([rkb.root / EXTRA], root=rkb.root)  # published into the active space only
    info = rkb.store.get_space(NEW)
    assert info["status"] == "building" and info["vectors"] < info["chunks"]
    STATE["kb"] = rkb
    try:  # `rag status` said nothing of the half-built space, only `rag reembed --status` did
        said = " ".join(CliRunner().invoke(app, ["status"]).output.split())
    finally:
        STATE["kb"] = None
    assert (f"a re-embed into {NEW} is under way or was stopped: {info['vectors']} of {info['chunks']} chunks have a "
            f"vector there; `rag reembed --to {NEW}` resumes it, `rag reembed --abort` abandons it") in said
    with pytest.raises(ValidationError, match=r"cannot switch to stub-embed:32: \d+ chunks lack a vector"):
        rkb.store.switch_active(NEW)
    report = rm.reembed(rkb.settings, rkb.store, NEW)
    assert report.switched and report.chunks == info["chunks"] - info["vectors"]
    assert rkb.store.get_space(NEW)["coverage"] == 1.0
    # a long-running process that started before the switch cannot publish into the retired space
    prepared = rkb.engine.preparer.prepare(rkb.engine.preparer.load(SourceFile("default", rkb.root, EXTRA)).documents[0])
    vectors = rkb.engine.embedder.embed(prepared.chunks).vectors
    with pytest.raises(DimensionMismatchError, match="the active space is now stub-embed:32"):
        rkb.engine.publisher.publish(prepared, vectors)
    assert rkb.store.get_space(NEW)["coverage"] == 1.0
    # a process still configured for the old space is stopped with the command to run
    with pytest.raises(DimensionMismatchError, match=r"run `rag reembed --to all-MiniLM-L6-v2:384`"):
        rkb.ingest([rkb.root / EXTRA], root=rkb.root, force=True)


def _extra_prepared(kb: KnowledgeBase):
    """EXTRA (not ingested by `rkb`) chunked and embedded by the knowledge base's own engine."""
    prepared = kb.engine.preparer.prepare(kb.engine.preparer.load(SourceFile("default", kb.root, EXTRA)).documents[0])
    return prepared, kb.engine.embedder.embed(prepared.chunks).vectors


def test_a_publish_racing_the_switch_is_refused_not_served_without_a_vector(rkb, stub, monkeypatch):
    """An ingest under the old settings checked the active space, then a re-embed's switch committed,
    then it wrote the document: its chunks had no vector in the now-active space (invisible to
    semantic search until the next ingest). The check is part of the publishing transaction now, so
    this interleaving is refused with the line that names the new space, and nothing is written."""
    assert not rm.reembed(rkb.settings, rkb.store, NEW, switch=False).switched
    prepared, vectors = _extra_prepared(rkb)
    publish_document = rkb.store.publish_document

    def switch_then_publish(*args, **kwargs):  # the switch commits after the publisher's own checks
        assert rkb.store.switch_active(NEW) == OLD
        return publish_document(*args, **kwargs)

    monkeypatch.setattr(rkb.store, "publish_document", switch_then_publish)
    with pytest.raises(DimensionMismatchError, match=f"the active space is now {NEW}"):
        rkb.engine.publisher.publish(prepared, vectors)
    assert rkb.store.active_space()["space"] == NEW
    assert rkb.validate_database()["chunks_without_vector"]["count"] == 0
    assert EXTRA not in rkb.store.document_states("default")


def test_a_switch_waits_for_a_publish_under_way_and_then_sees_its_chunks(rkb, stub, monkeypatch):
    """The other order: a publish inside its transaction holds the switch back until it commits; the
    switch's coverage check then counts its chunks (no vector in the new space yet) and refuses, and
    the next fill catches them up. Neither side deadlocks on the other's locks."""
    import rag_lib.store.documents as store_documents

    assert not rm.reembed(rkb.settings, rkb.store, NEW, switch=False).switched
    prepared, vectors = _extra_prepared(rkb)
    inside, release = threading.Event(), threading.Event()
    change_lexeme_frequencies = store_documents.change_lexeme_frequencies

    def paused(*args, **kwargs):  # the publish's last write, in its transaction
        change_lexeme_frequencies(*args, **kwargs)
        inside.set()
        assert release.wait(60)

    monkeypatch.setattr(store_documents, "change_lexeme_frequencies", paused)
    outcome: dict = {}

    def run(name, call):
        try:
            outcome[name] = call()
        except Exception as exc:  # noqa: BLE001 - asserted below
            outcome[name] = exc

    publisher = threading.Thread(target=run, args=("publish", lambda: rkb.engine.publisher.publish(prepared, vectors)))
    switcher = threading.Thread(target=run, args=("switch", lambda: rkb.store.switch_active(NEW)))
    publisher.start()
    try:
        assert inside.wait(60)
        switcher.start()
        assert _waits_for_a_lock(rkb, "LOCK TABLE rag_chunks IN SHARE MODE")
    finally:
        release.set()
        publisher.join(60)
        switcher.join(60)
    assert outcome["publish"] is None
    assert isinstance(outcome["switch"], ValidationError) and "chunks lack a vector" in str(outcome["switch"])
    assert rkb.store.active_space()["space"] == OLD
    monkeypatch.undo()
    assert rm.reembed(rkb.settings, rkb.store, NEW).switched
    assert rkb.validate_database()["chunks_without_vector"]["count"] == 0


def _waits_for_a_lock(kb: KnowledgeBase, statement: str, timeout: float = 30.0) -> bool:
    """Whether a backend running `statement` is seen waiting for a lock within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(kb.settings.database_url, autocommit=True) as conn:  # a fresh view on every read
        while time.monotonic() < deadline:
            if conn.execute("SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query = %s",
                            (statement,)).fetchone():
                return True
            time.sleep(0.02)
    return False


def test_a_failed_fill_never_switches_and_writes_nothing_bad(rkb, stub):
    settings = rkb.settings.model_copy(deep=True)
    settings.embedding.reembed.batch_size = 4  # fill rounds of 4 chunks: one request each
    # failing before one vector is stored (a wrong setting): no space is left building to block the next
    stub.script(["wrong_dims"])
    with pytest.raises(DimensionMismatchError):
        rm.reembed(settings, rkb.store, NEW)
    stub.clear_script()
    assert NEW not in {s["space"] for s in rkb.store.list_spaces()}
    stub.script(["ok", "500", "500"])  # round 1 succeeds, round 2 fails after its one retry
    with pytest.raises(EmbeddingError, match="failed after 2 attempts"):
        rm.reembed(settings, rkb.store, NEW)
    assert rkb.store.active_space()["space"] == OLD
    info = rkb.store.get_space(NEW)
    assert info["status"] == "building" and 0 < info["vectors"] < info["chunks"] and info["wrong_dims"] == 0
    assert info["vectors"] == 4
    gates = {g.name: g for g in rm.Reembedder(rkb.settings, rkb.store, provider_for_space(rkb.settings, NEW)).gates()}
    assert not gates["coverage"].passed and gates["dimensions"].passed

    stub.script(["wrong_dims"])
    with pytest.raises(DimensionMismatchError, match="33-dimensional"):
        rm.reembed(settings, rkb.store, NEW)
    stub.clear_script()
    assert rkb.store.get_space(NEW)["vectors"] == info["vectors"]  # nothing written by the bad batch
    with pytest.raises(DimensionMismatchError, match="nothing was written"):
        rkb.store.write_space_vectors(NEW, DIMS, [("x", np.ones(DIMS + 1, dtype=np.float32))])

    assert rm.abort(rkb.store) == NEW
    assert NEW not in {s["space"] for s in rkb.store.list_spaces()}
    report = rm.reembed(rkb.settings, rkb.store, NEW)  # resumes from the cache, pays only for the rest
    assert report.switched and report.chunks_from_cache == info["vectors"]


def test_quality_gate_is_pluggable(rkb, stub, tmp_path):
    scores = {OLD: 0.60, NEW: 0.50}
    scorer = lambda store, provider, space, eval_set: scores[space["space"]]  # noqa: E731
    settings = rkb.settings.model_copy(deep=True)
    settings.embedding.reembed.eval_set = tmp_path
    settings.embedding.reembed.ndcg_tolerance = 0.05
    report = rm.reembed(settings, rkb.store, NEW, scorer=scorer)
    quality = next(g for g in report.gates if g.name == "quality")
    assert not report.switched and not quality.passed and "nDCG@10 0.5000" in quality.detail
    assert rkb.store.active_space()["space"] == OLD
    settings.embedding.reembed.ndcg_tolerance = 0.2
    assert rm.reembed(settings, rkb.store, NEW, scorer=scorer).switched


def test_a_reembed_into_the_rollback_space_that_does_not_switch_leaves_the_rollback_in_place(rkb, stub, tmp_path):
    """`rag reembed --to X` where X is the space a rollback returns to, refused by its quality gate
    or stopped by an error: X was left 'building', so `rag reembed --rollback` answered "no retired
    embedding space" and `rag reembed --abort`, which status then offered, would drop X's vectors."""
    rm.reembed(rkb.settings, rkb.store, NEW)
    rm.rollback(rkb.settings, rkb.store)
    settings = rkb.settings.model_copy(deep=True)
    settings.embedding.reembed.eval_set = tmp_path
    worse = lambda store, provider, space, eval_set: 0.1 if space["space"] == NEW else 0.9  # noqa: E731

    def broken(store, provider, space, eval_set):
        raise EmbeddingError("the eval set's provider is down")

    assert not rm.reembed(settings, rkb.store, NEW, scorer=worse).switched
    assert rkb.store.get_space(NEW)["status"] == "retired" and rkb.store.previous_space() == NEW
    with pytest.raises(EmbeddingError, match="provider is down"):
        rm.reembed(settings, rkb.store, NEW, scorer=broken)
    assert rkb.store.get_space(NEW)["status"] == "retired" and rkb.store.previous_space() == NEW
    back = rm.rollback(rkb.settings, rkb.store)
    assert back.switched and back.chunks == 0 and rkb.store.active_space()["space"] == NEW


def test_settings_naming_the_new_model_before_the_reembed_still_search_and_reembed(rkb, stub, tmp_path):
    """The operator edits embedding.* to name the new model first, then runs `rag reembed --to` it.
    Searches failed ("no provider for 'all-MiniLM-L6-v2:384': add an entry ... to
    embedding.providers"), and so did the re-embed, at its quality gate, after paying for the fill:
    the installed local model, which the default settings name, now needs no entry."""
    before = [h.chunk_id for h in rkb.search(QUERY, top_k=5).hits]
    edited = Settings(database_url=rkb.settings.database_url, home=rkb.settings.home, embedding={
        "provider": "openai_compatible", "base_url": stub.base_url, "model": MODEL, "dimensions": DIMS,
        "backoff_base": 0.01, "max_retries": 1, "reembed": {"eval_set": str(tmp_path)}})
    kb = KnowledgeBase(edited)
    try:
        assert [h.chunk_id for h in kb.search(QUERY, top_k=5).hits] == before
        same = lambda store, provider, space, eval_set: 0.5  # noqa: E731
        assert rm.reembed(edited, kb.store, NEW, scorer=same).switched
    finally:
        kb.close()


def test_default_quality_gate_scores_each_space_on_the_eval_set(rkb, stub, tmp_path):
    """The real scorer (rag_lib.eval) on a tiny BEIR set: the stub's random vectors retrieve worse
    than the local model, so a strict tolerance refuses the switch and a loose one allows it."""
    import json

    units = [h.unit_id for h in rkb.search(QUERY, mode="semantic", top_k=3).hits]
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": QUERY}) + "\n")
    (tmp_path / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q1\t{u}\t1\n" for u in units))
    settings = rkb.settings.model_copy(deep=True)
    settings.embedding.reembed.eval_set = tmp_path
    settings.embedding.reembed.ndcg_tolerance = 0.0
    report = rm.reembed(settings, rkb.store, NEW)
    quality = next(g for g in report.gates if g.name == "quality")
    old_score = float(quality.detail.split(" vs ")[1].split()[0])
    assert not report.switched and not quality.passed and old_score > 0.9, quality.detail
    settings.embedding.reembed.ndcg_tolerance = 1.0
    assert rm.reembed(settings, rkb.store, NEW).switched


def test_cli_reembed_status_rollback_and_cache(rkb, stub, monkeypatch):
    from typer.testing import CliRunner

    from rag_lib.cli import app
    from rag_lib.cli.app import STATE
    import json

    STATE["kb"] = rkb
    runner = CliRunner()
    try:
        out = runner.invoke(app, ["reembed", "--to", NEW, "--json"])
        assert out.exit_code == 0, out.output
        assert json.loads(out.output.strip().splitlines()[-1])["switched"] is True
        out = runner.invoke(app, ["reembed", "--status", "--json"])
        data = json.loads(out.output)
        assert data["active"] == NEW and data["rollback_to"] == OLD
        out = runner.invoke(app, ["reembed", "--rollback"])
        assert out.exit_code == 0 and "now the active space" in out.output
        out = runner.invoke(app, ["reembed", "--drop-old", "--json"])
        assert NEW in json.loads(out.output)
        out = runner.invoke(app, ["cache", "stats", "--json"])
        models = {m["model"] for m in json.loads(out.output)["models"]}
        assert models == {"all-MiniLM-L6-v2", MODEL}
        out = runner.invoke(app, ["status"])
        flat = "".join(out.output.split())  # rich wraps to the runner's narrow terminal
        assert out.exit_code == 0 and "embeddingusagebyprovider" in flat and "recentembeddingruns" in flat, out.output
        out = runner.invoke(app, ["reembed"])
        assert out.exit_code == 2
    finally:
        STATE["kb"] = None


def test_the_report_counts_chunks_and_texts_apart(rkb, stub):
    """Chunks with the same text (a copied file's) share one vector, embedded once. The report said
    "N vectors written (0 from cache, M embedded)", N chunks and M distinct texts, so its parts did not
    add up; each count now says what it counts (the --all/--version payload counts the same way)."""
    from typer.testing import CliRunner

    from rag_lib.cli import app
    from rag_lib.cli.app import STATE

    (rkb.root / "copy").mkdir()
    shutil.copy(rkb.root / FILES[0], rkb.root / "copy" / "trade.yaml")
    rkb.ingest([rkb.root / "copy" / "trade.yaml"], root=rkb.root)
    texts = chunk_texts(rkb)
    chunks, distinct = len(texts), len(set(texts.values()))
    assert distinct < chunks
    rkb.settings.embedding.reembed.batch_size = chunks  # one fill round (a later round's copies hit the cache)
    STATE["kb"] = rkb
    try:
        said = " ".join(CliRunner().invoke(app, ["reembed", "--to", NEW, "--no-switch"]).output.split())
        assert f"{NEW}: {chunks} chunks given a vector (0 from the embedding cache; {distinct} distinct texts " \
               f"embedded for the other {chunks}) in " in said, said
        rm.abort(rkb.store)  # the cache keeps every vector: the next fill pays for none
        out = CliRunner().invoke(app, ["reembed", "--to", NEW, "--no-switch", "--json"]).output
    finally:
        STATE["kb"] = None
    report = json.loads(out.strip().splitlines()[-1])
    assert (report["chunks"], report["chunks_from_cache"], report["texts_embedded"]) == (chunks, chunks, 0)


def test_after_a_switch_rag_names_the_settings_to_set_or_that_they_name_it_already(rkb, stub):
    """After `rag reembed --to`, rag said "Set embedding.model/dimensions (and provider) to match" without
    their values, and said it again after a rollback to the space the settings already named; `rag
    status` offered `rag reembed --to` the retired space, where `--rollback` switches back at no cost."""
    from typer.testing import CliRunner

    from rag_lib.cli import app
    from rag_lib.cli.app import STATE

    STATE["kb"] = rkb
    try:
        said = " ".join(CliRunner().invoke(app, ["reembed", "--to", NEW]).output.split())
        assert (f"{NEW} is now the active space (was {OLD}). Set embedding.provider openai_compatible, model "
                f"{MODEL}, dimensions {DIMS} (and its base_url) in rag.yaml and restart the servers;") in said
        assert rkb.space_mismatch().endswith(
            "(`rag reembed --rollback` switches back to it, or set embedding.provider openai_compatible, model "
            f"{MODEL}, dimensions {DIMS} (and its base_url))")
        said = " ".join(CliRunner().invoke(app, ["reembed", "--rollback"]).output.split())
        assert f"{OLD} is now the active space (was {NEW}). The settings name it already: `rag ingest`" in said
        assert "Set embedding" not in said and rkb.space_mismatch() is None
    finally:
        STATE["kb"] = None


def test_reembed_status_in_80_columns_prints_each_space_name_whole(rkb, stub, monkeypatch):
    """`rag reembed --status` in an 80-column terminal cut the names `--to` takes: "all-Mi…", "stub-e…"."""
    from typer.testing import CliRunner

    from rag_lib.cli import app
    from rag_lib.cli.app import STATE

    rm.reembed(rkb.settings, rkb.store, NEW)
    monkeypatch.setenv("COLUMNS", "80")
    STATE["kb"] = rkb
    try:
        out = CliRunner().invoke(app, ["reembed", "--status"]).output
    finally:
        STATE["kb"] = None
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    assert f"│ {OLD} │ retired │" in out and f"│ {NEW} " in out, out


def test_a_second_reembed_to_the_same_space_is_refused_while_the_first_runs(rkb, stub):
    """Two `rag reembed --to X` at once: the second raced the first to the index (a raw
    DuplicateTable) or to the switch; it is refused up front in one line, the first one finishes."""
    from rag_lib.errors import ReembedRunningError

    filling, refused = threading.Event(), threading.Event()
    outcome: dict = {}

    def progress(done: int, total: int) -> None:  # the first re-embed, paused while it fills
        filling.set()
        refused.wait(60)

    def first() -> None:
        outcome["first"] = rm.reembed(rkb.settings, rkb.store, NEW, progress=progress)

    worker = threading.Thread(target=first)
    worker.start()
    try:
        assert filling.wait(60)
        with pytest.raises(ReembedRunningError, match=f"a re-embed to {NEW} is already running in another process"):
            rm.reembed(rkb.settings, rkb.store, NEW)
    finally:
        refused.set()
        worker.join(60)
    assert outcome["first"].switched
    assert rkb.store.active_space()["space"] == NEW


def gate_scores(report: rm.ReembedReport) -> tuple[str, str]:
    """(new, old) nDCG@10 as the quality gate's detail states them (4 decimals)."""
    detail = next(g for g in report.gates if g.name == "quality").detail
    return detail.split()[1], detail.split(" vs ")[1].split()[0]


@pytest.mark.warm_cache
def test_quality_gate_scores_a_rotated_copy_of_the_active_space_exactly_as_the_active_space(
        database_url, tmp_path, provider, corpus_copy):
    """The same cosines score the same nDCG@10 in both spaces, run after run: the new space gets the
    ticker profiles entity linking needs (the active space's linked, the new one's did not: 0.58 vs
    0.60 on the QA corpus) and both are ranked exactly, not one by its own HNSW walk."""
    settings = Settings(database_url=database_url, home=tmp_path / ".rag",
                        embedding={"reembed": {"eval_set": str(DEV_EVAL), "ndcg_tolerance": 0.0}})
    kb = KnowledgeBase(settings, provider=provider)
    root = corpus_copy("tradegent/knowledge/analysis")
    kb.ingest([root], root=root)
    kb.store.ensure_hnsw_index(OLD, 384)
    assert kb.store.profile_collections(OLD)  # the active space links tickers
    target = RotatedProvider(provider)
    reembedder = rm.Reembedder(settings, kb.store, target, active_provider=provider)
    reembedder.start()  # the chunks' vectors rotated directly (the model is for the queries and profiles)
    kb.store.write_space_vectors(target.space, 384, [(cid, vec @ target.rotation.T)
                                                     for cid, vec in space_vectors(kb, OLD).items()])
    try:
        checked = reembedder.run(switch=False)
        switched = rm.Reembedder(settings, kb.store, target, active_provider=provider).run()
    finally:
        kb.close()
    new, old = gate_scores(checked)
    assert float(old) > 0 and new == old and gate_scores(switched) == (new, old), (checked.gates, switched.gates)
    assert switched.switched


def _settings_naming(database_url: str, home, target: EmbeddingProvider) -> Settings:
    """Settings whose embedding.model/dimensions name `target`'s space, as the README has the
    operator set them after a switch."""
    return Settings(database_url=database_url, home=home,
                    embedding={"model": target.model, "dimensions": target.dimensions})


@pytest.mark.warm_cache
def test_settings_naming_the_new_space_republish_nothing_and_a_rollback_needs_no_vector(
        database_url, tmp_path, provider, corpus_copy):
    """The operator's sequence: ingest, re-embed into another space, set embedding.model/dimensions
    to it, `rag ingest` again. Its fingerprint names the new model: every document was republished
    and the retired space lost its vectors, so a rollback had to fill it again. Now every document
    is current, searches rank as before, and a rollback and the old settings find all in place."""
    home = tmp_path / ".rag"
    old_settings = Settings(database_url=database_url, home=home)
    root = corpus_copy(*FILES, EXTRA)
    old_kb = KnowledgeBase(old_settings, provider=provider)
    target = RotatedProvider(provider)  # same cosines: the same rankings in either space
    new_kb = KnowledgeBase(_settings_naming(database_url, home, target), provider=target)
    try:
        documents = old_kb.ingest([root], root=root).count("new")
        before = [h.chunk_id for h in old_kb.search(QUERY, top_k=5).hits]
        switched = rm.reembed(old_settings, old_kb.store, target.space, target=target)
        assert switched.switched

        again = new_kb.ingest([root], root=root)
        assert again.count("unchanged") == documents > 0 and again.chunks == 0
        assert again.texts_embedded == again.chunks_from_cache == 0  # nor was any file staged again
        assert [h.chunk_id for h in new_kb.search(QUERY, top_k=5).hits] == before
        retired = new_kb.store.get_space(OLD)
        assert retired["status"] == "retired" and retired["vectors"] == retired["chunks"]
        assert switched.carried["documents"] == documents

        back = rm.rollback(new_kb.settings, new_kb.store)
        assert back.switched and back.chunks == 0 and back.carried["documents"] == documents
        assert old_kb.ingest([root], root=root).count("unchanged") == documents
        assert [h.chunk_id for h in old_kb.search(QUERY, top_k=5).hits] == before
    finally:
        new_kb.close()
        old_kb.close()


class ShortInputProvider(RotatedProvider):
    """A rotated space whose provider takes fewer tokens per input: its chunker cuts other chunks."""

    def tokenizer(self):
        from rag_lib.embedding.budget import LimitedTokenizer

        return LimitedTokenizer(self.base.tokenizer(), 128, exact=True)


@pytest.mark.warm_cache
def test_vectors_the_old_model_staged_are_never_published_in_the_new_space(
        database_url, tmp_path, provider, corpus_copy):
    """A switch to a space whose tokenizer cuts other chunks carries nothing over. The vector_table
    stage run alone under settings naming that space (a Dagster run of the asset) found the old
    model's staged vectors, of the same size, and served them in the new space."""
    from rag_lib.corpus_scan import FileTarget
    from rag_lib.ingest.stages import Engine
    from rag_lib.ingest.state import StageRunner

    home = tmp_path / ".rag"
    old_settings = Settings(database_url=database_url, home=home)
    root = corpus_copy(FILES[0])
    kb = KnowledgeBase(old_settings, provider=provider)
    try:
        kb.ingest([root], root=root)
        target = ShortInputProvider(provider)
        switched = rm.reembed(old_settings, kb.store, target.space, target=target)
        assert switched.switched
        served = space_vectors(kb, target.space)
        new_settings = _settings_naming(database_url, home, target)
        runner = StageRunner(new_settings, kb.store, lambda: Engine(new_settings, kb.store, target))
        (outcome,) = runner.vector_table([FileTarget("default", root, FILES[0], FILES[0])])
        assert outcome.status == "failed" and "rematerialize embeddings" in outcome.error, outcome
        now = space_vectors(kb, target.space)
        assert now.keys() == served.keys() and all(np.array_equal(now[c], served[c]) for c in served)
        assert "cuts other chunks" in switched.carried["skipped"]
    finally:
        kb.close()


@pytest.mark.warm_cache
def test_a_document_lacking_a_vector_in_the_new_space_is_not_carried_over(
        database_url, tmp_path, provider, corpus_copy):
    """A document whose chunk has no vector in the new space (one an old-settings ingest published
    just as the switch committed) keeps its fingerprint, and so does its file's staging: settings
    naming the new space republish that document alone."""
    home = tmp_path / ".rag"
    old_settings = Settings(database_url=database_url, home=home)
    root = corpus_copy(*FILES)
    old_kb = KnowledgeBase(old_settings, provider=provider)
    target = RotatedProvider(provider)
    new_kb = KnowledgeBase(_settings_naming(database_url, home, target), provider=target)
    try:
        old_kb.ingest([root], root=root)
        assert not rm.reembed(old_settings, old_kb.store, target.space, target=target, switch=False).switched
        old_kb.store.switch_active(target.space)
        with old_kb.store.db.connection() as conn:
            conn.execute("DELETE FROM rag_chunk_vectors WHERE space = %s AND chunk_id = (SELECT min(chunk_id)"
                         " FROM rag_chunks WHERE path = %s)", (target.space, FILES[0]))
        carried = rm.carry_over(old_settings, old_kb.store, OLD, target.space)
        assert carried["documents"] == 1
        again = new_kb.ingest([root], root=root)
        assert {o.path: o.status for o in again.outcomes} == {FILES[0]: "changed", FILES[1]: "unchanged"}
        assert new_kb.validate_database()["chunks_without_vector"]["count"] == 0
    finally:
        new_kb.close()
        old_kb.close()


def changed_model_copy(folder) -> str:
    """A copy of the installed model's files with one weight changed: another model, as a fine-tuned
    copy or new files put in place of the old would be, under the same name."""
    import shutil
    from pathlib import Path

    from safetensors.numpy import load_file, save_file

    source = Path(default_model_path())
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("model.safetensors"))
    weights = load_file(str(source / "model.safetensors"))
    weights["embeddings.LayerNorm.bias"] = weights["embeddings.LayerNorm.bias"] + np.float32(0.01)
    save_file(weights, str(Path(folder) / "model.safetensors"))
    return str(folder)


class ChangedModel(LocalProvider):
    """A local model at `model_path` (its files, so its key), whose vectors here are the installed
    model's turned by a rotation (another model's vectors, without exporting it to ONNX)."""

    def __init__(self, base: LocalProvider, model_path: str):
        super().__init__(base.model, base.dimensions, model_path=model_path)
        self.base, self.rotation = base, RotatedProvider(base).rotation

    def embed(self, texts: list[str]) -> np.ndarray:
        return (self.base.embed(texts) @ self.rotation.T).astype(np.float32)

    def embed_counted(self, texts: list[str]):
        vectors, usage = self.base.embed_counted(texts)
        return (vectors @ self.rotation.T).astype(np.float32), usage


@pytest.mark.warm_cache
def test_another_local_model_under_the_same_name_makes_its_own_space_never_served_the_cached_vectors(
        database_url, tmp_path, provider, corpus_copy, monkeypatch):
    """embedding.model_path changed (a fine-tuned copy) and embedding.model kept: its vectors used to
    be keyed by the name alone, so an ingest found every document current, `--force` served the
    old model's cached vectors and new files were embedded by the new one into the same space
    (searches embedded with the new model). Now a local model other than the installed one keys
    its cache, space and stored outputs by its files' identity: the ingest and searches refuse,
    naming the re-embed; the re-embed embeds every chunk with it, none from the cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the copy's identity is kept there
    settings = Settings(database_url=database_url, home=tmp_path / ".rag")
    assert settings.embedding.space == OLD  # the installed model keeps its keys...
    assert settings.with_embedding(model_path=default_model_path()).embedding.space == OLD  # ...named by path too
    root = corpus_copy(*FILES)
    kb = KnowledgeBase(settings, provider=provider)
    documents = kb.ingest([root], root=root).count("new")
    kb.close()

    changed = settings.with_embedding(model_path=changed_model_copy(tmp_path / "tuned"))  # same embedding.model
    target = ChangedModel(provider, changed.embedding.model_path)
    tuned = KnowledgeBase(changed, provider=target)
    try:
        with pytest.raises(DimensionMismatchError, match=r"rag reembed --to all-MiniLM-L6-v2@[0-9a-f]{16}:384`"):
            tuned.ingest([root], root=root, force=True)
        space = changed.embedding.space
        assert target.space == space != OLD
        # the active space is still the installed model's, which serves its searches (no providers entry
        # needed): search goes on while the settings name the space a re-embed has yet to build
        assert tuned.search(QUERY).hits

        report = rm.reembed(changed, tuned.store, space, target=target)
        assert report.switched and report.chunks_from_cache == 0 and report.texts_embedded == report.chunks > 0
        again = tuned.ingest([root], root=root)
        assert again.count("unchanged") == documents and again.texts_embedded == again.chunks_from_cache == 0
        hit = tuned.search(QUERY, top_k=1).hits[0]
        with tuned.store.db.connection() as conn:
            served, text = conn.execute("SELECT v.embedding::text, c.embed_text FROM rag_chunk_vectors v JOIN rag_chunks c"
                                        " USING (chunk_id) WHERE v.space = %s AND c.chunk_id = %s",
                                        (space, hit.chunk_id)).fetchone()
        assert np.allclose(np.array(json.loads(served)), target.embed([text])[0], atol=1e-5)  # the new model's vector
    finally:
        tuned.close()
