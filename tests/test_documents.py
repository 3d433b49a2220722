"""Loading files: type detection, metadata, hashing, and every kind of bad input."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from rag_lib.documents import load_file, normalise_type
from rag_lib.models import Document, Skipped

from conftest import SHARED_CORPUS

LIMIT = 5 * 1024 * 1024


def load_one(path: Path, root: Path, limit: int = LIMIT):
    items = load_file(path, root, "default", limit)
    assert len(items) == 1
    return items[0]


def test_real_spellings_normalise_to_one_type():
    assert normalise_type("stock_analysis") == "stock-analysis"
    assert normalise_type("Stock-Analysis") == "stock-analysis"
    assert normalise_type("ticker") == "ticker-profile"
    assert normalise_type("research-analysis") == "research-analysis"
    assert normalise_type("research") == "research-analysis"


def test_metadata_comes_from_meta_not_the_file_name():
    rel = "tradegent/knowledge/analysis/stock/PFE_20250118T1400.yaml"
    doc = load_one(SHARED_CORPUS / rel, SHARED_CORPUS)
    assert isinstance(doc, Document)
    assert doc.path == rel
    assert doc.doc_id == "SA-PFE-2025-001"
    assert doc.doc_type == "stock-analysis"
    assert doc.ticker == "PFE"
    assert doc.doc_date == dt.date(2025, 1, 18)
    assert doc.version == "2.3"
    assert len(doc.content_hash) == 64


def test_underscore_type_and_missing_meta_fall_back_sensibly():
    googl = load_one(SHARED_CORPUS / "tradegent/knowledge/analysis/stock/GOOGL_20260220T2115.yaml", SHARED_CORPUS)
    assert googl.doc_type == "stock-analysis"
    no_meta = load_one(SHARED_CORPUS / "tradegent/knowledge/reference/FUTURE-IMPROVEMENTS.yaml", SHARED_CORPUS)
    assert no_meta.doc_type == "reference"  # from the folder, as there is no _meta
    fixture = load_one(SHARED_CORPUS / "tradegent/fixtures/sample_research.yaml", SHARED_CORPUS)
    assert fixture.doc_type == "research-analysis"  # `_meta.doc_type: research-analysis`


def test_metadata_that_cannot_be_used_is_a_warning_not_a_silent_loss(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("_meta:\n  type: stock-analysis\nticker: 123\nanalysis_date: not-a-date\nthesis: up\n")
    doc = load_one(bad, tmp_path)
    assert doc.ticker is None and doc.doc_date is None
    assert doc.warnings == [
        "ticker 123 is not a ticker symbol (letters first, up to 10 of A-Z, 0-9, '.', '-'); the document has "
        "no ticker, so ticker filters and boosts skip it",
        "analysis_date 'not-a-date' is not a date (YYYY-MM-DD); the document has no date, so date filters and "
        "the date boost skip it"]
    # a later field gives the date: the warning says which one it came from
    fallback = tmp_path / "fallback.yaml"
    fallback.write_text("_meta:\n  created: '2025-03-04T10:00:00Z'\nanalysis_date: 2025-02\nthesis: up\n")
    doc = load_one(fallback, tmp_path)
    assert doc.doc_date == dt.date(2025, 3, 4)
    assert doc.warnings == ["analysis_date '2025-02' is not a date (YYYY-MM-DD); the document's date is "
                            "_meta.created's, 2025-03-04"]
    note = tmp_path / "note.md"
    note.write_text("---\ndate: last tuesday\n---\n# Note\n\nText.\n")
    assert load_one(note, tmp_path).warnings[0].startswith("date 'last tuesday' is not a date")
    # front matter that is not YAML (or not a mapping) loses every field: said, with where
    note.write_text('---\ntype: stock-analysis\ndate: 2026-01-05\ntitle: "unterminated\n---\n# Note\n\nText.\n')
    doc = load_one(note, tmp_path)
    assert doc.doc_type == "note" and doc.doc_date is None
    assert doc.warnings == ["front matter is not valid YAML at line 4, column 21 (found unexpected end of stream); "
                            "its type, id, date and title were not read; fix the front matter"]
    note.write_text("---\n- a\n- b\n---\n# Note\n\nText.\n")
    assert load_one(note, tmp_path).warnings[0].startswith("front matter is not a mapping of fields (it is a list)")
    # the shared corpus's markdown gives none
    assert not [d.warnings for f in sorted(SHARED_CORPUS.rglob("*.md"))
                for d in load_file(f, SHARED_CORPUS, "default", LIMIT) if isinstance(d, Document) and d.warnings]
    # the shared corpus's real documents give none
    real = [d for f in sorted(SHARED_CORPUS.rglob("*.yaml"))[:80] for d in load_file(f, SHARED_CORPUS, "default", LIMIT)
            if isinstance(d, Document)]
    assert real and not [d.warnings for d in real if d.warnings]


def test_a_document_rewritten_in_place_is_dated_by_its_last_update(tmp_path: Path):
    """A strategy first written in June 2024 and rewritten in January 2025 says what it says as of January
    2025: a date filter or boost for that month finds it (it was dated by `created`). A file named for a
    moment records that moment: a trade is dated by its entry, not by the exit that last updated it."""
    strategy = load_one(SHARED_CORPUS / "tradegent/knowledge/strategies/earnings-momentum.yaml", SHARED_CORPUS)
    assert strategy.doc_date == dt.date(2025, 1, 28)  # _meta.updated; created 2024-06-15
    profile = load_one(SHARED_CORPUS / "tradegent/knowledge/analysis/ticker-profiles/2025/01/NVDA_20250110T1000.yaml",
                       SHARED_CORPUS)
    assert profile.doc_date == dt.date(2025, 1, 10)  # its file name's; created 2024-03-01, updated 2025-01-25
    trade = load_one(SHARED_CORPUS / "tradegent/knowledge/trades/2025/01/NVDA_20250115T1000.yaml", SHARED_CORPUS)
    assert trade.doc_date == dt.date(2025, 1, 15)  # entry; updated 2025-01-28 at the exit
    # a date of its own still comes first, and `created` dates a document never updated
    (tmp_path / "a.yaml").write_text("_meta:\n  created: '2025-03-04'\n  updated: '2025-04-01'\n"
                                     "analysis_date: '2025-03-03'\nthesis: up\n")
    (tmp_path / "b.yaml").write_text("_meta:\n  created: '2025-03-04T10:00:00Z'\nthesis: up\n")
    assert load_one(tmp_path / "a.yaml", tmp_path).doc_date == dt.date(2025, 3, 3)
    assert load_one(tmp_path / "b.yaml", tmp_path).doc_date == dt.date(2025, 3, 4)


def test_a_key_given_twice_is_a_warning_not_a_silent_loss(tmp_path: Path):
    """YAML keeps the last of two equal keys without a word: the first value's text was lost."""
    (tmp_path / "dup.yaml").write_text("_meta:\n  type: stock-analysis\nticker: NVDA\nthesis:\n"
                                       "  bull: strong datacenter demand\n  bull: weak gaming\nticker: AMD\n")
    (tmp_path / "dup.md").write_text("---\ntitle: One\ntitle: Two\n---\n# X\n\n## Body\n\nText.\n")
    (doc,) = load_file(tmp_path / "dup.yaml", tmp_path, "c", 10**6)
    assert isinstance(doc, Document) and doc.ticker == "AMD"
    assert doc.warnings[:2] == ["key 'ticker' appears twice (lines 3 and 7); only the last value was kept: rename or merge them",
                                "key 'bull' appears twice (lines 5 and 6); only the last value was kept: rename or merge them"]
    (note,) = load_file(tmp_path / "dup.md", tmp_path, "c", 10**6)
    assert note.title == "Two" and note.warnings == [
        "front matter: key 'title' appears twice (lines 2 and 3); only the last value was kept: rename or merge them"]


