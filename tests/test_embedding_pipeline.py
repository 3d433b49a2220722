"""The pipeline against a remote provider over real HTTP: cache hits make no requests, tokens and
cost are recorded per run and provider, failures and wrong dimensions write nothing, and a
configured space that differs from the stored one stops start-up with the command to run."""

from __future__ import annotations

import pytest

from openai_stub import OpenAIStub
from rag_lib.api import KnowledgeBase
from rag_lib.config import EmbeddingSettings, Settings
from rag_lib.embedding import get_provider
from rag_lib.errors import DimensionMismatchError, EmbeddingError
from rag_lib.ingest.stages import Preparer
from rag_lib.validate import validate_paths

MODEL, DIMS, PRICE = "stub-embed", 32, 0.5
FILES = ("tradegent/fixtures/sample_trade.yaml", "tradegent/fixtures/sample_earnings.yaml",
         "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml")


@pytest.fixture
def stub():
    with OpenAIStub() as server:
        yield server


def remote_settings(settings: Settings, stub: OpenAIStub, **embedding) -> Settings:
    cfg = dict(provider="openai_compatible", base_url=stub.base_url, model=MODEL, dimensions=DIMS,
               batch_size=16, backoff_base=0.01, max_retries=2, timeout=2.0, prices={MODEL: PRICE})
    cfg.update(embedding)
    merged = EmbeddingSettings.model_validate({**settings.embedding.model_dump(), **cfg})
    # these tests count the chunks' embedding requests: ticker profiles (entity linking) would add theirs
    search = settings.search.model_copy(update={"entity_linking": False})
    return settings.model_copy(update={"embedding": merged, "search": search})


def open_kb(s: Settings) -> KnowledgeBase:
    return KnowledgeBase(s, provider=get_provider(s))


def test_cache_hits_make_no_requests_and_usage_is_recorded(settings, stub, corpus_copy):
    root = corpus_copy(*FILES)
    s = remote_settings(settings, stub)
    with open_kb(s) as kb:
        report = kb.ingest([root])
        assert report.count("failed") == 0 and report.texts_embedded > 0
        first = kb.store.run_usage(kb.engine.embedder.run_id)
    assert stub.requests == first["requests"] > 0
    assert first["cache_misses"] == stub.inputs == report.texts_embedded
    (row,) = first["providers"]
    assert (row["provider"], row["model"], row["dimensions"]) == ("openai_compatible", MODEL, DIMS)
    assert row["tokens"] > 0 and not row["tokens_estimated"]
    assert row["cost_usd"] == pytest.approx(row["tokens"] * PRICE / 1e6)

    requests_before = stub.requests
    with open_kb(s) as kb:  # a second run over the same files: every vector from the cache
        report = kb.ingest([root], force=True)
        second = kb.store.run_usage(kb.engine.embedder.run_id)
        status = kb.status()
    assert stub.requests == requests_before  # counted server-side: no request at all
    assert report.chunks_from_cache == report.chunks > 0 and report.texts_embedded == 0
    assert second["cache_hit_rate"] == 1.0 and second["requests"] == 0 and second["cost_usd"] == 0
    usage = status["embedding_usage"]
    assert usage["by_provider"][0]["tokens"] == row["tokens"]
    assert [r["run_id"] for r in usage["recent_runs"]][:2] == [second["run_id"], first["run_id"]]


def test_a_failed_provider_writes_nothing_and_keeps_the_old_version(settings, stub, corpus_copy):
    root = corpus_copy(FILES[0])
    s = remote_settings(settings, stub)
    with open_kb(s) as kb:
        kb.ingest([root])
        before = kb.show(FILES[0])
        target = root / FILES[0]
        target.write_text(target.read_text() + "\nextra_notes: a brand new section about AMD guidance\n")
        stub.script(["500"] * 10)
        with pytest.raises(EmbeddingError, match="failed after 3 attempts"):
            kb.ingest([root])
        after = kb.show(FILES[0])
        assert after["content_hash"] == before["content_hash"]
        assert [c["chunk_id"] for c in after["chunks"]] == [c["chunk_id"] for c in before["chunks"]]
        run = kb.store.run_usage(kb.engine.embedder.run_id)
        assert run["providers"][0]["failures"] == 1 and run["retries"] == 2


def test_wrong_dimensions_are_never_written(settings, stub, corpus_copy):
    root = corpus_copy(FILES[0])
    s = remote_settings(settings, stub, max_retries=0)
    stub.script(["wrong_dims"])
    with open_kb(s) as kb:
        with pytest.raises(DimensionMismatchError, match="33-dimensional"):
            kb.ingest([root])
        assert kb.status()["documents"] == 0
        assert kb.store.cache_stats()["entries"] == 0


