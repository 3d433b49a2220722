"""A ticker or a month named in a hybrid question picks documents, not sections: in full text a ticker
matches every chunk of its documents (the ticker field and the embedded prefix), a month every
section that repeats it, and those sections would outrank the section that answers.
`search.lexical_named_ticker_weight` scales a named ticker's full-text weight, `search.lexical_drop_dates`
leaves the month out of the full-text query. Fixture corpus written here; real database and model."""

from __future__ import annotations

from pathlib import Path

import yaml

NEWS = ("{t} shares jumped at the open. {t} traders chased {t} calls, {t} bulls pointed to the {t} chart "
        "and {t} bears covered; the {t} tape stayed busy all day.")


def _analysis(ticker: str, cash: str) -> dict:
    return {"_meta": {"id": f"{ticker}-2026-02", "type": "stock-analysis", "version": 1,
                      "created": "2026-02-20T21:00:00Z"},
            "ticker": ticker,
            "news": {"text": NEWS.format(t=ticker)},
            "technical": {"text": f"{ticker} closed above its 50-day average; {ticker} RSI at 61 with {ticker} "
                                  "volume rising into resistance."},
            "fundamentals": {"text": f"Free cash flow was {cash} over the last four quarters, after capital "
                                     "spending on data centers."},
            "sentiment": {"text": "Analysts are split; options skew is neutral and short interest is low."},
            "peers": {"text": f"{ticker} against ACME, BOLT, CRUX and DYNE: {ticker} trades at a premium to "
                              "ACME and BOLT on sales, in line with CRUX and DYNE."},
            "calendar": {"text": "February 2026 events: the February 2026 CPI print, February 2026 options "
                                 "expiry and the Fed minutes of February 2026."}}


def _corpus(kb, root: Path) -> None:
    for ticker, cash in (("ACME", "$4.1 billion"), ("BOLT", "$2.7 billion"), ("CRUX", "$9.8 billion"),
                         ("DYNE", "$1.2 billion")):
        path = root / "analysis" / f"{ticker}_20260220T2100.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(_analysis(ticker, cash), sort_keys=False), encoding="utf-8")
    report = kb.ingest([root], root=root)
    assert report.count("failed") == 0


def _units(kb, query: str) -> list[str]:
    return [h.unit_id for h in kb.search(query, mode="hybrid", top_k=6).hits]


def test_named_tickers_do_not_outrank_the_section_that_answers(kb, tmp_path):
    _corpus(kb, tmp_path / "corpus")
    units = _units(kb, "how much cash do ACME and BOLT generate")
    rank = {u: n for n, u in enumerate(units)}
    # each `peers` section names both tickers (two rare words in full text) and says nothing about cash;
    # with the tickers at full weight ACME's came first
    assert units[0] == "analysis/ACME_20260220T2100.yaml#fundamentals", units
    for ticker in ("ACME", "BOLT"):
        doc = f"analysis/{ticker}_20260220T2100.yaml"
        assert rank[f"{doc}#fundamentals"] < rank.get(f"{doc}#peers", 99), units


def test_a_named_ticker_still_picks_its_own_documents(kb, tmp_path):
    _corpus(kb, tmp_path / "corpus")
    units = _units(kb, "BOLT free cash flow")
    # every analysis has a fundamentals section: the named ticker's comes first (hint boost, semantic list)
    assert units[0] == "analysis/BOLT_20260220T2100.yaml#fundamentals", units
    # a question that is only a ticker keeps it in full text (nothing else to match)
    assert _units(kb, "CRUX")[0].startswith("analysis/CRUX_20260220T2100.yaml#"), _units(kb, "CRUX")


def test_a_named_month_does_not_outrank_the_section_that_answers(kb, tmp_path):
    _corpus(kb, tmp_path / "corpus")
    units = _units(kb, "how much cash does BOLT generate, per its February 2026 analysis")
    # every `calendar` section repeats "February 2026" and says nothing about cash; with the month in
    # the full-text query they took the first four places
    assert units[0] == "analysis/BOLT_20260220T2100.yaml#fundamentals", units
    assert "analysis/BOLT_20260220T2100.yaml#calendar" not in units[:4], units
