"""`rag ingest` at the encoder's pace: what an unchanged re-run reads from the stored stage outputs,
and the preparing, embedding and publishing of different files overlapping (each on its own thread,
at most a bounded number of rounds between them) with per-file failure isolation kept."""

from __future__ import annotations

import threading

import numpy as np
import psycopg
import pytest

from rag_lib.ingest import run as run_module
from rag_lib.ingest.overlap import overlapped
from rag_lib.ingest.state import BULKY, StageRunner
from test_ingest import LEARNING, MALFORMED, NOTE, PFE, TRADE, rows, write_deep_yaml

RESEARCH = "tradegent/fixtures/sample_research.yaml"
EARNINGS = "tradegent/fixtures/sample_earnings.yaml"

pytestmark = pytest.mark.warm_cache


def test_an_unchanged_rerun_reads_no_section_or_chunk_texts(kb, corpus_copy, monkeypatch):
    """Deciding that a file is current needs its stored outputs' status, hash and version, not the
    texts of its sections and chunks (reading and decoding them doubled the re-run's time)."""
    root = corpus_copy(PFE, LEARNING)
    kb.ingest([root])
    read = []
    load = kb.store.load_stage_outputs

    def recorded(*args, **kwargs):
        out = load(*args, **kwargs)
        read.extend(out.items())
        return out

    monkeypatch.setattr(kb.store, "load_stage_outputs", recorded)
    report = kb.ingest([root])
    assert report.count("unchanged") == 2 and report.texts_embedded == 0
    assert {stage for (_, _, stage), _ in read} >= set(BULKY)  # the stored outputs were read and decided
    assert [key for key, payload in read if key[2] in BULKY and "documents" in payload] == []


# ---- the pipeline of steps ------------------------------------------------------------------


def test_overlapped_keeps_order_and_holds_at_most_in_flight_items():
    """Items come out in their order, each after every step; no more than `in_flight` items are
    ever between their first step and their last, and the source is read no further ahead."""
    lock = threading.Lock()
    pulled, started, finished, seen = [], [], [], []

    def source():
        for i in range(12):
            pulled.append(i)
            yield i

    def first(i):
        with lock:
            started.append(i)
            seen.append(len(started) - len(finished))

    def last(i):
        with lock:
            finished.append(i)

    out = []
    for item in overlapped(source(), [first, lambda i: None, last], in_flight=3):
        assert len(pulled) - len(out) <= 3
        out.append(item)
    assert out == list(range(12)) and finished == list(range(12))
    assert max(seen) <= 3


def test_overlapped_raises_a_steps_error_after_the_items_before_it_are_done():
    """A step failing on item 3 (an outage): items 0-2 went through every step, the error is raised
    to the caller, and no step starts on an item after 3 once it failed."""
    lock = threading.Lock()
    done: list[int] = []
    embedded: list[int] = []

    def embed(i):
        if i == 3:
            raise RuntimeError("provider down")
        with lock:
            embedded.append(i)

    def publish(i):
        with lock:
            done.append(i)

    out = []
    with pytest.raises(RuntimeError, match="provider down"):
        for item in overlapped(range(10), [lambda i: None, embed, publish], in_flight=2):
            out.append(item)
    assert out == [0, 1, 2] and done == [0, 1, 2]
    assert max(embedded) <= 4  # at most the next item had started before the failure was known


# ---- rag ingest ------------------------------------------------------------------------------


