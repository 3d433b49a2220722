"""Ingest end to end on a real database and the real model: round trip, bad input, incremental
re-runs, changed files, prune, force, collections, and atomic publishing."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import psycopg
import pytest

from rag_lib.errors import NotFoundError, ValidationError
from rag_lib.models import SourceFile

PFE = "tradegent/knowledge/analysis/stock/PFE_20250118T1400.yaml"
TRADE = "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml"
LEARNING = "tradegent/knowledge/learnings/biases/loss-aversion-pre-earnings.yaml"
NOTE = "tradegent-docs/.claude/rules/05-database-access.md"
TEMPLATE = "tradegent/templates/stock-analysis.yaml"
MALFORMED = "tradegent/templates/post-trade-review.yaml"

# The shared corpus's vectors come from the cache, except in the tests of what a first ingest embeds.
pytestmark = pytest.mark.warm_cache


def rows(kb, sql: str, *params):
    with kb.store.db.connection() as conn:
        return conn.execute(sql, params).fetchall()


@pytest.mark.warm_cache(False)  # the first ingest embeds every chunk
def test_round_trip_publishes_documents_sections_chunks_and_vectors(kb, corpus_copy):
    root = corpus_copy(PFE, TRADE, NOTE)
    report = kb.ingest([root])
    assert report.count("new") == 3 and report.count("failed") == 0
    assert report.texts_embedded == report.chunks > 0
    (docs,) = rows(kb, "SELECT count(*) FROM rag_documents")[0:1]
    assert docs[0] == 3
    chunks, vectors = rows(kb, "SELECT (SELECT count(*) FROM rag_chunks), (SELECT count(*) FROM rag_chunk_vectors)")[0]
    assert chunks == vectors == report.chunks
    dims = rows(kb, "SELECT DISTINCT vector_dims(embedding) FROM rag_chunk_vectors")
    assert dims == [(384,)]
    doc = kb.show("SA-PFE-2025-001")
    assert doc["path"] == PFE and doc["ticker"] == "PFE"
    section_names = {s["name"] for s in doc["sections"]}
    assert {"phase1_catalyst", "bear_case_analysis"} <= section_names  # empty stubs are listed too
    assert doc["chunks"] and all(c["token_count"] <= 254 for c in doc["chunks"])
    hit = kb.search("Pfizer dividend yield oversold", top_k=3).hits[0]
    assert hit.path == PFE and hit.unit_id.startswith(PFE + "#")


def test_bad_input_is_skipped_with_reason_and_never_stops_the_rest(kb, corpus_copy):
    root = corpus_copy(LEARNING, TEMPLATE, MALFORMED)
    (root / "empty.md").write_text("")
    (root / "binary.yaml").write_bytes(b"\x00\xff\x00")
    (root / "notes.txt").write_text("plain")
    report = kb.ingest([root])
    assert report.count("new") == 1
    reasons = {o.path: o.reason for o in report.outcomes if o.status == "skipped"}
    assert reasons == {
        TEMPLATE: "template", MALFORMED: "malformed_yaml", "empty.md": "empty",
        "binary.yaml": "binary", "notes.txt": "unknown_format",
    }
    skipped = {r["path"]: r for r in kb.status()["skipped"]}
    assert "line 153, column 3" in skipped[MALFORMED]["detail"]


def test_a_file_turning_bad_keeps_its_live_version(kb, corpus_copy):
    root = corpus_copy(LEARNING)
    kb.ingest([root])
    before = rows(kb, "SELECT chunk_id FROM rag_chunks ORDER BY 1")
    good = (root / LEARNING).read_bytes()
    (root / LEARNING).write_text("pattern: [unclosed\n  bad: : yaml")
    report = kb.ingest([root], prune=True)
    assert report.outcomes[0].status == "skipped" and report.pruned == []
    assert rows(kb, "SELECT chunk_id FROM rag_chunks ORDER BY 1") == before
    assert kb.status()["skipped"][0]["reason"] == "malformed_yaml"
    # put back as it was: nothing to publish (the live version is those bytes), and the skip is gone
    (root / LEARNING).write_bytes(good)
    assert kb.ingest([root]).outcomes[0].status == "unchanged"
    assert kb.status()["skipped"] == []


def test_a_jsonl_record_turning_bad_keeps_its_live_version_until_the_file_reads_cleanly(kb, tmp_path):
    """A record line broken by an edit can't say which `_id` it was, so no record absent from the new
    version is deleted while the file has unreadable lines; once it reads cleanly, removed records go."""
    root = tmp_path / "recs"
    root.mkdir()
    lines = {i: json.dumps({"_id": i, "text": f"Record {i}: the desk's view on {metal} supply."})
             for i, metal in (("a", "copper"), ("b", "nickel"), ("c", "zinc"))}
    (root / "r.jsonl").write_text("\n".join(lines.values()) + "\n")
    kb.ingest([root])
    live = {"r.jsonl#a", "r.jsonl#b", "r.jsonl#c"}
    assert {d["path"] for d in kb.list_documents()} == live

    # b's line loses a brace (its id can't be read); c changes
    changed_c = json.dumps({"_id": "c", "text": "Record c: zinc supply tightens."})
    (root / "r.jsonl").write_text("\n".join([lines["a"], lines["b"][:-1], changed_c]) + "\n")
    report = kb.ingest([root])
    assert {d["path"] for d in kb.list_documents()} == live  # b's live version kept
    assert any(o.reason == "malformed_json" for o in report.outcomes)
    assert "zinc supply tightens" in " ".join(h.text for h in kb.search("zinc supply tightens", mode="lexical").hits)

    # fixed by deleting b's line on purpose: now its record goes
    (root / "r.jsonl").write_text("\n".join([lines["a"], changed_c]) + "\n")
    kb.ingest([root])
    assert {d["path"] for d in kb.list_documents()} == {"r.jsonl#a", "r.jsonl#c"}


def test_the_reconcile_plan_holds_files_served_from_an_older_version(kb, settings, provider, corpus_copy):
    """A file whose newest edit is skipped is served from its last good version: the reconcile and
    re-embed plan names it `held` (a run would skip it again), also after a settings change makes
    the other files stale, where it used to pass over it in silence; one fixed on disk is stale (a
    run publishes it). A document over the chunk limit keeps its older version too: held."""
    from rag_lib.api import KnowledgeBase
    from rag_lib.corpus_scan import FileTarget
    from rag_lib.ingest.state import plan_reconcile

    root = corpus_copy(LEARNING, TRADE)
    (root / "note.md").write_text("# Note\n\n## One\n\nCopper.\n\n## Two\n\nTin.\n\n## Three\n\nZinc.\n")
    long = " ".join(f"Copper grade {n} held at the port." for n in range(300))
    (root / "recs.jsonl").write_text(json.dumps({"_id": "long", "text": long}) + "\n"
                                     + json.dumps({"_id": "short", "text": "Tin."}) + "\n")
    kb.ingest([root])
    (root / LEARNING).write_text("pattern: [unclosed\n  bad: : yaml")
    kb.ingest([root])
    targets = [FileTarget("default", root, rel, rel) for rel in (LEARNING, TRADE, "note.md")]
    fingerprint = kb.settings.pipeline_fingerprint()
    plan = plan_reconcile(kb.store, kb.settings, targets, fingerprint)
    assert plan.held == [LEARNING] and plan.keys == []
    plan = plan_reconcile(kb.store, kb.settings, targets, "another model")  # what a re-embed plans
    assert plan.held == [LEARNING] and plan.stale == [TRADE, "note.md"]

    strict = KnowledgeBase(settings.model_copy(update={"limits": type(settings.limits)(max_chunks_per_document=1)}),
                           provider=provider)
    try:
        report = strict.ingest([root / "note.md", root / "recs.jsonl"], root=root, force=True)
        assert [(o.path, o.status) for o in report.outcomes] == [
            ("note.md", "skipped"), ("recs.jsonl#long", "skipped"), ("recs.jsonl#short", "changed")]
        plan = plan_reconcile(strict.store, strict.settings, [*targets, FileTarget("default", root, "recs.jsonl", "r")],
                              strict.settings.pipeline_fingerprint())
        assert plan.held == [LEARNING, "note.md", "r"]
        held = {h["path"]: h for h in strict.status()["held"]}
        assert held["note.md"]["documents"] == 1 and held["note.md"]["reason"] == "too_many_chunks"
        assert held["recs.jsonl"]["examples"] == ["recs.jsonl#long"] and held["recs.jsonl"]["target"] == "recs.jsonl#long"
    finally:
        strict.close()
    (root / LEARNING).write_text("pattern: fixed on disk, not ingested yet\n")
    plan = plan_reconcile(kb.store, kb.settings, targets, fingerprint)
    # note.md was skipped under a lower chunk limit than kb's: a run under kb's settings publishes it
    assert plan.stale == [LEARNING, "note.md"] and plan.held == []


def _loads(monkeypatch) -> list[str]:
    """The files the ingests from now on read and parse (a spy on the real loader)."""
    from rag_lib.ingest.stages import Preparer

    read, load = [], Preparer.load

    def spied(self, source: SourceFile):
        read.append(source.rel)
        return load(self, source)

    monkeypatch.setattr(Preparer, "load", spied)
    return read


def _ingest_under_limits(settings, provider, root: Path, **limits):
    """Ingest `root` with these `limits.*` (a knowledge base of its own, closed after)."""
    from rag_lib.api import KnowledgeBase

    kb = KnowledgeBase(settings.model_copy(update={"limits": type(settings.limits)(**limits)}), provider=provider)
    try:
        return kb.ingest([root])
    finally:
        kb.close()


def test_raising_the_chunk_limit_brings_back_what_was_skipped_over_it(kb, settings, provider, tmp_path, monkeypatch):
    """The skip says "split it or raise the setting": raised, a plain ingest publishes the documents
    skipped over it (a whole file, one JSONL record) from their stored sections, reading no file
    again; a file skipped for another reason is not read again either."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "note.md").write_text("# Note\n\n## One\n\nCopper.\n\n## Two\n\nTin.\n\n## Three\n\nZinc cathode premiums.\n")
    long = " ".join(f"Nickel grade {n} held at the port." for n in range(60))
    (root / "recs.jsonl").write_text(json.dumps({"_id": "long", "text": long}) + "\n"
                                     + json.dumps({"_id": "short", "text": "Tin."}) + "\n")
    (root / "broken.yaml").write_text("pattern: [unclosed\n  bad: : yaml")
    first = _ingest_under_limits(settings, provider, root, max_chunks_per_document=1)
    assert {o.path: o.reason for o in first.outcomes if o.status == "skipped"} == {
        "note.md": "too_many_chunks", "recs.jsonl#long": "too_many_chunks", "broken.yaml": "malformed_yaml"}

    loads = _loads(monkeypatch)
    again = kb.ingest([root])  # the default limit, no --force
    assert {o.path: o.status for o in again.outcomes} == {
        "note.md": "new", "recs.jsonl#long": "new", "recs.jsonl#short": "unchanged", "broken.yaml": "skipped"}
    assert loads == []  # the chunks were cut again from the stored sections; broken.yaml is as it was
    assert kb.search("zinc cathode premiums", top_k=3).hits[0].path == "note.md"
    assert kb.search("nickel grade held at the port", top_k=3).hits[0].path == "recs.jsonl#long"
    assert [s["path"] for s in kb.status()["skipped"]] == ["broken.yaml"]
    assert kb.ingest([root]).count("unchanged") == 3 and loads == []