def test_fallback_within_the_space_during_ingest(settings, stub, corpus_copy):
    root = corpus_copy(FILES[0])
    with OpenAIStub() as backup:
        s = remote_settings(settings, stub, max_retries=0, fallback=["backup"], providers=[
            {"name": "backup", "provider": "openai_compatible", "base_url": backup.base_url,
             "model": MODEL, "dimensions": DIMS}])
        stub.script(["500"] * 100)
        with open_kb(s) as kb:
            report = kb.ingest([root])
            assert report.count("new") == 1 and backup.inputs == report.texts_embedded
            run = kb.store.run_usage(kb.engine.embedder.run_id)
    assert run["requests"] == stub.requests + backup.requests
    assert sum(p["failures"] for p in run["providers"]) >= 1


def test_a_changed_configured_space_is_a_fatal_start_up_error(settings, stub, corpus_copy):
    root = corpus_copy(FILES[0])
    with open_kb(remote_settings(settings, stub)) as kb:
        kb.ingest([root])
    with open_kb(remote_settings(settings, stub, dimensions=48)) as kb:
        with pytest.raises(DimensionMismatchError, match=r"run `rag reembed --to stub-embed:48`") as refused:
            kb.ingest([root])
    # the way back names the active space's own settings (its provider, not only model and size)
    way_back = f"configure the active space's provider: embedding.provider openai_compatible, model {MODEL}, " \
               f"dimensions {DIMS}"
    assert way_back in str(refused.value), refused.value


def test_a_new_embed_version_misses_the_cache_and_re_embeds(settings, stub, corpus_copy):
    root = corpus_copy(FILES[0])
    with open_kb(remote_settings(settings, stub)) as kb:
        first = kb.ingest([root])
    assert first.texts_embedded > 0
    inputs = stub.inputs
    bumped = remote_settings(settings, stub, embed_version="2")
    with open_kb(bumped) as kb:  # the fingerprint changed: the file is re-embedded, not served from cache
        report = kb.ingest([root])
    assert report.count("changed") == 1 and report.texts_embedded == report.chunks == first.chunks
    assert stub.inputs == inputs + first.chunks
    with open_kb(bumped) as kb:
        again = kb.ingest([root], force=True)
    assert again.chunks_from_cache == again.chunks and stub.inputs == inputs + first.chunks  # v2 is cached now


def stored_embed_texts(kb: KnowledgeBase) -> list[str]:
    with kb.store.db.connection() as conn:
        return [r[0] for r in conn.execute("SELECT embed_text FROM rag_chunks")]


def test_a_lower_input_limit_re_chunks_every_document_to_fit_it(settings, stub, corpus_copy):
    """embedding.max_input_tokens (and tokenizer_path) of a remote provider decide where chunks are
    cut, and so does the chunk stage's version now: lowering the limit re-chunks and republishes
    every document, each chunk within the new limit, the unchanged chunk texts' vectors from the
    cache. Before, the next ingest found every document current and kept chunks longer than the
    limit (which the provider silently truncates). A limit that cuts the same chunks (one above
    the tokenizer's own, which caps them) republishes nothing."""
    root = corpus_copy(*FILES)
    with open_kb(remote_settings(settings, stub)) as kb:
        assert kb.ingest([root]).count("new") == len(FILES)
        counts = kb.engine.provider.tokenizer().count_many(stored_embed_texts(kb))
    with open_kb(remote_settings(settings, stub, max_input_tokens=4000)) as kb:
        assert kb.ingest([root]).count("unchanged") == len(FILES)
    with open_kb(remote_settings(settings, stub, max_input_tokens=120)) as kb:
        limit = kb.engine.preparer.token_limit
        assert limit < max(counts)  # some chunks no longer fit
        inputs = stub.inputs
        again = kb.ingest([root])
        assert again.count("changed") == len(FILES) and again.count("failed") == 0
        assert max(kb.engine.provider.tokenizer().count_many(stored_embed_texts(kb))) <= limit
        assert again.chunks_from_cache > 0 and stub.inputs - inputs == again.texts_embedded < again.chunks
        assert kb.validate_database()["problems"] == 0


