"""Retrieval over the whole shared corpus (corpus_kb): lexical, hybrid, filters in every mode,
routing, grouping, similar documents, context assembly, rerank and expansion stand-ins."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest
from chat_stub import ChatStub

from rag_lib.errors import NotFoundError, ValidationError
from rag_lib.models import SearchFilters

MODES = ("semantic", "lexical", "hybrid")
PFE = "tradegent/knowledge/analysis/stock/PFE_20250118T1400.yaml"
META = "tradegent/knowledge/analysis/stock/META_20260220T2115.yaml"

# Not tests of embedding: the shared corpus's vectors come from the cache (no model calls).
pytestmark = pytest.mark.warm_cache


def test_lexical_matches_exact_terms_and_syntax(corpus_kb):
    res = corpus_kb.search("RVOL thresholds", mode="lexical", top_k=5)
    assert res.hits and all("rvol" in h.text.lower() for h in res.hits[:3])
    assert res.hits[0].path.startswith("tradegent/knowledge/scanners/")
    assert 0 < res.hits[0].score < 1
    excluded = corpus_kb.search("RVOL -sustained", mode="lexical", top_k=20)
    assert excluded.hits and not any("sustained" in h.text.lower() for h in excluded.hits)
    phrase = corpus_kb.search('"relative volume"', mode="lexical", top_k=10)
    assert phrase.hits and all(re.search(r"relative[\W_]+volume", h.text, re.I) for h in phrase.hits)
    assert corpus_kb.search("qqqzzzxx", mode="lexical").hits == []


def test_document_frequencies_from_statistics_match_counting(corpus_kb):
    from rag_lib.search.lexical import TermStatistics, bm25_idf

    store = corpus_kb.store
    text = "NVDA earnings revenue guidance stop loss position sizing"
    lexemes = store.query_lexemes(text, "english")
    total = store.collection_generation("default")[1]
    store.refresh_statistics(force=True)  # element statistics for tsv: the common lexemes' frequencies
    _, found = TermStatistics().frequencies(store, "default", text, "")
    with store.db.connection() as conn:  # the exact answer, counted row by row
        counted = {lex: conn.execute("SELECT count(*) FROM rag_chunks WHERE collection = 'default' AND tsv @@ %s::tsquery",
                                     (f"'{lex}'",)).fetchone()[0] for lex in lexemes}
    assert found == {"english": [(lex, counted[lex]) for lex in lexemes]}  # ANALYZE samples every row of a table this size
    assert any(lex in store.element_statistics()[1]["english"] for lex in lexemes)  # some from ANALYZE's list
    rare, common = min(counted, key=counted.get), max(counted, key=counted.get)
    assert counted[rare] < counted[common] and bm25_idf(total, counted[rare]) > bm25_idf(total, counted[common])


def test_chunk_rows_keep_their_text_search_vectors_inline(corpus_kb):
    with corpus_kb.store.db.connection() as conn:
        out_of_line = conn.execute(
            "SELECT count(*) FROM rag_chunks WHERE pg_column_toast_chunk_id(tsv) IS NOT NULL"
            " OR pg_column_toast_chunk_id(tsv_simple) IS NOT NULL").fetchone()[0]
        options = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'rag_chunks'").fetchone()[0]
    assert out_of_line == 0 and "toast_tuple_target=8160" in options


def test_heading_weight_lifts_sections_whose_heading_the_query_names(corpus_kb):
    def headed(query: str) -> int:  # of the top 5, sections whose heading holds every query word
        hits = corpus_kb.search(query, mode="lexical", top_k=5).hits
        return sum(all(w in (h.metadata.get("section_title") or "").lower() for w in query.split()) for h in hits)

    plain = {q: headed(q) for q in ("risk management", "troubleshooting")}
    corpus_kb.settings.search.lexical_heading_weight = 5.0
    weighted = {q: headed(q) for q in plain}
    assert all(weighted[q] >= 4 for q in plain), weighted
    assert all(plain[q] < weighted[q] for q in plain), (plain, weighted)  # by default a heading word counts like any other


def test_equal_field_weights_score_like_one_field(corpus_kb):
    """Upgrading to the weighted columns (sql/020) changes no score at the default weights: the fields
    hold the words the one-field vectors held (the `[doc_type] [ticker] [section]` prefix and the text)."""
    from rag_lib.search.lexical import TermStatistics, plan_terms
    from rag_lib.store.lexical import tsquery_literal

    store = corpus_kb.store
    query = "NVDA stop loss risk management 145.50"
    planned = plan_terms(store, TermStatistics(), query, "default", 10_000)
    scored = store.lexical_search(planned.terms, SearchFilters(collection="default"), 20, match=planned.match)
    assert len(scored) == 20
    parts, params = [], []
    for config, pairs in planned.terms.items():
        for lex, weight in pairs:
            parts.append(f"{weight:.6f} * ts_rank(to_tsvector('{config}', embed_text), %s::tsquery, 1)")
            params.append(tsquery_literal(lex))
    with store.db.connection() as conn:
        one_field = dict(conn.execute(f"SELECT chunk_id, {' + '.join(parts)} FROM rag_chunks WHERE chunk_id = ANY(%s)",
                                      [*params, [h.chunk_id for h, _ in scored]]).fetchall())
    assert all(abs(raw - one_field[h.chunk_id]) < 1e-4 * max(1.0, raw) for h, raw in scored)


def test_global_question_keeps_the_answering_documents_sections_together(corpus_kb):
    """A question over a whole document ("every risk ... lists") wants its many sections; global
    questions no longer push a document's third and later units behind other documents' first two."""
    res = corpus_kb.search("summary of every risk the PFE analysis lists", mode="hybrid", top_k=10)
    assert res.plan["kind"] == "global"
    assert sum(h.path == PFE for h in res.hits) >= 5


@pytest.mark.parametrize("mode", MODES)
def test_filters_apply_in_every_mode(corpus_kb, mode):
    res = corpus_kb.search("stop loss and risk per trade", mode=mode, ticker="PFE", top_k=10)
    assert res.hits and {h.ticker for h in res.hits} == {"PFE"}
    res = corpus_kb.search("position size", mode=mode, doc_type="strategy", top_k=10)
    assert res.hits and {h.doc_type for h in res.hits} == {"strategy"}
    res = corpus_kb.search("position size", mode=mode, path="tradegent/knowledge/analysis/", top_k=10)
    assert res.hits and all(h.path.startswith("tradegent/knowledge/analysis/") for h in res.hits)


def test_hybrid_fuses_semantic_and_lexical(corpus_kb):
    q = "PFE support levels and RSI"
    sem = corpus_kb.search(q, mode="semantic", top_k=50, group=False)
    lex = corpus_kb.search(q, mode="lexical", top_k=50, group=False)
    hyb = corpus_kb.search(q, mode="hybrid", top_k=10)
    pool = {h.chunk_id for h in sem.hits} | {h.chunk_id for h in lex.hits}
    assert hyb.mode == "hybrid" and len(hyb.hits) == 10
    assert {h.chunk_id for h in hyb.hits} <= pool
    assert all(0 < h.score <= 1 for h in hyb.hits)
    assert [h.score for h in hyb.hits] == sorted((h.score for h in hyb.hits), reverse=True)
    assert set(hyb.timings_ms) >= {"embed", "semantic", "lexical", "total"}
    assert hyb.hits[0].excerpt and len(hyb.hits[0].excerpt) <= 240
    with pytest.raises(ValidationError, match="unknown search mode"):
        corpus_kb.search(q, mode="fuzzy")
    # a reversed date range matches nothing: said, not answered with an empty list
    with pytest.raises(ValidationError, match="date_from 2026-01-01 is after date_to 2025-01-01"):
        corpus_kb.search(q, mode="hybrid", date_from=dt.date(2026, 1, 1), date_to=dt.date(2025, 1, 1))
    same_day = corpus_kb.search(q, mode="hybrid", date_from=dt.date(2025, 1, 18), date_to=dt.date(2025, 1, 18))
    assert same_day.hits and all(h.doc_date == dt.date(2025, 1, 18) for h in same_day.hits)
    # an ISO string is a date too; a wrong value is named, not a database error
    assert [h.chunk_id for h in corpus_kb.search(q, mode="hybrid", date_from="2025-01-18", date_to="2025-01-18").hits] \
        == [h.chunk_id for h in same_day.hits]
    for bad, message in ((dict(date_from="soon"), "date_from 'soon' is not a date"),
                         (dict(date_to="2026-13-01"), "date_to '2026-13-01' is not a date"),
                         (dict(ticker=123), "ticker must be a string or a list of strings"),
                         (dict(min_similarity=5), "min_similarity must be a number between 0 and 1"),
                         (dict(top_k="3"), "top_k must be a whole number"),
                         (dict(doc_type=5), "doc_type must be a string or a list of strings"),
                         (dict(section=5), "section must be a string"), (dict(path=5), "path must be a string"),
                         (dict(tags="x"), "tags must be a mapping"), (dict(collection="../evil"), "collection '../evil' must be"),
                         (dict(semantic_weight=-1), "semantic_weight must be a number, 0 or more"),
                         (dict(rerank_depth=0), "rerank_depth must be a number, 1 or more")):
        with pytest.raises(ValidationError, match=message):
            corpus_kb.search(q, mode="hybrid", **bad)
    # what PostgreSQL or the tokenizer cannot take is said, not a database error (which lost the
    # process's other metric records with it)
    for text, message in (("nv\x00da", "query holds a NUL character"), ("nv\ud800da", "query holds an unpaired surrogate"),
                          (123, "query must be a string")):
        with pytest.raises(ValidationError, match=message):
            corpus_kb.search(text, mode="hybrid")


def test_results_grouped_by_unit(corpus_kb):
    grouped = corpus_kb.search("earnings trade entry and exit", mode="hybrid", top_k=20)
    units = [h.unit_id for h in grouped.hits]
    assert len(units) == len(set(units)) == 20
    assert all(h.unit_id == f"{h.path}#{h.section}" for h in grouped.hits)
    chunks = corpus_kb.search("earnings trade entry and exit", mode="hybrid", top_k=40, group=False)
    assert len({h.unit_id for h in chunks.hits}) < 40  # chunk level repeats units
    assert chunks.hits[0].unit_id == units[0]


def test_comparison_retrieves_for_each_ticker(corpus_kb):
    res = corpus_kb.search("PFE vs AMD: account risk per trade and stop distance", mode="hybrid", top_k=10)
    assert res.plan["kind"] == "comparison" and res.plan["tickers"] == ["PFE", "AMD"]
    assert {"PFE", "AMD"} <= {h.ticker for h in res.hits}


def test_trend_orders_by_date(corpus_kb):
    res = corpus_kb.search("how has the MSFT thesis evolved over time", mode="hybrid", top_k=10)
    assert res.plan["kind"] == "trend"
    dated = [h.doc_date for h in res.hits if h.doc_date]
    assert len(dated) >= 2 and dated == sorted(dated)
    # a question about the latest reads newest first (seed 004's time constraint "recent")
    res = corpus_kb.search("latest MSFT analysis", mode="hybrid", top_k=10)
    assert res.plan["kind"] == "trend"
    dated = [h.doc_date for h in res.hits if h.doc_date]
    assert len(set(dated)) >= 2 and dated == sorted(dated, reverse=True)
    # two analyses of 2026-02-21: the one written at 11:45 before the one of 11:30
    stock = "tradegent/knowledge/analysis/stock/"
    paths = list(dict.fromkeys(h.path for h in res.hits))
    assert paths.index(stock + "MSFT_20260221T1145.yaml") < paths.index(stock + "MSFT_20260221T1130.yaml")


def test_a_stub_section_does_not_lead_a_question_about_its_document(corpus_kb):
    """`post_mortem: prior analyses found: 0` is embedded as little more than its context prefix
    (`[stock-analysis] [META] [post mortem]`), and both META analyses' stubs used to come first."""
    res = corpus_kb.search("Two META analyses written 15 minutes apart on Feb 20 2026 reach different calls"
                           " - what changed between them?", mode="hybrid", top_k=10)
    first = [h.section for h in res.hits[:3]]
    assert "post_mortem" not in first and {"rationale", "recommendation"} & set(first)