def test_raising_a_parse_limit_reads_again_only_what_was_skipped_over_it(kb, settings, provider, tmp_path,
                                                                         monkeypatch):
    """A file or JSONL record skipped over a parse limit is read again once that limit is raised
    (a record's file used to fail with a KeyError: its later stages took the old reading as
    current); a file over another limit, or skipped for another reason, is not read again."""
    root = tmp_path / "docs"
    root.mkdir()
    (root / "deep.yaml").write_text("outer:\n  middle:\n    inner:\n      leaf: Tungsten supply notes.\n")
    (root / "r.jsonl").write_text(json.dumps({"_id": "long", "text": "Copper grade held at the port of Antofagasta."})
                                  + "\n" + json.dumps({"_id": "short", "text": "Tin."}) + "\n")
    (root / "broken.yaml").write_text("pattern: [unclosed\n  bad: : yaml")

    first = _ingest_under_limits(settings, provider, root, max_depth=2, max_value_chars=20)
    assert {o.path: o.reason for o in first.outcomes if o.status == "skipped"} == {
        "deep.yaml": "too_deep", "r.jsonl:1": "value_too_long", "broken.yaml": "malformed_yaml"}

    loads = _loads(monkeypatch)
    report = _ingest_under_limits(settings, provider, root, max_depth=2)  # max_value_chars back to its default
    assert {o.path: o.status for o in report.outcomes} == {
        "deep.yaml": "skipped", "r.jsonl#long": "new", "r.jsonl#short": "unchanged", "broken.yaml": "skipped"}
    assert loads == ["r.jsonl"]
    assert kb.search("copper grade Antofagasta", top_k=3).hits[0].path == "r.jsonl#long"

    loads.clear()
    report = kb.ingest([root])  # every limit at its default
    assert {o.path: o.status for o in report.outcomes}["deep.yaml"] == "new" and loads == ["deep.yaml"]
    assert [s["path"] for s in kb.status()["skipped"]] == ["broken.yaml"]


