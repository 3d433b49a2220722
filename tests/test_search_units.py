"""Pure parts of retrieval: query classification, rank fusion, boosts, excerpts, context assembly
and quote verification (no database)."""

from __future__ import annotations

import datetime as dt

import pytest

from rag_lib.models import SearchHit
from rag_lib.search.classify import classify, without_date
from rag_lib.search.context import assemble, quote_in_text
from rag_lib.search.fusion import Candidates, boost, date_boost, rrf, weigh_stubs
from rag_lib.search.lexical import exact_tokens, is_websearch
from rag_lib.search.results import by_date, excerpt, group_by_unit

KNOWN = {"NVDA", "AMD", "PFE", "META", "GOOGL", "NFLX"}


def hit(cid: str, path: str = "a.yaml", section: str = "s", text: str = "x", ticker: str | None = None,
        doc_type: str = "stock-analysis", score: float = 0.0, date: dt.date | None = None) -> SearchHit:
    return SearchHit(chunk_id=cid, score=score, text=text, doc_id=path, path=path, section=section, section_path=section,
                     unit_id=f"{path}#{section}", doc_type=doc_type, collection="default", ticker=ticker, doc_date=date)


@pytest.mark.parametrize("query,kind,tickers", [
    ("PFE vs AMD: account risk per trade", "comparison", ["PFE", "AMD"]),
    ("compare NVDA and AMD margins", "comparison", ["NVDA", "AMD"]),
    ("how has the NVDA thesis evolved over time", "trend", ["NVDA"]),
    ("how much does the AMD breakout idea depend on NVDA", "relationship", ["AMD", "NVDA"]),
    ("list all trades that hit their stop", "global", []),
    ("NVDA bull call spread strikes", "retrieval", ["NVDA"]),
    ("meta description of the scanner", "retrieval", []),  # lower-case common word is not a ticker
    ("nvda earnings", "retrieval", ["NVDA"]),  # lower-case ticker that is not a word counts
    # seed 004's verification and its trend / relationship words
    ("Compare NVDA vs AMD", "comparison", ["NVDA", "AMD"]),
    ("Recent earnings surprises", "trend", []),
    ("What happened to NVDA last week?", "trend", ["NVDA"]),
    ("latest META analysis", "trend", ["META"]),
    ("NVDA revenue growth YoY", "retrieval", ["NVDA"]),  # like Q4, YoY is a figure's period ("RPO growth YoY")
    ("NVDA revenue growth year over year since 2023", "trend", ["NVDA"]),
    ("Who are NVDA competitors?", "relationship", ["NVDA"]),
    ("NVDA peers in the semiconductor sector", "relationship", ["NVDA"]),
    ("NVDA Q4 results", "retrieval", ["NVDA"]),  # a quarter names a period, not a change over time
    ("oracle RPO size and QoQ growth", "retrieval", []),
])
def test_classify(query, kind, tickers):
    plan = classify(query, KNOWN)
    assert plan.kind == kind
    assert plan.tickers == tickers


def test_doc_type_hints():
    assert classify("exit rules in the strategy definitions", KNOWN).doc_types == ["strategy"]
    assert "scanner-config" in classify("unusual volume scanner thresholds", KNOWN).doc_types
    assert classify("lessons about entering too late", KNOWN).doc_types == ["learning"]


def test_rrf_scores_and_weights():
    a, b, c = hit("a"), hit("b"), hit("c")
    fused = rrf([Candidates("semantic", [a, b]), Candidates("lexical", [b, c])], k=60)
    assert [h.chunk_id for h in fused] == ["b", "a", "c"]
    assert fused[0].score == pytest.approx((1 / 62 + 1 / 61) / (2 / 61))
    # a heavier lexical list puts its top hit first
    a, b, c = hit("a"), hit("b"), hit("c")
    fused = rrf([Candidates("semantic", [a, b], 1.0), Candidates("lexical", [c], 3.0)], k=60)
    assert fused[0].chunk_id == "c"