def test_trend_date_order_covers_the_first_page_only(corpus_kb):
    """A request for 100 results (what `rag eval` asks) used to come back wholly in date order: the
    year's oldest loose matches first and Oracle's December analysis, the answer, past the first page."""
    query = "how has Oracle's RPO backlog evolved over time"
    res = corpus_kb.search(query, mode="hybrid", top_k=100)
    assert res.plan["kind"] == "trend" and len(res.hits) > 20
    page = corpus_kb.settings.search.top_k
    first = [h.doc_date for h in res.hits[:page] if h.doc_date]
    assert first == sorted(first)
    rest = [h.score for h in res.hits[page:]]
    assert rest == sorted(rest, reverse=True)  # past the page: rank order
    assert "tradegent/knowledge/analysis/stock/ORCL_20251217T1000.yaml" in {h.path for h in res.hits[:page]}


def test_time_filtered_context_reads_in_date_order_with_learnings_after(corpus_kb):
    """A trend question's hybrid context keeps its dated passages in date order (oldest first, or
    newest first for "the latest") and puts the learnings it adds after them under their own heading,
    not between two dated documents."""
    from rag_lib.graph.hybrid import LEARNING_TYPES, OUTSIDE_TIMELINE

    for query, newest_first in (("NVDA earnings trend over time", False), ("latest NVDA analysis", True)):
        for budget in (1500, 4000):
            out = corpus_kb.hybrid_context(query, token_budget=budget)
            assert out.route == "time-filtered" and out.tokens <= budget
            timeline, _, outside = out.markdown.partition(OUTSIDE_TIMELINE)
            assert outside, (query, budget)  # learnings are added, labelled
            cited = {c.ref: c for c in out.passages.citations}
            dated = [cited[ref] for ref in re.findall(r"^(\[\d+\]) ", timeline, re.M)]
            later = [cited[ref] for ref in re.findall(r"^(\[\d+\]) ", outside, re.M)]
            dates = [c.doc_date for c in dated]
            assert dated and None not in dates and dates == sorted(dates, reverse=newest_first), (query, dates)
            assert not any(c.doc_type in LEARNING_TYPES for c in dated)
            assert later and all(c.doc_type in LEARNING_TYPES or c.doc_date is None for c in later)


