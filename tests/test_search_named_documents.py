"""A question about several things can name a document by its name and type: "did the ZETA setup
satisfy the report-drift strategy's entry rules". The strategy's sections do not carry its name in
their text (a ticker's carry the ticker), so its answering section was not even among the
candidates while the named ticker's documents filled the first places. `search.named_documents`
reads such names (file names and ids of two words or more) and gives that document's sections a
list of their own, the hint boost and a place among the first results. Fixture corpus written here;
real database and model."""

from __future__ import annotations

from pathlib import Path

from testkit import ingest_fixture

from rag_lib.search.classify import DocumentNames, classify, find_named_documents

PROFILE = {
    "earnings_setup": "ZETA earnings setup: the stock fell 6% into the report with implied volatility high; "
                      "the ZETA setup scored 7 of 10 before the quarterly report.",
    "trading_patterns": "ZETA tends to dip before earnings and drift higher after the report.",
    "my_edge": "My edge in ZETA: buying the pre-earnings dip in the ZETA setup, sized small.",
    "earnings_history": "ZETA earnings history: beat estimates in seven of the last eight quarters.",
    "risk": "ZETA setup risk: the reward to risk of the ZETA earnings setup was about 2.5 to 1.",
    "notes": "Notes on the ZETA setup before earnings: watch support at 40 and the options skew.",
}


def _corpus(kb, root: Path) -> None:
    docs = {
        "profiles/ZETA.yaml": {"_meta": {"id": "ZETA-profile", "type": "ticker-profile", "version": 1},
                               "ticker": "ZETA", **{k: {"text": v} for k, v in PROFILE.items()}},
        "strategies/report-drift.yaml": {
            "_meta": {"id": "STR-report-drift", "type": "strategy", "version": 1},
            "overview": {"text": "A swing strategy that trades around quarterly reports."},
            "entry_rules": {"text": "Criteria: conviction above 70%; a bullish demand signal; support identified "
                                    "for the stop; R:R ratio above 3:1, required."},
            "exit_rules": {"text": "Exit two sessions after the report or at a 6% loss."}},
        "strategies/gap-fade.yaml": {
            "_meta": {"id": "STR-gap-fade", "type": "strategy", "version": 1},
            "overview": {"text": "Fade opening gaps in liquid names."},
            "entry_rules": {"text": "Enter against a gap of more than 3% after the first 15 minutes; R:R above 2:1."}},
    }
    ingest_fixture(kb, root, docs)


QUESTION = "Did the ZETA earnings setup satisfy the report-drift strategy's entry rules and its reward to risk?"


def _units(kb, query: str) -> list[str]:
    hits = kb.search(query, mode="hybrid", top_k=10).hits
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True), scores  # a moved unit takes its new place's score
    return [h.unit_id for h in hits]


def test_a_document_named_by_name_and_type_reaches_the_first_results(kb, tmp_path):
    _corpus(kb, tmp_path / "corpus")
    result = kb.search(QUESTION, mode="hybrid", top_k=10)
    assert result.plan["documents"] == ["strategies/report-drift.yaml"]
    units = [h.unit_id for h in result.hits]
    assert "strategies/report-drift.yaml#entry_rules" in units[:5], units
    assert "strategies/gap-fade.yaml#entry_rules" not in units[:5], units  # the other strategy is not named
    kb.settings.search.named_documents = False  # off: the ticker's profile fills the first places
    units = _units(kb, QUESTION)
    assert "strategies/report-drift.yaml#entry_rules" not in units[:5], units


def test_which_names_count():
    names = DocumentNames([("strategies/report-drift.yaml", "STR-report-drift", "strategy"),
                           ("scanners/report-drift.yaml", "SCANNER-REPORT-DRIFT-001", "scanner-config"),
                           ("trades/ZETA_20250115T1000.yaml", "TRD-2025-001", "trade-journal")])
    known = {"ZETA"}

    def named(query: str) -> list[str]:
        return find_named_documents(classify(query, known), names)

    # its name and its type, beside another thing asked about (a ticker, another document)
    assert named("did the ZETA setup meet the report drift strategy's rules") == ["strategies/report-drift.yaml"]
    assert named("does the report-drift scanner look where the report-drift strategy enters") == \
        ["strategies/report-drift.yaml", "scanners/report-drift.yaml"]
    # one document asked about: found by its words anyway, its own sections would crowd the others out
    assert named("report drift strategy position size") == []
    # a name without its type is a topic; a question selecting documents is not about the one it names
    assert named("how did report drift affect the ZETA trade journal") == []
    assert named("strategies and trades that link to the report-drift strategy") == []
    # a file name of one word after the date is left out ("ZETA" is the ticker's business)
    assert named("the ZETA trade and the report-drift strategy") == ["strategies/report-drift.yaml"]
