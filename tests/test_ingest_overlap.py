"""`rag ingest` at the encoder's pace: what an unchanged re-run reads from the stored stage outputs,
and the preparing, embedding and publishing of different files overlapping (each on its own thread,
at most a bounded number of rounds between them) with per-file failure isolation kept."""

from __future__ import annotations

import pytest

from rag_lib.ingest.state import BULKY

PFE = "tradegent/knowledge/analysis/stock/PFE_20250118T1400.yaml"
LEARNING = "tradegent/knowledge/learnings/biases/loss-aversion-pre-earnings.yaml"

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
    assert report.count("unchanged") == 2 and report.embedded == 0
    assert {stage for (_, _, stage), _ in read} >= set(BULKY)  # the stored outputs were read and decided
    assert [key for key, payload in read if key[2] in BULKY and "documents" in payload] == []
