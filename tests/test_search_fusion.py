"""Hybrid fusion on small fixture corpora (real database, real model): a document whose several
sections match lifts its other sections above weak matches elsewhere (parent-document evidence), and
a section naming a rare identifier is not outvoted by generic sections that both retrievers half
like (convex fusion of scores, where reciprocal rank fusion counted votes), and full text that only
matched a question's incidental words weighs less than the semantic list's answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag_lib.config import SearchSettings
from rag_lib.search.fusion import Candidates, boost, convex, document_evidence, lexical_closeness, rescale_to_one, rrf
from rag_lib.models import SearchHit

MARGIN = {
    "margin-calls.md": """# Margin calls

## What triggers a margin call
A margin call comes when the equity in a margin account falls below the broker's maintenance
requirement, usually 25% to 30% of the position's value, after the positions lose value.

## Deadline to respond
You have two to five business days to meet the call by depositing cash or selling holdings; in a
fast market the broker may act sooner and without notice.

## Forced liquidation
If the call is not met in time, the broker sells positions of its own choosing, at market prices,
and the account owner pays any shortfall that remains.
""",
    "broker-costs.md": """# Broker costs

## Margin interest
Interest on margin loans is charged daily; a margin call is a different matter from margin interest.

## Commissions
Most stock trades are commission-free; options cost about 0.65 per contract.
""",
    "account-types.md": """# Account types

## Cash and margin accounts
A cash account trades with settled funds only; a margin account borrows against its securities
and can receive a margin call.

## Retirement accounts
IRAs cannot use margin borrowing; short selling is not allowed.
""",
    "futures.md": """# Futures basics

## Contract months
Index futures trade in March, June, September and December contracts.

## Variation margin
Futures accounts settle gains and losses every day through variation margin.
""",
}

GATEWAY = {
    "gateway.md": """# Gateway operations

## Session expiry
When the gateway logs ERR_4417 the broker session has expired: log in again through the
gateway's web page and restart the order router.

## Restart order
Start the gateway first, then the order router, then the scanners.

## Gateway log
The gateway writes its errors to gateway.log, one line per event with the time and the code.
""",
    "errors.md": """# Error handling

## What an error code means
Every error code the platform logs means one thing: look the code up in the runbook to see what
failed and what to do about it.

## Error codes in the logs
Error codes appear in the service log with a timestamp, the component and a short message.
""",
    "runbook.md": """# Runbook

## Reading the runbook
Each entry names a symptom, what it means and the fix, in the order an operator checks them.

## Escalation
If a fix does not work within 30 minutes, page the on-call engineer.
""",
}


DECEMBER = {
    "database-vendor.md": """# Database vendor review, December

## Price action
The shares fell 12% in the last two weeks of the year. Tax-loss harvesting into year end and thin
holiday trading volume deepened the selloff.

## Cloud backlog
Remaining performance obligations grew on large AI infrastructure contracts.

## Valuation
The stock trades at 25 times forward earnings.
""",
    "market-notes.md": """# Market notes

## Why stocks drop
A stock can fall sharply when the market turns against a crowded trade, when guidance disappoints or
when investors rotate out of a sector.

## Seasonality
Some months are historically stronger than others for equities.
""",
    "chipmaker.md": """# Chipmaker review

## Data center
Data center revenue doubled on accelerator demand.

## Gaming
Gaming sales were flat.
""",
}

# "what's the most I'm allowed to lose on one position": the risk rules answer it in other words;
# full text finds the chart and scanner notes, which happen to say "one position", "allowed", "lose"
# and "much" about something else
RISK = {
    "risk-rules.md": """# Risk rules

## Maximum loss per trade
The biggest loss permitted on any single trade is 1% of the account; the stop is placed so that a
stopped-out trade costs no more than that.

## Daily loss limit
Stop trading for the day after a 3% drawdown of the account.

## Portfolio heat
Total open risk across all trades stays under 6% of the account.

## Sizing a trade
Size every trade from its stop: the shares bought times the distance to the stop must not exceed the
1% risk budget.
""",
    "chart-settings.md": """# Chart settings

