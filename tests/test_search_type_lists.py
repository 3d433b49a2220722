"""A question that selects documents by their type's own name ("which fields does a trade journal
record", "the stock analyses that ...") also retrieves among that type's documents alone
(`search.type_list_weight`): the journal's own sections then outrank the markdown notes that
describe trade journals in the question's words. Type names are the collection's own document types.
Fixture corpus written here; real database and model."""

from __future__ import annotations

from pathlib import Path

from testkit import ingest_fixture

from rag_lib.config import SearchSettings
from rag_lib.search.classify import find_type_lists

DOCS = {
    "trades/ZETA_20250312.yaml": {
        "_meta": {"id": "ZETA-trade-1", "type": "trade-journal", "ticker": "ZETA", "version": 1},
        "thesis": {"summary": "Long ZETA into the product launch on improving subscription growth."},
        "execution": {"entry_date": "2025-03-03", "entry_price": 41.2, "position_size_pct": 2.0,
                      "exit_date": "2025-03-12", "exit_price": 46.9,
                      "exit_rationale": "Target reached after the launch gap"},
        "results": {"pnl_pct": 13.8, "pnl_dollars": 1140, "holding_days": 9, "outcome": "win"},
    },
    "analysis/ZETA_20250301.yaml": {
        "_meta": {"id": "ZETA-stock-1", "type": "stock-analysis", "ticker": "ZETA", "version": 1},
        "summary": {"text": "ZETA: subscription growth re-accelerating; buy below 42."},
        "time_stop": {"days": 20, "rule": "Close the position if the thesis has not played out in 20 days."},
    },
    "analysis/QUUX_20250302.yaml": {
        "_meta": {"id": "QUUX-stock-1", "type": "stock-analysis", "ticker": "QUUX", "version": 1},
        "summary": {"text": "QUUX: margins under pressure; no position."},
        "time_stop": {"days": 15, "rule": "Re-assess after 15 trading days."},
    },
}

NOTES = {
    # markdown that describes trade journals in the question's own words (no declared type: `note`)
    "skills/trade-journal.md": """# Trade journal skill

## When to use
Record a trade journal entry whenever a position is opened or closed. The trade journal records
what you did and why, so every closed position can be reviewed later.

## Fields
A trade journal records fields for each position: the thesis, the entry, and when the position is
closed, the exit and the result. Keep the fields of the trade journal complete.
""",
    "guides/journaling.md": """# Journaling guide

## Why journal
Which fields a trade journal should record is the most common question about journaling: record the
fields when a position is opened and again when the position is closed.
""",
    # markdown describing stock analyses and their time stops
    "skills/stock-analysis.md": """# Stock analysis skill

## Time stop
Stock analyses set a time stop: after how many days the analyses are redone if the thesis has not
played out. Which stock analyses set a time stop depends on the setup.
""",
}

JOURNAL = "trades/ZETA_20250312.yaml"
CLOSED = "which fields does a trade journal record when a position is closed"


def _corpus(kb, root: Path) -> None:
    ingest_fixture(kb, root, {**DOCS, **NOTES})


def _filtered_calls(kb, monkeypatch) -> list:
    """The `doc_type` filters of the semantic searches the store runs from now on."""
    calls: list = []
    run = kb.store.semantic_search

    def spy(vector, space, dimensions, filters, *args, **kwargs):
        calls.append(filters.doc_type)
        return run(vector, space, dimensions, filters, *args, **kwargs)

    monkeypatch.setattr(kb.store, "semantic_search", spy)
    return calls


def test_a_type_s_own_sections_outrank_notes_describing_the_type(kb, tmp_path):
    _corpus(kb, tmp_path / "corpus")
    assert SearchSettings().type_list_weight == 0.5
    result = kb.search(CLOSED, mode="hybrid", top_k=5)
    units = [h.unit_id for h in result.hits]
    assert result.plan["type_lists"] == ["trade-journal"]
    assert units[0].split("#")[0] == JOURNAL, units
    kb.settings.search.type_list_weight = 0  # off: the notes written in the question's words come first
    result = kb.search(CLOSED, mode="hybrid", top_k=5)
    assert result.plan["type_lists"] == []
    assert not result.hits[0].unit_id.startswith(JOURNAL), [h.unit_id for h in result.hits]


