"""Descriptor sections on a small fixture corpus (real database, real model): a YAML document's
`_meta`, `_graph`, `_links` and metadata scalars are indexed as small sections, so questions that
select documents by what they are ("closed trades", "documents that link to the breakout strategy")
find them, while questions about one ticker's content are answered by its content sections."""

from __future__ import annotations


import pytest
import yaml

from rag_lib.config import Settings
from rag_lib.flatten import flatten, load_mapping
from rag_lib.models import Document, SearchHit
from rag_lib.search.classify import classify
from rag_lib.search.fusion import weigh_descriptors


def _trade(ticker: str, status: str, strategy: str, day: int, entry: float, exit_: float) -> dict:
    return {
        "_meta": {"id": f"TRD-{ticker}", "type": "trade-journal", "created": f"2025-03-{day:02d}T10:00:00Z",
                  "status": status},
        "ticker": ticker,
        "trade_date": f"2025-03-{day:02d}",
        "execution": {"entry_price": entry, "exit_price": exit_, "shares": 100,
                      "notes": f"Bought {ticker} on the open after the gap held; sold into strength."},
        "review": {"lesson": f"{ticker}: sizing was right, the exit came too early on the first pullback."},
        "_links": {"strategy": f"strategies/{strategy}.yaml"},
        "_graph": {"entities": [["ticker", ticker], ["strategy", strategy]],
                   "relations": [[f"TRD-{ticker}", "follows", strategy]]},
        "_indexing": {"rag_embed_fields": [], "graph_extract_fields": []},
    }


def _strategy(name: str, rule: str) -> dict:
    return {"_meta": {"id": f"STR-{name}", "type": "strategy", "created": "2025-01-02T09:00:00Z", "status": "active"},
            "name": name.replace("-", " ").title(),
            "entry_rules": {"rule": rule},
            "position_sizing": {"rule": "Risk one percent of the account per trade; half size before earnings."}}


FILES = {
    "trades/NVDA_T1.yaml": _trade("NVDA", "closed", "breakout", 3, 120.5, 131.0),
    "trades/AMD_T2.yaml": _trade("AMD", "open", "breakout", 5, 160.0, 0.0),
    "trades/TSLA_T3.yaml": _trade("TSLA", "closed", "mean-reversion", 7, 240.0, 228.5),
    "strategies/breakout.yaml": _strategy("breakout", "Buy a close above the 20-day high on twice the average volume."),
    "strategies/mean-reversion.yaml": _strategy("mean-reversion", "Buy two standard deviations below the 20-day mean."),
}


@pytest.fixture
def corpus_kb_small(kb, tmp_path):
    root = tmp_path / "corpus"
    for rel, body in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(yaml.safe_dump(body, sort_keys=False))
    report = kb.ingest([root], root=root)
    assert report.count("failed") == 0
    return kb


def _units(kb, query: str, top_k: int = 6, mode: str = "hybrid") -> list[str]:
    return [h.unit_id for h in kb.search(query, mode=mode, top_k=top_k).hits]


def test_descriptor_keys_are_small_sections_and_indexing_stays_out():
    mapping = load_mapping(Settings().sections_file)
    doc = Document(doc_id="TRD-NVDA", path="trades/NVDA_T1.yaml", collection="c", format="yaml",
                   doc_type="trade-journal", content_hash="x", body=FILES["trades/NVDA_T1.yaml"])
    sections = {s.name: s for s in flatten(doc, mapping)}
    assert {"_meta", "_links", "_graph", "ticker", "trade_date"} <= set(sections)
    assert "_indexing" not in sections  # machine bookkeeping with nothing to find
    assert "status: closed" in sections["_meta"].text
    assert "strategies/breakout.yaml" in sections["_links"].text
    assert sections["trade_date"].text == "trade date: 2025-03-03"
    assert {"_meta", "_graph", "_links", "ticker", "trade_date"} <= mapping.descriptor_names
    assert "execution" not in mapping.descriptor_names
    # a document can opt out (stored texts do: their `_meta` repeats what was given with the text)
    opted_out = Document(doc_id="x", path="texts/x.yaml", collection="c", format="yaml", doc_type="note",
                         content_hash="y", body={"_meta": {"id": "x"}, "ticker": "NVDA", "text": "NVDA note",
                                                 "_indexing": {"descriptors": False}})
    assert [s.name for s in flatten(opted_out, mapping)] == ["text"]


@pytest.mark.parametrize(("query", "selects"), [
    ("closed trades in the journal", True),
    ("documents that link to the breakout strategy", True),
    ("which scanner configs run before the open", True),
    ("NVDA trades and their exits", False),  # one ticker's trades: a question about content
    ("how much does the AMD breakout depend on NVDA", False),
    ("breakout strategy position size by conviction", False),  # one document, named in the singular
])
def test_questions_that_select_documents(query, selects):
    assert classify(query, {"NVDA", "AMD"}).selects_documents is selects


def test_weigh_descriptors_lowers_only_yaml_descriptor_sections():
    def hit(path: str, section: str, score: float) -> SearchHit:
        return SearchHit(chunk_id=f"{path}#{section}", score=score, text="", doc_id=path, path=path, section=section,
                         section_path=section, unit_id=f"{path}#{section}", doc_type="t", collection="c")

    hits = [hit("a.yaml", "_links", 0.9), hit("a.yaml", "execution", 0.8), hit("b.md", "_links", 0.7)]
    out = weigh_descriptors(hits, frozenset({"_links"}), 0.5)
    assert [(h.unit_id, round(h.score, 2)) for h in out] == [("a.yaml#execution", 0.8), ("b.md#_links", 0.7),
                                                            ("a.yaml#_links", 0.45)]


def test_a_question_selecting_documents_finds_their_links(corpus_kb_small):
    units = _units(corpus_kb_small, "documents that link to the breakout strategy")
    assert "trades/NVDA_T1.yaml#_links" in units and "trades/AMD_T2.yaml#_links" in units, units
    assert "trades/TSLA_T3.yaml#_links" not in units[:3], units


def test_closed_trades_are_found_by_their_status(corpus_kb_small):
    units = _units(corpus_kb_small, "closed trades in the journal")
    assert {"trades/NVDA_T1.yaml#_meta", "trades/TSLA_T3.yaml#_meta"} <= set(units[:4]), units


@pytest.mark.parametrize("mode", ["hybrid", "semantic"])
def test_a_question_about_one_tickers_content_is_answered_by_content(corpus_kb_small, mode):
    kb = corpus_kb_small
    names = load_mapping(kb.settings.sections_file).descriptor_names
    # the named ticker at its full full-text weight, where descriptors repeating it rank as described
    # below; hybrid search's default lower weight (tests/test_search_named_tickers.py) keeps them behind too
    kb.settings.search.lexical_named_ticker_weight = 1.0

    def first_descriptor(units: list[str]) -> int:
        return next((n for n, u in enumerate(units) if u.split("#", 1)[1] in names), len(units))

    weighted = _units(kb, "NVDA entry and exit price", mode=mode)
    assert weighted[0] == "trades/NVDA_T1.yaml#execution", weighted
    # Unweighted, the short sections repeating NVDA's ticker, tags and links come right after its
    # content, ahead of the other trades' executions; weighted, they fall behind those.
    kb.settings.search.descriptor_weight_other = 1.0
    unweighted = _units(kb, "NVDA entry and exit price", mode=mode)
    assert first_descriptor(unweighted) <= 2 < first_descriptor(weighted), (unweighted, weighted)
