"""Hostile files through `KnowledgeBase.ingest` (issue 15): each bomb is skipped with its reason in
bounded time, the good files beside it stay searchable, and nothing else in the database changes."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from bombs import GOOD_FILES, Case, cases
from rag_lib.config import ParseLimits, Settings
from rag_lib.documents import load_file
from rag_lib.models import Document, Skipped

CASES = cases()


def write_good(root: Path) -> None:
    for rel, text in GOOD_FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def db_state(url: str) -> dict[str, list[tuple]]:
    """Every document, section and chunk row (key fields), for a before/after comparison."""
    with psycopg.connect(url) as conn:
        return {
            "documents": conn.execute(
                "SELECT collection, path, doc_id, content_hash, chunk_count FROM rag_documents ORDER BY 1, 2").fetchall(),
            "sections": conn.execute("SELECT path, name, md5(text) FROM rag_sections ORDER BY 1, 2").fetchall(),
            "chunks": conn.execute("SELECT chunk_id, path, unit_id FROM rag_chunks ORDER BY 1").fetchall(),
            "vectors": conn.execute("SELECT count(*) FROM rag_chunk_vectors").fetchall(),
        }


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_file_is_skipped_and_nothing_else_changes(case: Case, kb, database_url, tmp_path: Path):
    root = tmp_path / "corpus"
    write_good(root)
    first = kb.ingest([root])
    assert first.count("new") == len(GOOD_FILES), first.to_dict()
    before = db_state(database_url)

    (root / case.name).write_bytes(case.data)
    report = kb.ingest([root])
    by_path = {o.path: o for o in report.outcomes}
    for rel in GOOD_FILES:
        assert by_path[rel].status == "unchanged", by_path[rel]
    assert report.count("failed") == 0, report.to_dict()
    after = db_state(database_url)
    if case.reason is None:
        assert by_path[case.name].status == "new", by_path[case.name]
        added = {r for r in after["documents"]} - set(before["documents"])
        assert [r[1] for r in added] == [case.name]
        assert set(before["documents"]) <= set(after["documents"])
    else:
        skipped = by_path[case.skipped_path or case.name]
        assert (skipped.status, skipped.reason) == ("skipped", case.reason), skipped
        assert skipped.detail
        if case.name.endswith(".jsonl"):  # its good records are documents of that file only
            new_paths = {r[1] for r in after["documents"]} - {r[1] for r in before["documents"]}
            assert all(p.startswith(f"{case.name}#") for p in new_paths), new_paths
            assert set(before["documents"]) <= set(after["documents"])
            assert set(before["chunks"]) <= set(after["chunks"])
        else:
            assert after == before
        listed = {(s["path"], s["reason"]) for s in kb.store.list_skipped()}
        assert (case.skipped_path or case.name, case.reason) in listed

    hits = kb.search("NVDA datacenter accelerator demand", top_k=3).hits
    assert hits and hits[0].path == "good.md"
    hits = kb.search("copper miners grid electrification", top_k=3).hits
    assert hits and hits[0].path == "notes/plain.yaml"


@pytest.mark.timeout(180)
def test_jsonl_records_cannot_escape_or_replace_another_files_document(kb, database_url, tmp_path: Path):
    root = tmp_path / "corpus"
    write_good(root)
    kb.ingest([root])
    good_before = [r for r in db_state(database_url)["sections"] if r[0] == "good.md"]
    upload = next(c for c in CASES if c.name == "upload.jsonl")
    (root / "upload.jsonl").write_bytes(upload.data)
    report = kb.ingest([root])
    outcomes = {(o.path, o.status, o.reason) for o in report.outcomes}
    assert ("upload.jsonl:1", "skipped", "invalid_id") in outcomes  # _id ../../etc/passwd
    assert ("upload.jsonl:4", "skipped", "duplicate_id") in outcomes  # second r1
    assert ("upload.jsonl#good.md", "new", None) in outcomes  # lives under its file, not at good.md
    assert ("upload.jsonl#r1", "new", None) in outcomes
    state = db_state(database_url)
    paths = {r[1] for r in state["documents"]}
    assert paths == {"good.md", "notes/plain.yaml", "upload.jsonl#good.md", "upload.jsonl#r1"}
    assert [r for r in state["sections"] if r[0] == "good.md"] == good_before
    # the evaluation convention: a JSONL document is scored by its record _id
    hit = kb.search("zebra migration", top_k=1).hits[0]
    assert (hit.path, hit.doc_id) == ("upload.jsonl#r1", "r1")
    assert kb.delete_document("r1") == ["upload.jsonl#r1"]


def test_files_named_like_jsonl_records_are_refused(tmp_path: Path):
    (tmp_path / "upload.jsonl#good.md").write_text("## A\ntext\n")
    [item] = load_file(tmp_path / "upload.jsonl#good.md", tmp_path, "c", 10**6)
    assert isinstance(item, Skipped) and item.reason == "reserved_path"


@pytest.mark.parametrize("exc", [RecursionError("deep"), MemoryError(), RuntimeError("boom"), KeyError("k")])
def test_any_loader_exception_is_that_files_skip(exc: BaseException, tmp_path: Path, monkeypatch):
    import rag_lib.documents as documents

    def explode(text, first_line=1):
        raise exc

    monkeypatch.setattr(documents, "parse_yaml_noting", explode)
    (tmp_path / "a.yaml").write_text("a: 1\n")
    [item] = load_file(tmp_path / "a.yaml", tmp_path, "c", 10**6)
    assert isinstance(item, Skipped) and item.path == "a.yaml"
    expected = {RecursionError: "too_deep", MemoryError: "too_large"}.get(type(exc), "load_error")
    assert item.reason == expected and item.detail


def test_invalid_timestamp_is_malformed_not_a_crash(tmp_path: Path):
    (tmp_path / "a.yaml").write_text("date: 2024-02-30\nthesis: x\n")  # safe_load raises ValueError
    [item] = load_file(tmp_path / "a.yaml", tmp_path, "c", 10**6)
    assert isinstance(item, Skipped) and item.reason == "malformed_yaml"


def test_limits_are_settings_with_position_and_setting_in_the_detail(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAG_LIMITS__MAX_DEPTH", "3")
    limits = Settings().limits
    assert limits.max_depth == 3 and ParseLimits().max_depth == 100
    (tmp_path / "a.yaml").write_text("title: x\nthesis:\n  a:\n    b:\n      c: [1]\n")
    [item] = load_file(tmp_path / "a.yaml", tmp_path, "c", 10**6, limits)
    assert isinstance(item, Skipped) and item.reason == "too_deep"
    assert "line 5, column 7" in item.detail and "RAG_LIMITS__MAX_DEPTH" in item.detail
    [doc] = load_file(tmp_path / "a.yaml", tmp_path, "c", 10**6)
    assert isinstance(doc, Document)


def test_aliases_within_the_limits_still_load(tmp_path: Path):
    (tmp_path / "a.yaml").write_text("base: &b {stop: 5%, size: 2%}\nplan_a: *b\nplan_b:\n  <<: *b\n  size: 1%\n")
    [doc] = load_file(tmp_path / "a.yaml", tmp_path, "c", 10**6)
    assert isinstance(doc, Document) and doc.body["plan_b"] == {"stop": "5%", "size": "1%"}


def test_section_and_value_limits(tmp_path: Path):
    limits = ParseLimits(max_section_chars=1000, max_value_chars=500)
    (tmp_path / "s.yaml").write_text("a: short\nb:\n" + "".join(f"  - item {i} {'x' * 40}\n" for i in range(40)))
    [item] = load_file(tmp_path / "s.yaml", tmp_path, "c", 10**6, limits)
    assert (item.reason, "section 'b' at line 2") == ("section_too_large", item.detail[:len("section 'b' at line 2")])
    (tmp_path / "v.yaml").write_text(f"a: {'y' * 600}\n")
    [item] = load_file(tmp_path / "v.yaml", tmp_path, "c", 10**6, limits)
    assert item.reason == "value_too_long"
    (tmp_path / "m.md").write_text("## One\nshort\n## Two\n" + "word " * 300 + "\n")
    [item] = load_file(tmp_path / "m.md", tmp_path, "c", 10**6, limits)
    assert item.reason == "section_too_large" and "'Two'" in item.detail


LEGACY = """
INSERT INTO rag_documents SELECT collection, doc_id, doc_id, doc_type, title, ticker, doc_date, version, format,
       content_hash, fingerprint, source_path, size_bytes, metadata, section_count, chunk_count, token_count,
       ingested_at FROM rag_documents WHERE format = 'jsonl';