def test_skips_stored_before_outputs_recorded_their_limits_are_judged_again(kb, settings, provider, tmp_path,
                                                                           monkeypatch):
    """A knowledge base ingested before stage outputs recorded the limits they were judged under:
    the next ingest reads again the files skipped over a limit (only those), and the documents
    that fit today's limits are published."""
    from rag_lib.api import KnowledgeBase

    root = tmp_path / "docs"
    root.mkdir()
    (root / "note.md").write_text("# Note\n\n## One\n\nCopper.\n\n## Two\n\nTin.\n")
    (root / "r.jsonl").write_text(json.dumps({"_id": "long", "text": "Copper grade held at the port of Antofagasta."})
                                  + "\n" + json.dumps({"_id": "short", "text": "Tin."}) + "\n")
    (root / "plain.md").write_text("# Plain\n\nZinc.\n")
    strict = KnowledgeBase(settings.model_copy(update={"limits": type(settings.limits)(
        max_chunks_per_document=1, max_value_chars=20)}), provider=provider)
    try:
        strict.ingest([root])
    finally:
        strict.close()
    with kb.store.db.connection() as conn:  # as stored before: no `judged`
        conn.execute("UPDATE rag_stage_outputs SET payload = payload - 'judged'")

    loads = _loads(monkeypatch)
    report = kb.ingest([root])
    assert {o.path: o.status for o in report.outcomes} == {
        "note.md": "new", "r.jsonl#long": "new", "r.jsonl#short": "unchanged", "plain.md": "unchanged"}
    assert loads == ["r.jsonl"]  # its loading skipped a record; note.md's chunking skipped it
    assert kb.ingest([root]).count("unchanged") == 4 and loads == ["r.jsonl"]


@pytest.mark.warm_cache(False)  # the first ingest embeds every chunk
def test_unchanged_files_are_not_re_embedded(kb, corpus_copy, provider):
    root = corpus_copy(TRADE, LEARNING)
    kb.ingest([root])
    calls = provider.calls
    report = kb.ingest([root])
    assert report.count("unchanged") == 2 and report.texts_embedded == 0
    assert provider.calls == calls, "re-ingest of unchanged files called the model"
    forced = kb.ingest([root], force=True)
    assert forced.count("changed") == 2
    assert forced.texts_embedded == 0 and forced.chunks_from_cache == forced.chunks  # --force re-publishes from the cache
    assert provider.calls == calls


def test_changed_file_replaces_its_rows(kb, corpus_copy):
    root = corpus_copy(LEARNING)
    kb.ingest([root])
    old_ids = {r[0] for r in rows(kb, "SELECT chunk_id FROM rag_chunks")}
    path = root / LEARNING
    path.write_text(path.read_text() + "\nextra_section:\n  lesson: Never average down into an earnings gap.\n")
    report = kb.ingest([root])
    assert report.outcomes[0].status == "changed"
    new_rows = rows(kb, "SELECT chunk_id, section, text FROM rag_chunks")
    assert any(r[1] == "extra_section" for r in new_rows)
    assert len(rows(kb, "SELECT 1 FROM rag_documents")) == 1
    # unchanged sections keep their ids; nothing of the old version is left beside the new one
    assert old_ids & {r[0] for r in new_rows}
    assert rows(kb, "SELECT count(*) FROM rag_chunk_vectors")[0][0] == len(new_rows)


def test_prune_removes_documents_whose_files_are_gone(kb, corpus_copy):
    root = corpus_copy(TRADE, LEARNING)
    kb.ingest([root])
    (root / TRADE).unlink()
    report = kb.ingest([root])  # without --prune nothing is deleted, but the report names it
    assert report.pruned == [] and len(kb.list_documents()) == 2
    assert report.stale == [TRADE] and report.to_dict()["stale"] == [TRADE]
    report = kb.ingest([root], prune=True)
    assert report.pruned == [TRADE]
    assert [d["path"] for d in kb.list_documents()] == [LEARNING]
    assert rows(kb, "SELECT count(*) FROM rag_chunks WHERE path = %s", TRADE)[0][0] == 0