def test_a_notes_front_matter_ticker_and_the_date_in_its_file_name_are_its_metadata(tmp_path: Path):
    """`ticker: NVDA` in a note's front matter was ignored (no --ticker filter found the note), and a
    note named for its day (`2026-02-03-daily.md`) had no date for --from/--to."""
    (tmp_path / "semis.md").write_text("---\ntitle: Semis\nticker: nvda\ndate: 2026-01-10\n---\n# Semis\n\nText.\n")
    note = load_one(tmp_path / "semis.md", tmp_path)
    assert (note.ticker, note.doc_date, note.warnings) == ("NVDA", dt.date(2026, 1, 10), [])
    (tmp_path / "2026-02-03-daily.md").write_text("# Daily journal\n\n## Trades\n\nShorted TSLA.\n")
    (tmp_path / "Fed-minutes-2026-01-28.md").write_text("# Fed minutes\n\n## Summary\n\nBalanced.\n")
    assert load_one(tmp_path / "2026-02-03-daily.md", tmp_path).doc_date == dt.date(2026, 2, 3)
    assert load_one(tmp_path / "Fed-minutes-2026-01-28.md", tmp_path).doc_date == dt.date(2026, 1, 28)
    # a date field that is not one says which date the document has instead
    (tmp_path / "2026-02-04-daily.md").write_text("---\nticker: 42\ndate: tuesday\n---\n# Daily\n\nText.\n")
    odd = load_one(tmp_path / "2026-02-04-daily.md", tmp_path)
    assert (odd.ticker, odd.doc_date) == (None, dt.date(2026, 2, 4))
    assert odd.warnings == [
        "ticker 42 is not a ticker symbol (letters first, up to 10 of A-Z, 0-9, '.', '-'); the document has no "
        "ticker, so ticker filters and boosts skip it",
        "date 'tuesday' is not a date (YYYY-MM-DD); the document's date is its file name's, 2026-02-04"]
    # YAML names its date the same way when no field gives one
    (tmp_path / "watch-2026-03-01.yaml").write_text("ticker: AMD\nanalysis_date: soon\nthesis: up\n")
    yml = load_one(tmp_path / "watch-2026-03-01.yaml", tmp_path)
    assert yml.doc_date == dt.date(2026, 3, 1) and yml.warnings == [
        "analysis_date 'soon' is not a date (YYYY-MM-DD); the document's date is its file name's, 2026-03-01"]
    # digits that run on are not a date
    (tmp_path / "build-12026-01-015.md").write_text("# Build\n\nText.\n")
    assert load_one(tmp_path / "build-12026-01-015.md", tmp_path).doc_date is None