UPDATE rag_sections s SET path = d.doc_id FROM rag_documents d
 WHERE d.format = 'jsonl' AND d.path <> d.doc_id AND s.collection = d.collection AND s.path = d.path;
UPDATE rag_chunks c SET path = d.doc_id, unit_id = d.doc_id || '#' || c.section FROM rag_documents d
 WHERE d.format = 'jsonl' AND d.path <> d.doc_id AND c.collection = d.collection AND c.path = d.path;
DELETE FROM rag_documents WHERE format = 'jsonl' AND path <> doc_id;
DELETE FROM rag_schema_migrations WHERE version = 9;
"""


@pytest.mark.timeout(180)
def test_migration_moves_records_stored_at_their_bare_id_under_their_file(kb, database_url, tmp_path: Path):
    from rag_lib.store import apply_migrations

    root = tmp_path / "corpus"
    root.mkdir()
    (root / "corpus.jsonl").write_text("\n".join(json.dumps({"_id": str(i), "text": text}) for i, text in enumerate(
        ["Aspirin reduces fever and inflammation.", "Statins lower LDL cholesterol."])) + "\n")
    kb.ingest([root])
    fresh = db_state(database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(LEGACY)  # the database as the previous release left it
        assert {r[0] for r in conn.execute("SELECT path FROM rag_documents")} == {"0", "1"}
        assert apply_migrations(conn) == ["009_jsonl_record_paths.sql"]
    assert db_state(database_url) == fresh  # same rows, chunk ids and vectors; nothing to re-embed
    again = kb.ingest([root])
    assert {o.status for o in again.outcomes} == {"unchanged"}, again.to_dict()
    assert kb.search("cholesterol", top_k=1).hits[0].unit_id == "corpus.jsonl#1#text"


def test_values_and_names_postgres_cannot_store_skip_their_file_not_the_ingest(kb, tmp_path: Path):
    """A NUL or an unpaired surrogate written as an escape (YAML "\\0", JSON "\\u0000" / "\\ud800") in a
    value, a key or front matter, and a file name that is not UTF-8: each used to stop the whole
    ingest (every later file with it, and every re-run) with an unexpected database error."""
    import os

    root = tmp_path / "desk"
    root.mkdir()
    write_good(root)
    (root / "nul_value.yaml").write_text('_meta:\n  type: research\nsummary: "before\\0after"\n')
    (root / "nul_key.yaml").write_text('_meta:\n  type: research\n"k\\0ey": value\n')
    (root / "front.md").write_text('---\ntitle: "bad\\0title"\n---\n# T\n\n## Body\n\nText.\n')
    (root / "recs.jsonl").write_text('{"_id": "r1", "text": "nul \\u0000 here"}\n'
                                     '{"_id": "r2", "text": "a fine record about rates"}\n'
                                     '{"_id": "r3", "text": "lone \\ud800"}\n')
    with open(os.path.join(os.fsencode(root), b"latin\xe9name.md"), "w") as fh:
        fh.write("# Note\n\n## Body\n\nA note in a file named in Latin-1.\n")
    report = kb.ingest([root])
    by_path = {o.path: o for o in report.outcomes}
    for path, where in (("nul_value.yaml", "summary holds a NUL"), ("nul_key.yaml", "key 'k\\0ey' holds a NUL"),
                        ("front.md", "title holds a NUL"), ("recs.jsonl#r1", "the text holds a NUL"),
                        ("recs.jsonl#r3", "the text holds an unpaired surrogate")):
        assert (by_path[path].status, by_path[path].reason) == ("skipped", "invalid_character"), by_path[path]
        assert by_path[path].detail.startswith(where), by_path[path].detail
    named = by_path["latin\ufffdname.md"]
    assert (named.status, named.reason) == ("skipped", "bad_file_name") and "rename it" in named.detail
    stored = {d["path"] for d in kb.list_documents()}
    assert set(GOOD_FILES) | {"recs.jsonl#r2"} <= stored and not stored & {"nul_value.yaml", "front.md"}
    assert kb.ingest([root]).count("failed") == 0  # and again: a re-run is not stuck on them