def test_stub_sections_weigh_less_than_sections_that_say_something():
    stub = hit("1", section="post_mortem", text="prior analyses found: 0", score=0.72)
    answer = hit("2", section="rationale", text="META moved from WATCH to BUY after the capex guidance", score=0.64)
    short = hit("3", section="recommendation", text="recommendation: BUY on breakout above", score=0.60)
    assert [h.chunk_id for h in weigh_stubs([stub, answer, short], 5, 0.5)] == ["2", "3", "1"]
    assert stub.score == pytest.approx(0.36) and short.score == 0.60  # five words are not a stub
    assert weigh_stubs([hit("4", text="x", score=0.5)], 0, 0.5)[0].score == 0.5  # 0 words: off


def test_boost_is_soft():
    hits = [hit("1", "x/AMD_1.yaml", ticker="AMD", score=0.50), hit("2", "x/NVDA_1.yaml", ticker="NVDA", score=0.55),
            hit("3", "x/metadata.yaml", score=0.9)]
    out = boost(hits, ["NVDA"], [], 0.15)
    assert [h.chunk_id for h in out] == ["3", "2", "1"]  # nothing removed; NVDA rises above AMD only
    out = boost([hit("4", "docs/metadata.md", score=0.5), hit("5", "META_2026.yaml", score=0.45)], ["META"], [], 0.15)
    assert out[0].chunk_id == "5"  # ticker in the file name, but not inside the word "metadata"


def test_a_ticker_written_with_a_leading_minus_is_excluded_not_named():
    plan = classify('"bull call spread" -NFLX NVDA', KNOWN)
    assert plan.tickers == ["NVDA"] and plan.excluded == ["NFLX"]
    assert classify("AMD-NVDA spread", KNOWN).excluded == []  # a hyphen inside a word is no exclusion


def test_group_by_unit_keeps_best_chunk():
    hits = [hit("1", section="a"), hit("2", section="b"), hit("3", section="a")]
    assert [h.chunk_id for h in group_by_unit(hits)] == ["1", "2"]


def test_excerpt_picks_matching_sentences():
    text = "Intro line about nothing. The stop loss sits at 131.50 below support. Weather was fine. Target 160."
    out = excerpt(text, "where is the stop loss", max_chars=80)
    assert "stop loss sits at 131.50" in out and "Weather" not in out
    assert len(excerpt("word " * 400, "word", max_chars=100)) <= 100


def test_an_excerpt_with_no_word_of_the_query_shows_the_passage_not_its_heading():
    """A semantic hit sharing no word with the query showed its first line alone: `## Summary`, or the
    `---` of a note's front matter, in place of the text a reader needs to judge the hit."""
    minutes = ("## Summary\n\nCommittee members saw the outlook as balanced. Several participants favoured "
               "a cut in March.")
    assert excerpt(minutes, "export restrictions") == ("Committee members saw the outlook as balanced. Several "
                                                       "participants favoured a cut in March.")
    note = "---\ntitle: Semis\n---\n\n# Semis cycle\n\nHyperscaler capex keeps rising."
    assert excerpt(note, "TSLA short") == "title: Semis Hyperscaler capex keeps rising."
    table = "| Risk | Odds |\n|------|------|\n| Export ban | 30% |"
    assert excerpt(table, "china") == "| Risk | Odds | | Export ban | 30% |"
    assert excerpt("## Only a heading", "x") == "## Only a heading"  # nothing else to show
    # matching sentences apart are marked as such; the query's words still choose them
    text = "Alpha one. The stop loss sits at 131.50. Beta two. Gamma three. Stop loss moved to 128."
    assert excerpt(text, "stop loss") == "The stop loss sits at 131.50. … Stop loss moved to 128."