def test_prune_deletes_only_within_what_was_named(kb, corpus_copy, tmp_path):
    root = corpus_copy(TRADE, LEARNING)
    kb.ingest([root])
    # one file named with --prune: the folder's other documents stay (before, every one was deleted)
    report = kb.ingest([root / LEARNING], root=root, prune=True)
    assert report.pruned == [] and len(kb.list_documents()) == 2
    # a subfolder prunes under itself only
    (root / TRADE).unlink()
    assert kb.ingest([root / "tradegent/knowledge/learnings"], root=root, prune=True).pruned == []
    assert len(kb.list_documents()) == 2
    assert kb.ingest([root / "tradegent/knowledge/trades"], root=root, prune=True).pruned == [TRADE]
    # another folder's documents in the same collection are not this folder's to prune ...
    other = tmp_path / "other"
    other.mkdir()
    (other / "desk.md").write_text("# Desk\n\n## Rates\n\nThe desk watches rates.\n")
    kb.ingest([other])
    assert kb.ingest([root], prune=True).pruned == []
    assert {d["path"] for d in kb.list_documents()} == {LEARNING, "desk.md"}
    # ... until its file is gone
    (other / "desk.md").unlink()
    assert kb.ingest([root], prune=True).pruned == ["desk.md"]
    with pytest.raises(ValidationError, match="--root .*not an existing directory"):
        kb.ingest([root / LEARNING], root=root / LEARNING)


def test_prune_keeps_documents_whose_files_it_cannot_see_but_are_there(kb, tmp_path, monkeypatch):
    """A folder the walk cannot read (permissions, a stale mount) and a file written after the walk
    listed its folder (another ingest, an editor) are not gone: prune used to delete their documents."""
    import os

    from rag_lib import corpus_files, documents

    root = tmp_path / "desk"
    (root / "sub").mkdir(parents=True)
    for rel in ("a.md", "sub/b.md", "c.md"):
        (root / rel).write_text(f"# {rel}\n\n## Body\n\nThe desk's note {rel} on rates.\n")
    kb.ingest([root])
    sub, late = str(root / "sub"), str(root / "c.md")
    real_scandir, real_lstat, real_walk = os.scandir, os.lstat, corpus_files.walk

    def scandir(path="."):  # `sub` unreadable, as chmod 000 makes it for anyone but root
        if os.fspath(path) == sub:
            raise PermissionError(13, "Permission denied", sub)
        return real_scandir(path)

    def lstat(path, *args, **kwargs):
        if os.fspath(path).startswith(sub + os.sep):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_lstat(path, *args, **kwargs)

    def walk(folder):  # c.md written after this ingest listed the folder
        return [e for e in real_walk(folder) if os.path.join(os.fspath(folder), e.rel) != late]

    monkeypatch.setattr(corpus_files.os, "scandir", scandir)
    monkeypatch.setattr(corpus_files.os, "lstat", lstat)
    monkeypatch.setattr(documents, "walk", walk)  # what lists an ingest's files
    report = kb.ingest([root], prune=True)
    assert report.pruned == []
    assert {d["path"] for d in kb.list_documents()} == {"a.md", "sub/b.md", "c.md"}
    (root / "c.md").unlink()  # really gone: pruned as before
    assert kb.ingest([root], prune=True).pruned == ["c.md"]


def _notes(root: Path, *rels: str) -> None:
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"# {rel}\n\n## Body\n\nThe desk's note {rel} on rates.\n")


def test_an_ingest_names_stale_and_prunes_only_documents_under_what_it_names(kb, tmp_path):
    """`rag ingest PATH` reads only the documents under PATH (an index range, not every path of the
    collection): gone files beside it or in folders whose names start with its name are neither
    named stale nor pruned, nor another root's file at a path under it; those under it are, a gone
    JSONL file's records too."""
    root, other = tmp_path / "desk", tmp_path / "other"
    _notes(root, "notes/a.md", "notes/b.md", "notes2/c.md", "notes-x/d.md", "notes.md")
    (root / "notes/r.jsonl").write_text('{"_id": "x", "text": "Copper."}\n{"_id": "y", "text": "Tin."}\n')
    _notes(other, "notes/e.md")
    kb.ingest([root])
    kb.ingest([other])
    for rel in ("notes/b.md", "notes/r.jsonl", "notes2/c.md", "notes-x/d.md", "notes.md"):
        (root / rel).unlink()
    under_notes = ["notes/b.md", "notes/r.jsonl#x", "notes/r.jsonl#y"]
    assert kb.ingest([root / "notes/a.md"]).stale == []  # one file: not its folder's others
    assert kb.ingest([root / "notes"]).stale == under_notes
    assert kb.ingest([root / "notes"], prune=True).pruned == under_notes
    assert {d["path"] for d in kb.list_documents()} == {"notes/a.md", "notes2/c.md", "notes-x/d.md", "notes.md",
                                                         "notes/e.md"}
    assert kb.ingest([root], prune=True).pruned == ["notes-x/d.md", "notes.md", "notes2/c.md"]


def test_wildcards_and_names_postgres_cannot_store_in_a_folder_name_are_taken_literally(kb, tmp_path):
    """`%`, `_` and `\\` in a folder's name are its characters, not LIKE's wildcards or escape: an
    ingest of `50%_off` reads the documents under it and not those of `50x_off` or `50%_offer`; a
    folder whose name is not UTF-8 (its files refused) holds no document, and its ingest says so."""
    import os

    root = tmp_path / "desk"
    _notes(root, "50%_off/a.md", "50%_off/b.md", "50x_off/c.md", "50%_offer/d.md", "back\\slash/e.md")
    os.mkdir(os.fsencode(root) + b"/latin-\xe9")  # a name in Latin-1, not UTF-8
    (root / os.fsdecode(b"latin-\xe9") / "f.md").write_text("# F\n\nThe desk's note.\n")
    kb.ingest([root])
    for rel in ("50%_off/b.md", "50x_off/c.md", "50%_offer/d.md", "back\\slash/e.md"):
        (root / rel).unlink()
    sources = kb.store.document_sources_under("default", ["50%_off"], [])
    assert sorted(sources) == ["50%_off/a.md", "50%_off/b.md"]
    assert list(kb.store.document_sources_under("default", [], ["50%_off/a.md"])) == ["50%_off/a.md"]
    assert kb.ingest([root / "50%_off"]).stale == ["50%_off/b.md"]
    assert kb.ingest([root / "back\\slash"], prune=True).pruned == ["back\\slash/e.md"]
    report = kb.ingest([root / os.fsdecode(b"latin-\xe9")], prune=True)
    assert [o.reason for o in report.outcomes] == ["bad_file_name"] and report.pruned == []
    assert kb.ingest([root], prune=True).pruned == ["50%_off/b.md", "50%_offer/d.md", "50x_off/c.md"]


