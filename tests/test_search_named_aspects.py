"""A question naming several document types (or tickers) asks about each of them: "how do the ticker
profile and the strategy use the pre-earnings dip". One document's many matching sections (the
profile's) must not fill the first places while the other named document's answer ranks far below;
`search.aspect_window` puts each named type's and ticker's best unit among the first results. A
question naming one document keeps that document's sections together. Fixture corpus written here;
real database and model."""

from __future__ import annotations

from pathlib import Path

from testkit import ingest_fixture

PROFILE = {
    "earnings_pattern": "ZETA dips before earnings: the stock fell in the week before each of the last "
                        "eight earnings reports, then recovered after the report.",
    "trading_patterns": "ZETA tends to dip before earnings and drift higher after the report; pre-earnings "
                        "weakness is the stock's most reliable pattern.",
    "my_edge": "My edge in ZETA: buying the pre-earnings dip before the report, sized small.",
    "earnings_history": "ZETA earnings history: the stock dipped before earnings in each of the last eight "
                        "quarters and beat estimates in seven.",
    "notes": "Notes on ZETA: watch the dip before earnings; the pre-earnings selloff is usually over "
             "two days before the report.",
    "volatility": "ZETA implied volatility rises into earnings while the stock dips before the report.",
}


def _corpus(kb, root: Path) -> None:
    docs = {
        "profiles/ZETA.yaml": {"_meta": {"id": "ZETA-profile", "type": "ticker-profile", "version": 1},
                               "ticker": "ZETA", **{k: {"text": v} for k, v in PROFILE.items()}},
        "strategies/report-drift.yaml": {
            "_meta": {"id": "report-drift", "type": "strategy", "version": 1},
            "overview": {"text": "Report drift: a swing strategy that trades around quarterly reports."},
            "entry_rules": {"text": "Enter on weakness in the days ahead of a company's quarterly report when "
                                    "the name has a record of recovering afterwards; half size."},
            "exit_rules": {"text": "Exit two sessions after the report or at a 6% loss."}},
        "notes/macro.yaml": {"_meta": {"id": "macro", "type": "research-analysis", "version": 1},
                             "summary": {"text": "Rates and the dollar moved little this week."}},
    }
    ingest_fixture(kb, root, docs)


def _units(kb, query: str) -> list[str]:
    hits = kb.search(query, mode="hybrid", top_k=10).hits
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True), scores  # a moved unit takes its new place's score
    return [h.unit_id for h in hits]


def test_each_named_document_type_reaches_the_first_results(kb, tmp_path):
    _corpus(kb, tmp_path / "corpus")
    units = _units(kb, "ZETA tends to dip before earnings - how do the ticker profile and the strategy use that")
    first = [u.split("#")[0] for u in units[:5]]
    assert "strategies/report-drift.yaml" in first, units
    assert first[0] == "profiles/ZETA.yaml", units  # the best result keeps its place
    kb.settings.search.aspect_window = 0  # off: the profile's six sections come first
    units = _units(kb, "ZETA tends to dip before earnings - how do the ticker profile and the strategy use that")
    assert "strategies/report-drift.yaml" not in [u.split("#")[0] for u in units[:5]], units


def test_one_named_document_keeps_its_sections_together(kb, tmp_path):
    _corpus(kb, tmp_path / "corpus")
    # one document type named: the profile's matching sections fill the first places as before
    units = _units(kb, "how does the ticker profile describe ZETA's dip before earnings")
    assert [u.split("#")[0] for u in units[:5]] == ["profiles/ZETA.yaml"] * 5, units