def test_an_excerpt_matching_a_yaml_key_shows_the_block_under_it():
    """`rag search "compare META and GOOGL bear case"` showed `bear case:` and `bear:` alone: the key
    matched the question, its indented value (probability, target, driver) shared no word and was left out."""
    scenarios = ("bull:\n  probability pct: 40\n  outcome: AI momentum continues\nbear:\n  probability pct: 15\n"
                 "  outcome: Broader market correction\n  price target: 270.0\nexpected value pct: 12.01")
    assert excerpt(scenarios, "compare META and GOOGL bear case") == \
        "bear: probability pct: 15 outcome: Broader market correction price target: 270.0"
    review = ("what failed: Could have held longer\nbiases detected:\n"
              "  - bias: disposition-effect, impact: Sold too early, left 5% on table\nnext: review")
    assert excerpt(review, "what biases did I show") == \
        "biases detected: - bias: disposition-effect, impact: Sold too early, left 5% on table"


def test_an_excerpt_joins_hard_wrapped_lines_into_sentences():
    """`rag search "CRM Salesforce risks"` showed "CRM has compelling fundamentals with Agentforce AI
    momentum (330% ARR growth)," and stopped: each wrapped line of a YAML block scalar (or markdown
    paragraph) was taken for a sentence of its own. List items and keys stay lines."""
    rationale = ("rationale:\nCRM has compelling fundamentals with Agentforce AI momentum (330% ARR growth),\n"
                 "strong cash flow, and upside to analyst targets.\nHowever, poor technicals create unfavorable\n"
                 "entry timing.")
    assert excerpt(rationale, "CRM Salesforce risks") == \
        "CRM has compelling fundamentals with Agentforce AI momentum (330% ARR growth), strong cash flow, " \
        "and upside to analyst targets."
    items = "Setup notes\n- alerts one\n- two\nlimit: alerts\nend"
    assert excerpt(items, "alerts") == "- alerts one … limit: alerts"


def test_query_syntax_detection():
    assert is_websearch('"bull call spread" NVDA') and is_websearch("earnings -NFLX")
    assert not is_websearch("PFE vs AMD: risk per trade")
    assert exact_tokens("NVDA stop at 131.50 in NVDA_20250120T0900.yaml") == ["NVDA", "131.50", "NVDA_20250120T0900.yaml"]


def test_quote_verification():
    text = "Entry at $132.40 with a stop at 126.00.\nTarget:  \u201cR:R 2.5\u201d before earnings."
    assert quote_in_text("stop at 126.00", text)
    assert quote_in_text('target: "r:r 2.5"', text)  # case, whitespace and typographic quotes
    assert quote_in_text("Entry at $132.40 … before earnings", text)
    assert not quote_in_text("stop at 125.00", text)
    assert not quote_in_text("before earnings … Entry at", text)  # parts out of order
    assert not quote_in_text("  ", text)


def test_assemble_budget_dedupe_order_and_citations():
    count = lambda s: len(s.split())  # noqa: E731 - a word tokenizer is enough for the logic
    hits = [
        hit("c2", "doc1.yaml", "risk", "second chunk of doc one " * 3, score=0.9),
        hit("d1", "doc2.yaml", "thesis", "doc two thesis text with details", score=0.8),
        hit("dup", "copy.yaml", "risk", "second chunk of doc one " * 3, score=0.7),  # same text elsewhere
        hit("c1", "doc1.yaml", "intro", "first chunk of doc one", score=0.6),
        hit("big", "doc3.yaml", "s", "huge " * 500, score=0.5),
    ]
    positions = {"c1": (0, 0), "c2": (3, 100), "d1": (0, 0)}
    ctx = assemble("q", "hybrid", hits, count, 60, positions)
    assert [c.chunk_id for c in ctx.citations] == ["c1", "c2", "d1"]  # doc1 first (best), in reading order
    assert ctx.dropped == {"duplicate": 1, "over_budget": 1}
    assert ctx.tokens == count(ctx.context) <= 60
    assert ctx.context.startswith("[1] doc1.yaml | § intro\nfirst chunk of doc one")
    assert ctx.verify("[2]", "second chunk of doc one") and ctx.verify("1", "first chunk")
    assert not ctx.verify("[1]", "doc two thesis")  # in the context, but not in the cited chunk
    d = ctx.to_dict()
    assert d["citations"][0]["unit_id"] == "doc1.yaml#intro" and d["tokens"] <= d["token_budget"]
    tiny = assemble("q", "hybrid", hits, count, 5, positions)
    assert tiny.citations == [] and tiny.tokens == 0