def test_markdown_document_metadata():
    rel = "tradegent-docs/.claude/rules/05-database-access.md"
    doc = load_one(SHARED_CORPUS / rel, SHARED_CORPUS)
    assert doc.format == "markdown" and doc.doc_type == "note" and doc.doc_id == rel


def test_templates_are_skipped_but_real_docs_with_path_placeholders_are_not():
    template = load_one(SHARED_CORPUS / "tradegent/templates/stock-analysis.yaml", SHARED_CORPUS)
    assert isinstance(template, Skipped) and template.reason == "template"
    scanner = load_one(SHARED_CORPUS / "tradegent/knowledge/scanners/weekly/earnings-calendar.yaml", SHARED_CORPUS)
    assert isinstance(scanner, Document)


def test_malformed_yaml_reports_line_and_column():
    bad = load_one(SHARED_CORPUS / "tradegent/templates/post-trade-review.yaml", SHARED_CORPUS)
    assert isinstance(bad, Skipped)
    assert bad.reason == "malformed_yaml"
    assert "line 153, column 3" in bad.detail


def test_every_kind_of_bad_input_has_a_reason(tmp_path: Path):
    files = {
        "empty.yaml": b"",
        "blank.md": b"   \n\n",
        "binary.yaml": b"\x00\x01\x02binary",
        "latin1.md": "caf\xe9 notes".encode("latin-1"),
        "list.yaml": b"- a\n- b\n",
        "notes.txt": b"plain text",
        "big.md": b"# big\n" + b"x" * 2000,
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    reasons = {
        name: load_one(tmp_path / name, tmp_path, limit=1000).reason for name in files
    }
    assert reasons == {
        "empty.yaml": "empty",
        "blank.md": "empty",
        "binary.yaml": "binary",
        "latin1.md": "not_utf8",
        "list.yaml": "unsupported_structure",
        "notes.txt": "unknown_format",
        "big.md": "too_large",
    }


def test_jsonl_records_are_documents_and_bad_lines_are_skipped(tmp_path: Path):
    lines = [
        json.dumps({"_id": "1", "title": "Aspirin", "text": "Aspirin reduces fever."}),
        "{not json",
        json.dumps({"_id": "2", "title": "Empty", "text": "  "}),
        json.dumps({"title": "no id", "text": "x"}),
        json.dumps({"_id": "3", "text": "Statins lower cholesterol."}),
    ]
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    items = load_file(tmp_path / "corpus.jsonl", tmp_path, "beir", LIMIT)
    docs = [i for i in items if isinstance(i, Document)]
    skips = {i.reason for i in items if isinstance(i, Skipped)}
    assert [d.doc_id for d in docs] == ["1", "3"]
    assert docs[0].path == "corpus.jsonl#1" and docs[0].title == "Aspirin"
    assert skips == {"malformed_json", "empty", "missing_id"}


def test_content_hash_changes_with_content(tmp_path: Path):
    path = tmp_path / "a.md"
    path.write_text("## A\ntext one\n")
    first = load_one(path, tmp_path).content_hash
    path.write_text("## A\ntext two\n")
    assert load_one(path, tmp_path).content_hash != first


def test_jsonl_size_limit_applies_per_record(tmp_path: Path):
    records = [json.dumps({"_id": str(i), "text": f"abstract {i} " + "word " * 40}) for i in range(50)]
    records.append(json.dumps({"_id": "huge", "text": "x" * 5000}))
    (tmp_path / "corpus.jsonl").write_text("\n".join(records) + "\n")
    items = load_file(tmp_path / "corpus.jsonl", tmp_path, "beir", 1000)  # the file is far over 1000 bytes
    docs = [i for i in items if isinstance(i, Document)]
    skips = [i for i in items if isinstance(i, Skipped)]
    assert len(docs) == 50
    assert [(s.reason, s.path) for s in skips] == [("too_large", "corpus.jsonl:51")]