def test_time_filtered_context_keeps_the_best_passages_not_the_oldest(corpus_kb):
    """A trend question's context picked its passages in date order, so the oldest documents' least
    relevant sections (a ticker profile's company and metrics) filled the budget: "how has the NVDA
    thesis evolved over time" at 1,500 tokens left out the best-ranked passage (the earnings
    analysis's summary) and both documents of November 2025. Passages are picked best first and
    still read in date order."""
    from rag_lib.search.results import by_rank

    query = "how has the NVDA thesis evolved over time"
    out = corpus_kb.hybrid_context(query, token_budget=1500)
    assert out.route == "time-filtered"
    ranked = by_rank(corpus_kb.search(query, mode="hybrid", ticker=["NVDA"], top_k=25, group=False).hits)
    cited = [c for c in out.passages.citations if c.doc_type not in ("learning", "post-trade-review")]
    assert {h.chunk_id for h in ranked[:3]} <= {c.chunk_id for c in cited}
    dates = [c.doc_date for c in cited]
    assert dates == sorted(dates) and len(set(dates)) >= 4
    assert [h.chunk_id for h in out.vector_results] == [c.chunk_id for c in out.passages.citations]


def test_a_ticker_the_query_excludes_is_left_out_not_preferred(corpus_kb):
    """`rag search '"bull call spread" -NFLX' --mode hybrid` ranked NFLX's earnings analysis first: the
    excluded ticker counted as named (boosted; in semantic mode linked) while full text left it out."""
    for mode in ("semantic", "hybrid", "lexical"):
        res = corpus_kb.search('"bull call spread" -NFLX', mode=mode, top_k=10)
        assert res.hits and all(h.ticker != "NFLX" for h in res.hits), mode
        assert res.plan["tickers"] == [] and res.plan["excluded"] == ["NFLX"], mode