def test_a_month_or_day_the_query_names_is_a_soft_boost():
    assert classify("AMD vs NVDA price targets in the January 2025 analyses", KNOWN).dates == ["2025-01-01", "2025-01-31"]
    assert classify("META support: 21:15 vs 21:30 analysis on Feb 20 2026", KNOWN).dates == ["2026-02-20", "2026-02-20"]
    assert classify("what happened in february 2024", KNOWN).dates == ["2024-02-01", "2024-02-29"]
    assert classify("stop loss rules for 2025 trades", KNOWN).dates == []  # a year alone is not a date hint
    jan, feb, undated = (hit("jan", score=0.50, date=dt.date(2025, 1, 22)), hit("feb", score=0.55, date=dt.date(2026, 2, 20)),
                         hit("undated", score=0.52))
    ranked = date_boost([feb, undated, jan], ["2025-01-01", "2025-01-31"], 0.15)
    assert [h.chunk_id for h in ranked] == ["jan", "feb", "undated"]  # raised, nothing dropped
    assert jan.score == pytest.approx(0.575) and feb.score == 0.55 and undated.score == 0.52


def test_a_month_named_without_a_year_is_the_latest_one_the_documents_fall_in():
    """"The January NVDA trade", "the december dump": the last such month (or day) some document is dated
    in, not every year's, nor one the knowledge base holds nothing from; "it may" is not a month."""
    held = {dt.date(2024, 1, 9), dt.date(2025, 1, 15), dt.date(2025, 12, 17), dt.date(2026, 2, 21)}
    assert classify("did the January NVDA trade follow the plan", KNOWN, known_dates=held).dates == \
        ["2025-01-01", "2025-01-31"]
    assert classify("the database giant's december dump", KNOWN, known_dates=held).dates == ["2025-12-01", "2025-12-31"]
    assert classify("weights in the Feb 21 MSFT analyses", KNOWN, known_dates=held).dates == ["2026-02-21", "2026-02-21"]
    assert classify("the December 11 volume spike", KNOWN, known_dates=held).dates == []  # no document that day
    assert classify("what happened in June", KNOWN, known_dates=held).dates == []  # nothing dated in any June
    assert classify("it may fall further in march", KNOWN, known_dates={dt.date(2025, 5, 2), dt.date(2025, 3, 2)}).dates == []
    assert classify("did the January NVDA trade follow the plan", KNOWN).dates == []  # no dates known: no guess
    assert without_date("the database giant's december dump") == "the database giant's   dump"


def test_trend_order_reads_a_day_by_time_of_day():
    """"The latest" reads newest first by the time of day a file name carries (two trades of one day),
    a date-only document at the start of its day; undated results stay last in rank order."""
    morning = hit("morning", "trades/2025/01/NVDA_20250115T1000.yaml", date=dt.date(2025, 1, 15))
    afternoon = hit("afternoon", "trades/2025/01/NVDA_20250115T1430.yaml", date=dt.date(2025, 1, 15))
    date_only = hit("date_only", "learnings/sizing.yaml", date=dt.date(2025, 1, 15))
    # the name's timestamp is of another day than the document's date: only the date counts
    renamed = hit("renamed", "stock/NVDA_20250110T2300.yaml", date=dt.date(2025, 1, 15))
    day_before = hit("day_before", "stock/NVDA_20250114T2300.yaml", date=dt.date(2025, 1, 14))
    undated = hit("undated", "notes/ideas.md")
    ranked = [morning, undated, renamed, date_only, day_before, afternoon]
    assert [h.chunk_id for h in by_date(ranked, newest_first=True)] == \
        ["afternoon", "morning", "renamed", "date_only", "day_before", "undated"]
    assert [h.chunk_id for h in by_date(ranked)] == \
        ["day_before", "renamed", "date_only", "morning", "afternoon", "undated"]