def test_two_roots_with_one_path_in_one_collection_do_not_overwrite_each_other(kb, tmp_path):
    first, second = tmp_path / "desk_a", tmp_path / "desk_b"
    for folder, metal in ((first, "lithium"), (second, "copper")):
        folder.mkdir()
        (folder / "notes.md").write_text(f"# Notes\n\n## Metals\n\nThe desk watches {metal} supply.\n")
    kb.ingest([first], collection="desk")
    (outcome,) = kb.ingest([second], collection="desk").outcomes
    assert (outcome.status, outcome.reason) == ("failed", "document_conflict")
    assert str(first / "notes.md") in outcome.detail and "another collection" in outcome.detail
    assert kb.show("notes.md", "desk")["source_path"] == str(first / "notes.md")  # the first stays
    # the failure is the desk collection's: another collection's status does not list it
    assert [f["collection"] for f in kb.status("desk")["failures"]] == ["desk"]
    assert kb.status("other")["failures"] == [] and len(kb.status()["failures"]) == 1
    assert kb.ingest([first], collection="desk").outcomes[0].status == "unchanged"
    # a file that moved (the old one is gone) takes the document over
    (first / "notes.md").unlink()
    assert kb.ingest([second], collection="desk").outcomes[0].status == "changed"
    assert kb.show("notes.md", "desk")["source_path"] == str(second / "notes.md")
    assert "copper" in kb.search("metals supply", collection="desk").hits[0].text



def test_a_jsonl_file_named_in_capitals_keeps_its_records_sources(kb, tmp_path):
    """The documents' sources were read for a JSONL file's records only when its name ended in
    lower-case `.jsonl`: a moved `.JSONL` file kept its old source, and another root's `.JSONL` file
    with the same path replaced its records without a word."""
    first, second = tmp_path / "desk_a", tmp_path / "desk_b"
    for folder, metal in ((first, "lithium"), (second, "copper")):
        folder.mkdir()
        (folder / "notes.JSONL").write_text(json.dumps({"_id": "n1", "text": f"The desk watches {metal} supply."}) + "\n")
    kb.ingest([first], collection="desk")
    moved = first.rename(tmp_path / "desk_a2")
    assert kb.ingest([moved], collection="desk").outcomes[0].status == "unchanged"
    assert kb.show("notes.JSONL#n1", "desk")["source_path"] == str(moved / "notes.JSONL")
    (outcome,) = kb.ingest([second], collection="desk").outcomes
    assert (outcome.status, outcome.reason) == ("failed", "document_conflict")
    assert str(moved / "notes.JSONL") in outcome.detail
    assert "lithium" in kb.search("metals supply", collection="desk").hits[0].text  # the first stays


def test_a_source_that_cannot_be_checked_is_not_taken_over(kb, tmp_path):
    """A document's source under a folder that cannot be looked into (here a link loop: stat fails
    with ELOOP, as an unreadable folder fails with EACCES) is not gone: another root's file with the
    same path used to rewrite the source and take the document over."""
    first, second = tmp_path / "desk_a", tmp_path / "desk_b"
    for folder, metal in ((first, "lithium"), (second, "copper")):
        folder.mkdir()
        (folder / "notes.md").write_text(f"# Notes\n\n## Metals\n\nThe desk watches {metal} supply.\n")
    kb.ingest([first], collection="desk")
    first.rename(tmp_path / "desk_a.away")
    first.symlink_to(first.name)  # desk_a → desk_a: desk_a/notes.md cannot be checked
    (outcome,) = kb.ingest([second], collection="desk").outcomes
    assert (outcome.status, outcome.reason) == ("failed", "document_conflict")
    assert kb.show("notes.md", "desk")["source_path"] == str(first / "notes.md")
    assert "lithium" in kb.search("metals supply", collection="desk").hits[0].text

def test_one_path_from_two_folders_moved_folders_and_missing_roots(kb, tmp_path):
    def note(folder, name, text):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(f"# {text}\n\n## Body\n\nThe desk watches {text}.\n")

    note(tmp_path / "s1", "same.md", "spruce")
    note(tmp_path / "s2", "same.md", "sequoia")
    # one ingest naming two folders that hold the same path: refused before anything is written
    with pytest.raises(ValidationError, match="would both be document 'same.md' of collection 'ss'"):
        kb.ingest([tmp_path / "s1", tmp_path / "s2"], collection="ss")
    assert kb.list_documents("ss") == []
    kb.ingest(tmp_path / "s1", collection="ss")  # one path, not a list of its characters
    # an explicit --root holding (or inside) a registered root would add its files again, longer paths
    with pytest.raises(ValidationError, match="holds"):
        kb.ingest([tmp_path / "s1" / "same.md"], collection="ss", root=tmp_path)

    # a folder that moved: its unchanged files are read from the new place, so another folder's file
    # with the same path is a conflict, not a takeover of a document whose "source is gone"
    note(tmp_path / "a" / "notes", "x.md", "apples")
    note(tmp_path / "b" / "notes", "x.md", "bananas")
    kb.ingest([tmp_path / "a"], collection="kb")
    (tmp_path / "a").rename(tmp_path / "a2")
    assert kb.ingest([tmp_path / "a2"], collection="kb").outcomes[0].status == "unchanged"
    assert kb.show("notes/x.md", "kb")["source_path"] == str(tmp_path / "a2" / "notes" / "x.md")
    assert kb.ingest([tmp_path / "b"], collection="kb").outcomes[0].reason == "document_conflict"

    # pruning one root leaves a root whose folder is missing (an unmounted disk) alone
    note(tmp_path / "p", "p.md", "peaches")
    note(tmp_path / "q", "q.md", "quinces")
    kb.ingest([tmp_path / "p"], collection="pq")
    kb.ingest([tmp_path / "q"], collection="pq")
    shutil.rmtree(tmp_path / "q")
    assert kb.ingest([tmp_path / "p"], collection="pq", prune=True).pruned == []
    assert {d["path"] for d in kb.list_documents("pq")} == {"p.md", "q.md"}