def test_validate_cuts_the_chunks_ingest_cuts_for_a_remote_provider(settings, stub, corpus_copy):
    """`rag validate PATH` chunked with the local model's tokenizer and limit whatever the provider, so
    under a remote provider's lower max_input_tokens it counted fewer, longer chunks than ingest cuts."""
    root = corpus_copy(*FILES)
    remote = remote_settings(settings, stub, max_input_tokens=120)
    checked = {f["path"]: f for f in validate_paths(remote, [root])["files"]}
    with open_kb(remote) as kb:
        kb.ingest([root])
        stored = {d["path"]: d["chunk_count"] for d in kb.list_documents()}
        limit = kb.engine.preparer.token_limit
    assert {p: f["chunks"] for p, f in checked.items()} == stored
    assert max(f["max_tokens"] for f in checked.values()) <= limit < Preparer.offline(settings).token_limit


def test_input_settings_the_local_model_does_not_read_leave_the_fingerprint_alone(settings):
    """The local model cuts chunks with its own tokenizer and limit: a remote provider's
    max_input_tokens or tokenizer_path set beside it republishes nothing."""
    unread = settings.with_embedding(max_input_tokens=100, tokenizer_path=str(settings.home / "elsewhere"))
    assert unread.pipeline_fingerprint() == settings.pipeline_fingerprint()


def test_cache_stats_and_prune(settings, stub, corpus_copy):
    root = corpus_copy(FILES[0])
    with open_kb(remote_settings(settings, stub)) as kb:
        kb.ingest([root])
        stats = kb.store.cache_stats()
        (model,) = stats["models"]
        assert model["entries"] == model["referenced"] == stats["entries"] > 0
        assert kb.store.cache_prune(older_than_days=0) == 0  # live chunks keep their entries
        kb.delete_document(FILES[0])
        assert kb.store.cache_stats()["models"][0]["referenced"] == 0
        assert kb.store.cache_prune(older_than_days=1) == 0  # too recent
        assert kb.store.cache_prune(older_than_days=0) == model["entries"]
        assert kb.store.cache_stats()["entries"] == 0


def test_a_failing_batch_is_retried_file_by_file_so_only_one_file_fails(settings, stub, corpus_copy):
    root = corpus_copy(*FILES)
    s = remote_settings(settings, stub, max_retries=0)
    stub.script(["400", "ok", "400"])  # the batch of all files, then each file alone: the second one fails
    with open_kb(s) as kb:
        report = kb.ingest([root])
        statuses = [o.status for o in report.outcomes]
        assert statuses.count("new") == 2 and statuses.count("failed") == 1
        failed = next(o for o in report.outcomes if o.status == "failed")
        assert failed.reason == "embedding_error" and failed.detail
        assert kb.status()["documents"] == 2
        assert any(f["partition"] == failed.path for f in kb.status()["failures"])
        stub.clear_script()
        again = kb.ingest([root])  # the next run picks the failed file up
        assert [o.status for o in again.outcomes].count("new") == 1


def test_texts_another_thread_is_embedding_wait_for_it_and_are_embedded_again_if_it_fails(settings):
    """Two threads embedding the same text (an ingest's overlapping rounds, two files sharing a
    section): the second waits for the first instead of spinning, and embeds the text itself when the
    first fails. It used to borrow again and again while the first ran: a RecursionError, and a file
    failed that had nothing wrong with it (seen under load in the file-by-file retry)."""
    import threading

    import numpy as np

    from rag_lib.ingest.stages import Embedder

    release = threading.Event()

    class FirstCallFailsLate:
        name = label = model = "fake"
        dimensions, space = 4, "fake:4"
        calls = 0

        def start_counted(self, texts):
            self.calls += 1
            first = self.calls == 1

            def pending():
                if first:
                    release.wait(10)
                    raise EmbeddingError("the first call fails after a while")
                return np.full((len(texts), 4), 0.5, dtype=np.float32), []
            return pending

    provider = FirstCallFailsLate()
    with open_kb(settings) as kb:
        embedder = Embedder(settings, kb.store, provider, model="fake", dimensions=4)
        texts = {"h-shared": "a section two files share"}
        first = embedder.start(texts)
        errors: list[BaseException] = []
        runner = threading.Thread(target=lambda: errors.append(
            pytest.raises(EmbeddingError, embedder.finish, first).value))
        runner.start()
        second = embedder.start(texts)
        assert set(second.borrowed) == {"h-shared"} and not second.missing  # taken from the running call
        got: list = []
        waiter = threading.Thread(target=lambda: got.append(embedder.finish(second)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and not got  # waiting for the other thread's call, not spinning
        release.set()
        waiter.join(10)
        runner.join(10)
        assert got and np.allclose(got[0].vectors["h-shared"], 0.5) and provider.calls == 2
        assert errors and "fails after a while" in str(errors[0])