def test_ticker_hint_is_a_soft_boost(corpus_kb):
    # NVDA's own documents hold more than 30 sections about its earnings: look deep enough to see others
    res = corpus_kb.search("NVDA earnings reaction history", mode="hybrid", top_k=100)
    assert res.plan["tickers"] == ["NVDA"]
    assert res.hits[0].ticker == "NVDA" or "NVDA" in res.hits[0].path
    assert any(h.ticker != "NVDA" for h in res.hits)  # not a filter


def test_get_similar(corpus_kb):
    res = corpus_kb.get_similar(META, top_k=5)
    paths = [h.path for h in res.hits]
    assert paths and META not in paths and len(paths) == len(set(paths))
    assert res.hits[0].path == "tradegent/knowledge/analysis/stock/META_20260220T2130.yaml"  # its sibling
    by_unit = corpus_kb.get_similar(f"{PFE}#trade_selection", top_k=3)
    assert by_unit.hits and PFE not in [h.path for h in by_unit.hits]
    with pytest.raises(NotFoundError):
        corpus_kb.get_similar("no/such/file.yaml")


@pytest.mark.parametrize("budget", [300, 4000])
def test_build_context_budget_citations_and_quotes(corpus_kb, provider, budget):
    ctx = corpus_kb.build_context("what's the most I'm allowed to lose on one position", token_budget=budget)
    assert ctx.citations and provider.tokenizer().count(ctx.context) == ctx.tokens <= budget
    ids = [c.chunk_id for c in ctx.citations]
    assert len(ids) == len(set(ids))
    assert len({re.sub(r"\s+", " ", c.text) for c in ctx.citations}) == len(ctx.citations)
    for c in ctx.citations:
        assert f"{c.ref} {c.path} | § " in ctx.context and c.unit_id == f"{c.path}#{c.section}"
    first = ctx.citations[0]
    quote = first.text[len(first.text) // 3: len(first.text) // 3 + 40]
    assert ctx.verify(first.ref, quote) and ctx.verify(first.unit_id, quote)
    assert not ctx.verify(first.ref, "the most you may lose is 97.3% of the account")
    data = ctx.to_dict()
    assert json.dumps(data) and data["tokens"] <= budget
    if budget == 4000:
        assert ctx.tokens > 1000  # fills the budget with several passages


def test_reranker_stand_in_reorders(corpus_kb):
    calls = []

    class StandIn:  # the CrossEncoderReranker interface: one score per text
        def rerank(self, query, texts):
            calls.append((query, len(texts)))
            return [1.0 if "strategy" in t.lower() else 0.0 for t in texts]

    base = corpus_kb.search("position size by conviction", mode="hybrid", top_k=10)
    corpus_kb.reranker = StandIn()
    res = corpus_kb.search("position size by conviction", mode="hybrid", top_k=10)
    assert calls == [("position size by conviction", corpus_kb.settings.search.rerank_depth)]
    flags = ["strategy" in h.text.lower() for h in res.hits]
    assert flags == sorted(flags, reverse=True) and flags[0]
    assert [h.chunk_id for h in res.hits] != [h.chunk_id for h in base.hits] or all(flags)
    assert "rerank" in res.timings_ms


def test_query_expansion_through_local_chat_server(corpus_kb):
    with ChatStub(lambda system, user: "1. unusual volume RVOL scanner\n- RVOL") as stub:
        assert corpus_kb.search("qqqzzzxx", mode="lexical").hits == []
        s = corpus_kb.settings.search
        s.expansion_model, s.expansion_base_url = "stub-chat", stub.base_url
        corpus_kb.__dict__.pop("expander", None)
        assert corpus_kb.search("qqqzzzxx", mode="lexical", top_k=5).hits == []  # expansion only when asked
        assert stub.requests == []
        res = corpus_kb.search("qqqzzzxx", mode="lexical", top_k=5, expand=True)
        assert len(stub.requests) == 1
        assert res.hits and "rvol" in res.hits[0].text.lower()
        sent = stub.requests[-1]
        assert sent["model"] == "stub-chat" and sent["messages"][-1]["content"] == "qqqzzzxx"
        assert "expand" in res.timings_ms


def test_search_caches_belong_to_the_knowledge_base_and_clear_on_its_writes(kb, corpus_copy):
    """Searches reuse the tickers a collection knows and its term statistics (one lookup for several
    searches, not one per search), and the knowledge base's own ingest shows at once: a ticker it
    just ingested routes the next query."""
    from collections import Counter

    kb.ingest([corpus_copy("tradegent/knowledge/analysis/stock/AMD_20250122T0935.yaml")])
    calls: Counter[str] = Counter()
    for name in ("known_tickers", "collection_generation"):
        real = getattr(kb.store, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(kb.store, name, counted)  # the real query, counted
    for query in ("AMD data center revenue", "what is the bear case", "AMD gross margin"):
        assert kb.search(query, mode="hybrid").hits
    assert calls == {"known_tickers": 1, "collection_generation": 1}
    assert kb.classify_query("is PFE a buy").tickers == []
    kb.ingest([corpus_copy(PFE)])
    assert kb.classify_query("is PFE a buy").tickers == ["PFE"]
    kb.reset()
    assert kb.classify_query("is PFE a buy").tickers == []


def test_a_search_that_finds_nothing_says_which_filter_matched_no_document(corpus_kb):
    """An empty answer from a mistyped filter reads as "nothing about that": `SearchResult.note` says
    which filter matches none of the collection's documents and what the collection holds."""
    def note(**filters):
        result = corpus_kb.search("earnings", mode="hybrid", **filters)
        assert result.hits == [] and result.to_dict()["note"] == result.note
        return result.note

    typed = note(doc_type="stock-analyses")
    assert typed.startswith("in collection 'default': no document of type stock-analyses (did you mean stock-analysis")
    assert "its types: earnings-analysis (3)" in typed and "stock-analysis (11)" in typed
    assert note(ticker="NVDX") == "in collection 'default': no document with ticker NVDX (did you mean NVDA?)"
    assert note(ticker="ZZZZ") == "in collection 'default': no document with ticker ZZZZ"
    assert note(date_from=dt.date(2031, 1, 1)) == ("in collection 'default': no document dated on or after "
                                                   "2031-01-01 (its documents are dated 2025-01-10 to 2026-02-21)")
    assert "did you mean tradegent/knowledge/" in note(path="tradegent/knowlege/")
    assert note(section_contains="zzqq") == "in collection 'default': no section path contains 'zzqq'"
    both = note(ticker="NVDX", date_to=dt.date(2001, 1, 1))  # every filter that matches nothing is named
    assert "ticker NVDX" in both and "dated on or before 2001-01-01" in both
    assert note(ticker="NVDA", doc_type="scanner-config") == (
        "in collection 'default', each filter matches documents, but no document matches all of them")
    assert note(min_similarity=0.99) == "no result is as similar to the question as min_similarity 0.99 asks"
    assert note(collection="nope").startswith("collection 'nope' holds no documents; these do: default (")
    assert corpus_kb.search("earnings", mode="hybrid", ticker="NVDA").note is None  # found: nothing to explain


def test_similar_to_a_mistyped_path_offers_the_stored_one(corpus_kb):
    typed = "tradegent/knowlege/trades/2025/01/NVDA_20250115T1000.yaml"
    with pytest.raises(NotFoundError, match=r"did you mean tradegent/knowledge/trades/2025/01/NVDA_20250115T1000\.yaml\?"):
        corpus_kb.get_similar(typed)
    with pytest.raises(NotFoundError) as nothing:
        corpus_kb.get_similar("zzqq-nothing")
    assert "did you mean" not in str(nothing.value)