def test_collections_are_isolated(kb, corpus_copy, tmp_path):
    root = corpus_copy(LEARNING)
    other = tmp_path / "other"
    shutil.copytree(root, other)
    kb.ingest([root], collection="alpha")
    kb.ingest([other], collection="beta")
    assert {r["collection"] for r in kb.list_documents()} == {"alpha", "beta"}
    assert len(kb.search("loss aversion", collection="alpha").hits) > 0
    assert {h.collection for h in kb.search("loss aversion", collection="beta").hits} == {"beta"}
    # looked up in the wrong collection: the one that has it is named
    with pytest.raises(NotFoundError, match="it is in collection 'alpha' and 'beta': name that collection"):
        kb.show(LEARNING, collection="gamma")
    kb.delete_document(LEARNING, collection="alpha")
    assert kb.status("alpha")["documents"] == 0 and kb.status("beta")["documents"] == 1
    with pytest.raises(NotFoundError):
        kb.delete_document(LEARNING, collection="alpha")


def test_delete_by_id_removes_every_row(kb, corpus_copy):
    kb.ingest([corpus_copy(TRADE)])
    assert kb.delete_document("TRD-2025-001") == [TRADE]
    counts = rows(kb, "SELECT (SELECT count(*) FROM rag_documents), (SELECT count(*) FROM rag_sections),"
                      " (SELECT count(*) FROM rag_chunks), (SELECT count(*) FROM rag_chunk_vectors)")[0]
    assert counts == (0, 0, 0, 0)