## Layout
Each chart keeps one position marker per symbol; how much of the layout you change is allowed to
persist, so you lose nothing when the window is resized.

## Colors
Candles use green and red; the background follows the theme.
""",
    "scanner-guide.md": """# Scanner guide

## Output
The scanner lists one position of each symbol at most and shows how much volume traded.

## Schedule
Scanners run every five minutes during market hours.
""",
}


def _corpus(kb, root: Path, files: dict[str, str]) -> None:
    (root / "notes").mkdir(parents=True)
    for name, text in files.items():
        (root / "notes" / name).write_text(text)
    report = kb.ingest([root], root=root)
    assert report.count("failed") == 0


def _units(kb, query: str, top_k: int = 6) -> list[str]:
    return [h.unit_id for h in kb.search(query, mode="hybrid", top_k=top_k).hits]


def test_a_documents_matching_sections_outrank_weak_matches_elsewhere(kb, tmp_path):
    # document evidence alone: pseudo-relevance feedback (on by default) moves the query towards this
    # small document's centroid, which its title-only `_intro` sits nearest (tests/test_search_feedback.py)
    kb.settings.search.feedback_weight = 0.0
    _corpus(kb, tmp_path / "corpus", MARGIN)
    units = _units(kb, "what happens after a margin call")
    assert units[0] == "notes/margin-calls.md#What triggers a margin call"
    rank = {u: n for n, u in enumerate(units)}
    for section in ("Deadline to respond", "Forced liquidation"):
        unit = f"notes/margin-calls.md#{section}"
        assert unit in rank, units  # the document's other sections make the first six
        for weak in ("notes/futures.md#Variation margin", "notes/account-types.md#Retirement accounts"):
            assert rank[unit] < rank.get(weak, 99), units


def test_a_rare_identifier_is_not_outvoted_by_generic_sections(kb, tmp_path):
    _corpus(kb, tmp_path / "corpus", GATEWAY)
    units = _units(kb, "what does error ERR_4417 mean")
    assert units[0] == "notes/gateway.md#Session expiry", units


def test_with_a_semantic_floor_a_weak_semantic_match_elsewhere_ranks_below_the_full_text_match_s_document(
        kb, tmp_path):
    # nothing is semantically close to the question (best cosine ~0.36); full text finds the vendor's
    # review by "december", "tax" and "harvesting". Divided by its own best (the default), the semantic
    # list lifts the chipmaker's section, which shares no word with the question, above one of the
    # review's sections; with `convex_semantic_floor` 0.5 it ranks below all four
    _corpus(kb, tmp_path / "corpus", DECEMBER)
    query, chip = "was the december slide about tax harvesting", "notes/chipmaker.md#Data center"
    assert SearchSettings().convex_semantic_floor == 0.0  # off by default (README, Retrieval)
    units = _units(kb, query, top_k=5)
    assert units[0] == "notes/database-vendor.md#Price action"
    # (since stub sections weigh half, the chipmaker's two-word `_intro` no longer lends its document
    # evidence, and the default already ranks the chip section last here)
    kb.settings.search.convex_semantic_floor = 0.5
    units = _units(kb, query, top_k=5)
    assert units[0] == "notes/database-vendor.md#Price action"
    review = [u for u in units if u.startswith("notes/database-vendor.md#")]
    assert len(review) == 4 and units.index(chip) > max(units.index(u) for u in review), units


def test_full_text_far_from_the_question_weighs_less_than_the_semantic_answer(kb, tmp_path):
    # full text's hits (the chart layout, the scanner output) sit at cosine 0.17 and 0.05 from the
    # question, the semantic list's first five (the risk rules) at 0.19-0.37: closeness 0.44, under
    # the default 0.5, and the semantic list's best (0.37) is at least the default 0.35
    _corpus(kb, tmp_path / "corpus", RISK)
    query, answer, chart = ("what's the most I'm allowed to lose on one position",
                            "notes/risk-rules.md#Maximum loss per trade", "notes/chart-settings.md#Layout")
    defaults = SearchSettings()
    assert (defaults.lexical_far_ratio, defaults.convex_alpha_far, defaults.lexical_far_min_cosine) == (0.5, 0.7, 0.35)
    result = kb.search(query, mode="hybrid", top_k=4)
    assert result.plan["lexical_closeness"] < 0.5
    assert [h.unit_id for h in result.hits][0] == answer, [h.unit_id for h in result.hits]
    # the full-text hits' cosines came from the vectors the process holds: the database's own
    space = kb.store.active_space()["space"]
    vector, ids = kb.provider.embed([query])[0], [h.chunk_id for h in result.hits]
    held = kb.store.held_similarities(vector, space, kb.settings.collection, ids)
    assert held.keys() == set(ids)
    for cid, cosine in kb.store.similarities(vector, space, ids).items():
        assert abs(held[cid] - cosine) < 1e-5
    kb.settings.search.lexical_far_ratio = 0  # off: the chart note's incidental words win
    assert _units(kb, query, top_k=4)[:2] == [chart, answer]
    # nothing counts as close when the semantic list's best is under the minimum: full text keeps its weight
    kb.settings.search.lexical_far_ratio, kb.settings.search.lexical_far_min_cosine = 0.5, 0.4
    assert _units(kb, query, top_k=4)[:2] == [chart, answer]


def test_full_text_keeps_its_weight_when_the_question_names_a_ticker(kb, tmp_path):
    # a named ticker's documents are preferred anyway and full text's words pick sections among them
    _corpus(kb, tmp_path / "corpus", {**RISK, "acme.yaml": "ticker: ACME\nthesis:\n  text: ACME sells chart software.\n"})
    result = kb.search("what's the most I'm allowed to lose on one ACME position", mode="hybrid", top_k=4)
    assert result.plan["tickers"] == ["ACME"] and result.plan["lexical_closeness"] is None
    assert kb.search("what's the most I'm allowed to lose on one position", mode="hybrid",
                     top_k=4).plan["lexical_closeness"] < 0.5


def test_full_text_close_to_the_question_keeps_its_weight(kb, tmp_path):
    # "drawdown" finds the section that answers: full text and the semantic list agree
    _corpus(kb, tmp_path / "corpus", RISK)
    result = kb.search("when do I stop trading after a drawdown", mode="hybrid", top_k=4)
    assert result.plan["lexical_closeness"] >= 0.5
    assert result.hits[0].unit_id == "notes/risk-rules.md#Daily loss limit"


def test_lexical_closeness_counts_unreached_chunks_at_the_semantic_list_s_last_cosine():
    semantic = [_hit("a", 0.6), _hit("b", 0.5), _hit("c", 0.2)]
    assert lexical_closeness(semantic, [_hit("a", 0.9)], n=2) == pytest.approx(0.6 / 0.55)
    # "z" was not in the semantic list: it counts at 0.2, the list's last cosine
    assert lexical_closeness(semantic, [_hit("z", 0.9), _hit("c", 0.5)], n=2) == pytest.approx(0.2 / 0.55)
    assert lexical_closeness(semantic, []) is None and lexical_closeness([], [_hit("a", 0.9)]) is None


def _hit(cid: str, score: float, path: str = "a.md", ticker: str | None = None) -> SearchHit:
    return SearchHit(chunk_id=cid, score=score, text="", doc_id=path, path=path, section=cid, section_path=cid,
                     unit_id=f"{path}#{cid}", doc_type="note", collection="c", ticker=ticker)


def test_boosted_hits_keep_their_margins_through_document_evidence():
    """A named (or linked) ticker's hits are boosted above 1 without being cut back to 1: cut, the
    strong single match `x` tied with the other document's middling sections and document evidence
    alone put them first. Scores come back in [0, 1] at the end, in the same order and ratios."""
    ranked = [_hit("x", 0.95, "a.md", "NVDA"), _hit("y1", 0.70, "b.md", "NVDA"), _hit("y2", 0.69, "b.md", "NVDA"),
              _hit("y3", 0.68, "b.md", "NVDA"), _hit("z", 0.90, "c.md")]
    boosted = boost(ranked, ["NVDA"], [], 0.5)
    assert [round(h.score, 3) for h in boosted[:2]] == [1.425, 1.05]
    fused = document_evidence(boosted, 3, 0.2)
    assert [h.chunk_id for h in fused] == ["x", "y1", "y2", "y3", "z"]
    before = [h.score for h in fused]
    scaled = rescale_to_one(fused)
    assert scaled[0].score == 1.0 and all(0 < h.score <= 1.0 for h in scaled)
    assert [h.score / scaled[0].score for h in scaled] == pytest.approx([b / before[0] for b in before])
    cosines = [_hit("a", 0.6), _hit("b", 0.4)]  # nothing above 1: semantic mode's cosines stay cosines
    assert [h.score for h in rescale_to_one(cosines)] == [0.6, 0.4]


def test_a_search_naming_a_ticker_tells_its_results_apart(corpus_kb):
    """The first result scores 1 and the others less, in order: a question naming a ticker once
    gave every one of its first results the score 1.0 (the boost was cut at 1)."""
    for query in ("NVDA bull case", "the GPU maker's data center revenue"):
        result = corpus_kb.search(query, mode="hybrid", top_k=8)
        scores = [h.score for h in result.hits]
        assert result.plan["tickers"] == ["NVDA"], result.plan
        assert scores[0] == 1.0 and scores == sorted(scores, reverse=True) and 0 < scores[-1] < 1.0, scores
        assert len(set(scores)) == len(scores), scores


def test_convex_weighs_margins_where_rrf_counts_votes():
    """Lexical finds `x` far ahead of the rest; semantic's scores are nearly flat. RRF lets `y`,
    middling in both lists, win; the convex combination keeps `x` first."""
    semantic = [_hit("y", 0.52), _hit("z", 0.51), _hit("w", 0.50), _hit("x", 0.49)]
    lexical = [_hit("x", 0.9), _hit("y", 0.3)]  # normalised raw/(1+raw): raw 9 vs 0.43
    assert rrf([Candidates("semantic", semantic), Candidates("lexical", lexical)])[0].chunk_id == "y"
    semantic = [_hit("y", 0.52), _hit("z", 0.51), _hit("w", 0.50), _hit("x", 0.49)]
    lexical = [_hit("x", 0.9), _hit("y", 0.3)]
    fused = convex([Candidates("semantic", semantic), Candidates("lexical", lexical)], 0.5)
    assert fused[0].chunk_id == "x" and 0 < fused[-1].score <= fused[0].score <= 1.0


@pytest.mark.parametrize("weight", [0.0, 0.2])
def test_document_evidence_lifts_only_documents_with_several_matches(weight):
    ranked = [_hit("a1", 0.9, "a.md"), _hit("b1", 0.5, "b.md"), _hit("a2", 0.45, "a.md"), _hit("a3", 0.44, "a.md")]
    order = [h.chunk_id for h in document_evidence(ranked, 3, weight)]
    assert order == (["a1", "b1", "a2", "a3"] if weight == 0 else ["a1", "a2", "a3", "b1"])


def test_a_semantic_floor_weighs_a_weak_semantic_list_less():
    """Nothing matches the question well semantically (best cosine 0.30): divided by its own best, the
    semantic list still counts in full and its first hit `y` wins; with a floor of 0.5 its scores count
    for what they are worth and full text's first hit `x` comes first. A list whose best reaches the
    floor is divided by its best, as without one."""
    def lists(first: float, second: float) -> list[Candidates]:
        return [Candidates("semantic", [_hit("y", first), _hit("x", second)]),
                Candidates("lexical", [_hit("x", 0.6), _hit("y", 0.5)])]  # raw 1.5 and 1.0
    assert [h.chunk_id for h in convex(lists(0.30, 0.18), 0.5)] == ["y", "x"]
    assert [h.chunk_id for h in convex(lists(0.30, 0.18), 0.5, semantic_floor=0.5)] == ["x", "y"]
    assert [h.chunk_id for h in convex(lists(0.60, 0.36), 0.5, semantic_floor=0.5)] == ["y", "x"]