def test_rounds_overlap_and_a_bad_file_in_a_round_fails_alone(kb, corpus_copy, database_url, monkeypatch):
    """Rounds of two files: while one round is embedded the next is prepared (the embedding of the
    first round waits until a later round has started preparing: run one after the other, it
    would wait in vain). A malformed file, a file whose publishing fails in the database and one
    nested too deep sit among good ones: each gets its own outcome with its reason, every good file
    lands, and each document was published in one transaction (the failed one left nothing)."""
    monkeypatch.setattr(run_module, "FILES_PER_ROUND", 2)
    good = [LEARNING, PFE, RESEARCH, TRADE, EARNINGS]
    root = corpus_copy(*good, MALFORMED)
    write_deep_yaml(root / "tradegent/knowledge/learnings/aaa-deep.yaml")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"""CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS
                         $$ BEGIN IF NEW.path = '{RESEARCH}' THEN RAISE EXCEPTION 'injected failure'; END IF;
                         RETURN NEW; END $$""")
        conn.execute("CREATE TRIGGER boom BEFORE INSERT ON rag_chunks FOR EACH ROW EXECUTE FUNCTION boom()")

    later_round_prepared = threading.Event()
    overlapped_seen = []
    prepare, embed = StageRunner.raw_documents, StageRunner.embeddings
    first_round: list[str] = []

    def raw_documents(self, targets):
        if not first_round:
            first_round.extend(t.key for t in targets)
        else:
            later_round_prepared.set()
        return prepare(self, targets)

    def embeddings(self, targets):
        if [t.key for t in targets] == first_round:
            overlapped_seen.append(later_round_prepared.wait(timeout=120))
        return embed(self, targets)

    monkeypatch.setattr(StageRunner, "raw_documents", raw_documents)
    monkeypatch.setattr(StageRunner, "embeddings", embeddings)
    report = kb.ingest([root])

    assert overlapped_seen == [True]
    by_path = {o.path: o for o in report.outcomes}
    assert by_path[MALFORMED].status == "skipped" and by_path[MALFORMED].reason == "malformed_yaml"
    assert by_path[RESEARCH].status == "failed" and "injected failure" in by_path[RESEARCH].detail
    deep = by_path["tradegent/knowledge/learnings/aaa-deep.yaml"]
    assert deep.status in ("failed", "skipped") and deep.reason and deep.detail
    landed = {p for p in good if p != RESEARCH}
    assert {p for p, o in by_path.items() if o.status == "new"} == landed
    assert {r[0] for r in rows(kb, "SELECT path FROM rag_documents")} == landed
    assert rows(kb, "SELECT count(*) FROM rag_chunks WHERE path = %s", RESEARCH)[0][0] == 0
    chunks = rows(kb, "SELECT count(*), (SELECT count(*) FROM rag_chunk_vectors) FROM rag_chunks")[0]
    assert chunks[0] == chunks[1] == report.chunks > 0


def test_progress_counts_every_file_in_order_across_overlapping_rounds(kb, corpus_copy, monkeypatch):
    monkeypatch.setattr(run_module, "FILES_PER_ROUND", 1)
    root = corpus_copy(LEARNING, PFE, TRADE)
    seen = []
    kb.ingest([root], progress=lambda path, done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]


def test_the_encoder_starts_after_two_files_and_the_last_round_is_small(kb, corpus_copy, monkeypatch):
    """The first round's preparing and the last round's publishing overlap no encoding: both are two
    files, however many are ingested, and the rounds between grow (up to FILES_PER_ROUND), so each
    file is embedded once, in order."""
    monkeypatch.setattr(run_module, "FILES_PER_ROUND", 4)
    files = [LEARNING, PFE, RESEARCH, TRADE, EARNINGS, NOTE, "tradegent/fixtures/sample_trade.yaml"]
    root = corpus_copy(*files)
    embedded: list[list[str]] = []
    embed = StageRunner.embeddings

    def embeddings(self, targets):
        embedded.append([t.key for t in targets])
        return embed(self, targets)

    monkeypatch.setattr(StageRunner, "embeddings", embeddings)
    report = kb.ingest([root])
    assert [len(r) for r in embedded] == [2, 3, 2]
    assert sorted(k for r in embedded for k in r) == sorted(files)
    assert {o.path for o in report.outcomes if o.status == "new"} == set(files)


@pytest.mark.warm_cache(False)
def test_the_next_round_is_queued_for_the_encoder_while_the_current_one_encodes(kb, provider, corpus_copy, monkeypatch):
    """The encoder is fed across rounds: a round's texts go to the provider (`start_counted`: the
    local model queues their mini-batches) as soon as the round is chunked, not when the round
    before it has been embedded: here the first round's vectors are waited for only once the
    second round's texts were handed over (one after the other, that wait would never end).
    Every text goes to the model once, a text two rounds share included (the later round takes it
    from the earlier one in flight or from the cache), and every chunk lands with its vector."""
    monkeypatch.setattr(run_module, "FILES_PER_ROUND", 2)
    root = corpus_copy(LEARNING, PFE, RESEARCH, TRADE, EARNINGS)
    twin = root / "tradegent/knowledge/learnings/zz-twin.yaml"  # the same content in the last round
    twin.write_bytes((root / LEARNING).read_bytes())
    sent: list[list[str]] = []
    second_round_started = threading.Event()
    waited: list[bool] = []
    start = provider.start_counted

    def start_counted(texts):
        sent.append(list(texts))
        finish = start(texts)
        number = len(sent)
        if number == 2:
            second_round_started.set()

        def result():
            if number == 1:
                waited.append(second_round_started.wait(timeout=120))
            return finish()

        return result

    monkeypatch.setattr(provider, "start_counted", start_counted)
    report = kb.ingest([root])

    assert waited == [True] and len(sent) >= 3
    texts = [t for call in sent for t in call]
    stored = rows(kb, "SELECT count(DISTINCT content_hash), count(*), (SELECT count(*) FROM rag_chunk_vectors)"
                      " FROM rag_chunks")[0]
    assert len(texts) == len(set(texts)) == report.texts_embedded == stored[0]
    assert stored[1] == stored[2] == report.chunks > stored[0]  # the twin's chunks are the learning's
    assert report.count("new") == 6 and report.count("failed") == 0