def test_failure_in_the_middle_of_publishing_leaves_the_old_version(kb, corpus_copy, database_url):
    root = corpus_copy(LEARNING)
    kb.ingest([root])
    before = rows(kb, "SELECT chunk_id, text FROM rag_chunks ORDER BY 1")
    doc_before = rows(kb, "SELECT content_hash FROM rag_documents")
    # A real database error raised after the document and chunk rows were written.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("""CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS
                        $$ BEGIN RAISE EXCEPTION 'injected failure'; END $$""")
        conn.execute("CREATE TRIGGER boom BEFORE INSERT ON rag_chunk_vectors FOR EACH ROW EXECUTE FUNCTION boom()")
    path = root / LEARNING
    path.write_text(path.read_text().replace("loss", "LOSS"))
    report = kb.ingest([root])
    assert report.outcomes[0].status == "failed"
    assert "injected failure" in report.outcomes[0].detail
    assert rows(kb, "SELECT chunk_id, text FROM rag_chunks ORDER BY 1") == before
    assert rows(kb, "SELECT content_hash FROM rag_documents") == doc_before
    assert rows(kb, "SELECT count(*) FROM rag_chunk_vectors")[0][0] == len(before)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("DROP TRIGGER boom ON rag_chunk_vectors")
    assert kb.ingest([root]).outcomes[0].status == "changed"  # the next run repairs it


def test_wrong_dimension_vectors_are_never_written(kb, corpus_copy):
    import numpy as np

    from rag_lib.errors import DimensionMismatchError

    root = corpus_copy(LEARNING)
    prepared = kb.engine.preparer.prepare(kb.engine.preparer.load(SourceFile("default", root, LEARNING)).documents[0])
    with pytest.raises(DimensionMismatchError):
        kb.engine.publisher.publish(prepared, np.ones((len(prepared.chunks), 128), dtype=np.float32))
    with pytest.raises(DimensionMismatchError):
        kb.engine.publisher.publish(prepared, np.full((len(prepared.chunks), 384), np.nan, dtype=np.float32))
    assert rows(kb, "SELECT count(*) FROM rag_chunks")[0][0] == 0


def test_configured_space_must_match_the_stored_one(kb, corpus_copy, settings):
    from rag_lib.errors import DimensionMismatchError

    kb.ingest([corpus_copy(LEARNING)])
    with pytest.raises(DimensionMismatchError, match="re-embed"):
        kb.store.ensure_space("text-embedding-3-large:1536", "text-embedding-3-large", 1536, "openai")


def test_migrations_apply_once(empty_database_url, provider, tmp_path):
    from rag_lib.api import KnowledgeBase
    from rag_lib.config import Settings
    from rag_lib.store import apply_migrations, migration_files

    with KnowledgeBase(Settings(database_url=empty_database_url, home=tmp_path / ".rag"), provider=provider) as base:
        base.store  # opening the store migrates the fresh database (no schema yet: not the template's copy)
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            assert apply_migrations(conn) == []
            recorded = conn.execute("SELECT count(*) FROM rag_schema_migrations").fetchone()[0]
    assert recorded == len(migration_files())


def test_ingest_builds_the_hnsw_index_once(kb, corpus_copy):
    from rag_lib.store.vectors import index_name

    kb.ingest([corpus_copy(LEARNING)])
    name = index_name(kb.provider.space)
    found = rows(kb, "SELECT indexdef FROM pg_indexes WHERE indexname = %s", name)
    assert found and "hnsw" in found[0][0] and "vector_cosine_ops" in found[0][0]
    builds = rows(kb, "SELECT count(*) FROM rag_index_builds")[0][0]
    kb.ingest([corpus_copy(TRADE)])
    assert rows(kb, "SELECT count(*) FROM rag_index_builds")[0][0] == builds  # reused, not rebuilt


def test_progress_reports_every_file_against_the_total(kb, corpus_copy):
    root = corpus_copy(PFE, TRADE, TEMPLATE)
    seen = []
    kb.ingest([root], progress=lambda name, done, total: seen.append((Path(name).name, done, total)))
    assert [(done, total) for _, done, total in seen] == [(1, 3), (2, 3), (3, 3)]
    assert {name for name, _, _ in seen} == {Path(PFE).name, Path(TRADE).name, Path(TEMPLATE).name}


def test_drop_hnsw_index_before_a_bulk_load(kb, corpus_copy):
    from rag_lib.store.vectors import index_name

    kb.ingest([corpus_copy(LEARNING)])
    space = kb.provider.space
    assert kb.store.drop_hnsw_index(space) is True
    assert rows(kb, "SELECT count(*) FROM pg_indexes WHERE indexname = %s", index_name(space))[0][0] == 0
    assert kb.store.drop_hnsw_index(space) is False  # nothing left to drop
    kb.ingest([corpus_copy(TRADE)])  # the next ingest builds it again
    assert rows(kb, "SELECT count(*) FROM pg_indexes WHERE indexname = %s", index_name(space))[0][0] == 1


def write_deep_yaml(path: Path, depth: int = 5000) -> None:
    """A YAML document nested `depth` mappings deep (hostile input; generated, never committed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("_meta:\n  type: learning\n  id: deep\nsummary: " + "{a: " * depth + "1" + "}" * depth + "\n")


def test_a_file_that_crashes_its_stage_fails_alone(kb, corpus_copy):
    """One file nested 5,000 levels deep among good files: the good ones are ingested and
    searchable, the bad one is reported (failed or skipped) with a reason, the run completes."""
    root = corpus_copy(PFE, LEARNING)
    write_deep_yaml(root / "tradegent/knowledge/learnings/aaa-deep.yaml")
    report = kb.ingest([root])
    by_path = {o.path: o for o in report.outcomes}
    deep = by_path["tradegent/knowledge/learnings/aaa-deep.yaml"]
    assert deep.status in ("failed", "skipped") and deep.reason and deep.detail
    assert by_path[PFE].status == "new" and by_path[LEARNING].status == "new"
    hits = kb.search("loss aversion before earnings", top_k=5).hits
    assert any(h.path == LEARNING for h in hits)
    assert not rows(kb, "SELECT 1 FROM rag_documents WHERE path LIKE '%%aaa-deep%%'")


def test_a_publish_that_deadlocks_with_another_ingest_is_run_again(kb, tmp_path, monkeypatch):
    """Two ingests of one collection write shared graph nodes and lexeme counts: PostgreSQL may end
    one transaction as a deadlock. It rolled back whole, so it is run again (once seen as a failed
    file, with a multi-line PostgreSQL message); a conflict that persists names the file in one line."""
    import psycopg.errors

    root = tmp_path / "desk"
    root.mkdir()
    (root / "a.md").write_text("# A\n\n## Body\n\nThe desk's note on rates.\n")
    store = type(kb.store)
    real, calls = store._publish, []

    def flaky(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise psycopg.errors.DeadlockDetected("deadlock detected\nDETAIL:  Process 1 waits for ShareLock")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(store, "_publish", flaky)
    report = kb.ingest([root])
    assert [o.status for o in report.outcomes] == ["new"] and len(calls) == 2
    assert {d["path"] for d in kb.list_documents()} == {"a.md"}

    def always(self, *args, **kwargs):
        raise psycopg.errors.DeadlockDetected("deadlock detected\nDETAIL:  Process 1 waits for ShareLock")

    monkeypatch.setattr(store, "_publish", always)
    (root / "a.md").write_text("# A\n\n## Body\n\nThe desk's note on rates, revised.\n")
    (outcome,) = kb.ingest([root]).outcomes
    assert outcome.status == "failed" and "publishing failed 3 times on a conflict with another ingest" in outcome.detail
    assert "\n" not in outcome.detail and "ShareLock" not in outcome.detail
    assert kb.search("rates", mode="lexical").hits[0].text.rstrip().endswith("note on rates.")  # the previous version stays live


def _desk_notes(tmp_path, count: int, topic: str):
    """A folder of `count` small markdown notes on `topic`."""
    root = tmp_path / "desk"
    root.mkdir()
    for n in range(count):
        (root / f"n{n}.md").write_text(f"# N{n}\n\n## Body\n\nThe desk's note {n} on {topic}.\n")
    return root


def _database_gone_at(monkeypatch, store_type, method: str) -> list[int]:
    """Make the store's `method` fail as a stopped server does (the pool times out); returns the list
    each call appends to."""
    from psycopg_pool import PoolTimeout

    calls: list[int] = []

    def gone(self, *args, **kwargs):
        calls.append(1)
        raise PoolTimeout("couldn't get a connection after 30.00 sec")

    monkeypatch.setattr(store_type, method, gone)
    return calls


def test_the_database_going_away_ends_the_ingest_at_once_with_one_clear_error(kb, tmp_path, monkeypatch):
    """Not file after file waiting out the pool's timeout (5 minutes and 583 lines of tracebacks)."""
    from rag_lib.errors import DatabaseError

    root = _desk_notes(tmp_path, 3, "rates")
    calls = _database_gone_at(monkeypatch, type(kb.store), "_publish")
    with pytest.raises(DatabaseError, match=r"the database stopped answering during the ingest \(.*\); what was "
                                            r"published stays; start it \(rag db start\)"):
        kb.ingest([root])
    assert len(calls) == 1  # the first file's failure ends it; the others do not wait their turn


def test_the_database_going_away_while_embedding_ends_the_ingest_without_retrying_file_by_file(kb, tmp_path,
                                                                                              monkeypatch):
    """The embedding stage retried a batch file by file on any error: with the database stopped mid-ingest
    each file waited out the pool's 30 s timeout (7.5 minutes and 14 tracebacks for 42 files)."""
    from rag_lib.errors import DatabaseError

    root = _desk_notes(tmp_path, 6, "rates and credit")
    calls = _database_gone_at(monkeypatch, type(kb.store), "cache_get")
    with pytest.raises(DatabaseError, match=r"the database stopped answering during the ingest \(PoolTimeout\)"):
        kb.ingest([root])
    assert len(calls) <= 2, calls  # one batch tried (and one started ahead), not then each file again
    assert kb.list_documents() == []  # nothing half published


def test_a_loader_that_reads_more_metadata_republishes_unchanged_files(settings, provider, tmp_path, monkeypatch):
    """The loader's version was not in the fingerprint: after an upgrade that reads a note's
    front-matter ticker, an unchanged note stayed published without it, so --ticker still missed it."""
    from rag_lib import versions
    from rag_lib.api import KnowledgeBase

    (tmp_path / "semis.md").write_text("---\nticker: NVDA\n---\n# Semis\n\n## Risks\n\nExport bans.\n")
    monkeypatch.setattr(versions, "LOADER_VERSION", "3")
    with KnowledgeBase(settings, provider=provider) as kb:
        assert kb.ingest([tmp_path]).count("new") == 1
        with kb.store.db.connection() as conn:  # as the loader before version 4 published it
            conn.execute("UPDATE rag_chunks SET ticker = NULL")
            conn.execute("UPDATE rag_documents SET ticker = NULL")
    monkeypatch.setattr(versions, "LOADER_VERSION", "4")
    with KnowledgeBase(settings, provider=provider) as kb:
        report = kb.ingest([tmp_path])
        assert report.count("changed") == 1 and report.texts_embedded == 0  # vectors from the cache
        assert {h.path for h in kb.search("export bans", ticker="NVDA").hits} == {"semis.md"}
        assert kb.ingest([tmp_path]).count("unchanged") == 1


def test_a_section_written_twice_is_its_own_unit_and_is_found(kb, tmp_path):
    """A note pasted twice (same heading, same text) failed whole with a raw UniqueViolation on the
    staged vectors; a heading used twice, a `## _intro` heading or YAML keys 1 and '1' failed on the
    sections' key. Each section is now its own unit ('Desk note (2)', its heading kept as its title),
    the same text embedded once; YAML list items and JSONL records with one text ingest as before."""
    root = tmp_path / "desk"
    (root / "notes").mkdir(parents=True)
    pasted = "## Desk note\n\nSized down before the open.\n\n"
    (root / "notes" / "desk.md").write_text("# Desk\n\n" + pasted * 2)
    (root / "notes" / "rates.md").write_text("# Rates\n\n## Note\n\nBund yields fell after the auction.\n\n"
                                             "## Note\n\nGilts followed in the afternoon.\n\n"
                                             "## _intro\n\nWritten after the close.\n")
    level = "Copper held its breakout level."
    (root / "levels.yaml").write_text(f"_meta:\n  type: watchlist\n1: {level}\n'1': {level}\n"
                                      f"levels:\n  - {level}\n  - {level}\n")
    record = "Desk cut gross exposure into the print."
    (root / "records.jsonl").write_text("".join(json.dumps({"_id": i, "text": record}) + "\n" for i in ("r1", "r2", "r1")))

    report = kb.ingest([root])
    assert {o.path: o.status for o in report.outcomes} == {
        "notes/desk.md": "new", "notes/rates.md": "new", "levels.yaml": "new", "records.jsonl#r1": "new",
        "records.jsonl#r2": "new", "records.jsonl:3": "skipped"}, [(o.path, o.detail) for o in report.outcomes]

    desk = kb.show("notes/desk.md")
    assert [(s["name"], s["title"]) for s in desk["sections"]] == [
        ("_intro", "_intro"), ("Desk note", "Desk note"), ("Desk note (2)", "Desk note")]
    assert [s["name"] for s in kb.show("notes/rates.md")["sections"]] == ["_intro", "Note", "Note (2)", "_intro (2)"]
    assert [s["name"] for s in kb.show("levels.yaml")["sections"]] == ["_meta", "1", "1 (2)", "levels"]
    hashes = [h for (h,) in rows(kb, "SELECT content_hash FROM rag_chunks WHERE path = 'notes/desk.md' ORDER BY ordinal")]
    assert len(hashes) == 3 and hashes[1] == hashes[2]  # one text, one cache entry

    hits = kb.search("sized down before the open", top_k=2).hits
    assert {h.unit_id for h in hits} == {"notes/desk.md#Desk note", "notes/desk.md#Desk note (2)"}
    assert kb.search("gilts in the afternoon", top_k=1).hits[0].unit_id == "notes/rates.md#Note (2)"
    assert {h.path for h in kb.search("cut gross exposure", top_k=2).hits} == {"records.jsonl#r1", "records.jsonl#r2"}
    assert kb.search("copper breakout level", top_k=1).hits[0].path == "levels.yaml"
    again = kb.ingest([root])  # and it stays current
    assert again.count("unchanged") == 5 and again.count("new") + again.count("changed") + again.count("failed") == 0


def test_a_database_error_staging_one_file_fails_that_file_in_one_line(rag, database_url, tmp_path, caplog):
    """A database error while staging vectors (here a trigger refusing one file's rows) failed every
    file staged with it and printed PostgreSQL's DETAIL and CONTEXT lines and a traceback; now the
    other files are staged and published, and the file fails with one line that names it."""
    root = tmp_path / "desk"
    root.mkdir()
    (root / "good.md").write_text("# Good\n\n## Body\n\nThe desk rolled its copper hedge.\n")
    (root / "bad.md").write_text("# Bad\n\n## Body\n\nThe desk trimmed its lithium position.\n")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("""CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
                          IF NEW.path = 'bad.md' THEN RAISE EXCEPTION 'quota exceeded' USING DETAIL = 'table is full';
                          END IF; RETURN NEW; END $$""")
        conn.execute("CREATE TRIGGER refuse_bad BEFORE INSERT ON rag_stage_vectors FOR EACH ROW EXECUTE FUNCTION refuse_bad()")

    code, out, err = rag("ingest", str(root), "--json")
    assert code == 1 and "Traceback" not in err, err
    outcomes = {o["path"]: o for o in json.loads(out)["files"]}
    bad = outcomes["bad.md"]
    assert "\n" not in bad["detail"] and "table is full" not in bad["detail"]
    assert "bad.md: staging the vectors failed (RaiseException: quota exceeded)" in bad["detail"]
    assert (bad["status"], bad["reason"]) == ("failed", "database_error")
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert logged and not [r for r in logged if r.exc_info or "\n" in r.getMessage()]  # no traceback, no DETAIL
    assert outcomes["good.md"]["status"] == "new"
    code, out, _ = rag("search", "copper hedge", "--json")
    assert code == 0 and {h["path"] for h in json.loads(out)["results"]} == {"good.md"}