def test_a_plural_type_name_selects_that_type(kb, tmp_path, monkeypatch):
    _corpus(kb, tmp_path / "corpus")
    calls = _filtered_calls(kb, monkeypatch)
    result = kb.search("which stock analyses set a time stop, and after how many days", mode="hybrid", top_k=5)
    assert result.plan["type_lists"] == ["stock-analysis"]
    assert "stock-analysis" in calls
    units = [h.unit_id for h in result.hits]
    assert units[0].split("#")[0].startswith("analysis/"), units


def test_the_caller_s_type_filter_wins(kb, tmp_path, monkeypatch):
    _corpus(kb, tmp_path / "corpus")
    calls = _filtered_calls(kb, monkeypatch)
    # the caller asked for notes only: no list of the journal's type, nothing but notes
    result = kb.search(CLOSED, mode="hybrid", top_k=5, doc_type="note")
    assert result.plan["type_lists"] == [] and "trade-journal" not in calls
    assert result.hits and all(h.doc_type == "note" for h in result.hits)
    # the journal's type alone: its list would repeat the query's own
    calls.clear()
    result = kb.search(CLOSED, mode="hybrid", top_k=5, doc_type="trade_journal")
    assert result.plan["type_lists"] == [] and "trade-journal" not in calls
    # both types allowed: the journal's list runs within them
    result = kb.search(CLOSED, mode="hybrid", top_k=5, doc_type=["note", "trade-journal"])
    assert result.plan["type_lists"] == ["trade-journal"]
    assert result.hits[0].unit_id.startswith(JOURNAL), [h.unit_id for h in result.hits]


def test_a_question_naming_no_type_runs_no_type_list(kb, tmp_path, monkeypatch):
    _corpus(kb, tmp_path / "corpus")
    calls = _filtered_calls(kb, monkeypatch)
    result = kb.search("when should a position be closed", mode="hybrid", top_k=5)
    assert result.plan["type_lists"] == []
    assert calls and all(t is None for t in calls)  # the query's own lists only, unfiltered
    # a question naming a ticker picks documents by it: no type list either
    result = kb.search("which fields does a trade journal record for ZETA", mode="hybrid", top_k=5)
    assert result.plan["type_lists"] == [] and all(t is None for t in calls)


def test_type_names_are_the_collection_s_own():
    types = {"trade-journal", "stock-analysis", "meeting-note", "note", "unknown", "record", "strategy",
             "scanner-config"}
    assert find_type_lists("which fields does a trade journal record", types) == ["trade-journal"]
    assert find_type_lists("what does a bias trade-journal entry hold", types) == ["trade-journal"]
    assert find_type_lists("the stock analyses dated February 2026", types) == ["stock-analysis"]
    assert find_type_lists("which scanner configs run first", types) == ["scanner-config"]
    assert find_type_lists("which strategies trade earnings", types) == ["strategy"]
    # the question's own words about one document, not a kind selected: no type
    assert find_type_lists("the trade journal of my NVDA trade", types) == []
    assert find_type_lists("earnings momentum strategy position size", types) == []
    # the longest name wins; the types of documents declaring none are never named ("a research note")
    assert find_type_lists("what does a meeting note record", types) == ["meeting-note"]
    assert find_type_lists("does a research note agree with the analysis", types) == []
    assert find_type_lists("an unknown risk after a record quarter", types) == []
    assert find_type_lists("what does a trade journal record", {"trade-journal", "journal"}) == ["trade-journal"]
    assert find_type_lists("what does a stock analysis say", {"stock-analysis"}) == []  # nothing else to leave out