@pytest.mark.warm_cache(False)
def test_a_file_failing_in_a_round_queued_ahead_fails_alone(kb, provider, corpus_copy, monkeypatch):
    """A file whose texts the provider refuses, in a round queued for the encoder ahead of time:
    its group is retried file by file, it fails with its reason, and the other files of its round
    and of the other rounds land, each document in one transaction."""
    monkeypatch.setattr(run_module, "FILES_PER_ROUND", 2)
    root = corpus_copy(LEARNING, PFE, RESEARCH, TRADE, EARNINGS)
    poisoned = (root / TRADE).read_text()
    (root / TRADE).write_text(poisoned.replace("NVDA", "NVDA POISON", 1))
    start = provider.start_counted

    def start_counted(texts):
        finish = start(texts)

        def result():
            vectors, usage = finish()
            if any("POISON" in t for t in texts):
                raise ValueError("the provider refused a text")
            return vectors, usage

        return result

    monkeypatch.setattr(provider, "start_counted", start_counted)
    report = kb.ingest([root])

    by_path = {o.path: o for o in report.outcomes}
    assert by_path[TRADE].status == "failed" and "refused" in by_path[TRADE].detail
    landed = {LEARNING, PFE, RESEARCH, EARNINGS}
    assert {p for p, o in by_path.items() if o.status == "new"} == landed
    assert {r[0] for r in rows(kb, "SELECT path FROM rag_documents")} == landed
    chunks = rows(kb, "SELECT count(*), (SELECT count(*) FROM rag_chunk_vectors) FROM rag_chunks")[0]
    assert chunks[0] == chunks[1] == report.chunks > 0


@pytest.mark.warm_cache(False)
def test_a_text_two_started_calls_share_goes_to_the_model_once(kb, provider, monkeypatch):
    """Two rounds started before either is finished, sharing a text: the later call takes it from
    the earlier one (a cache hit, as it would have been once the earlier call was cached), and gets
    it embedded again itself if the earlier call failed."""
    embedder = kb.engine.embedder
    sent: list[list[str]] = []
    start = provider.start_counted
    refuse = ["no"]

    def start_counted(texts):
        sent.append(list(texts))
        finish = start(texts)
        if refuse[0] == "first" and len(sent) == 1:
            return lambda: (_ for _ in ()).throw(ValueError("the provider refused the batch"))
        return finish

    monkeypatch.setattr(provider, "start_counted", start_counted)
    shared = "the stop held while the position was trimmed into strength"
    first = embedder.start({"a1": "NVDA guidance was raised after the print", "shared": shared})
    second = embedder.start({"shared": shared, "b1": "AMD gross margin came in below expectations"})
    got = [embedder.finish(first), embedder.finish(second)]
    assert sent == [["NVDA guidance was raised after the print", shared],
                    ["AMD gross margin came in below expectations"]]
    assert np.abs(got[0].vectors["shared"] - got[1].vectors["shared"]).max() == 0
    assert np.abs(got[1].vectors["shared"] - provider.embed([shared])[0]).max() < 1e-5
    usage = kb.store.run_usage(embedder.run_id)
    assert (usage["cache_hits"], usage["cache_misses"]) == (1, 3)

    sent.clear()
    refuse[0] = "first"
    other = "a trailing stop at the 20-day low"
    first = embedder.start({"a2": "PFE pipeline readout slipped a quarter", "other": other})
    second = embedder.start({"other": other, "b2": "the hedge cost 40 basis points"})
    with pytest.raises(ValueError, match="refused"):
        embedder.finish(first)
    again = embedder.finish(second)
    assert sent == [["PFE pipeline readout slipped a quarter", other], ["the hedge cost 40 basis points"], [other]]
    assert np.abs(again.vectors["other"] - provider.embed([other])[0]).max() < 1e-5
