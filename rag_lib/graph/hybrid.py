"""Hybrid context: vector/full-text passages and knowledge-graph facts combined for an analyst or an
agent, routed by the query's class (seed 004's `get_hybrid_context_adaptive`; seed 000 asks for vector
hits plus the ticker's graph facts in one prompt, §4.3, and that context before each new analysis, §5.3)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rag_lib.errors import NotFoundError, ValidationError, close_matches, did_you_mean
from rag_lib.graph.queries import context_markdown, ticker_context
from rag_lib.documents import type_spellings
from rag_lib.models import SearchFilters, SearchHit
from rag_lib.search.context import ContextResult, assemble
from rag_lib.search.results import by_rank, date_key, first_by
from rag_lib.search.retrieval import SearchOptions, link_query, plan_query

ANALYSIS_TYPES = ("stock-analysis", "earnings-analysis", "research", "ticker-profile")
LEARNING_TYPES = ("learning", "post-trade-review")
GRAPH_SHARE = 0.35  # most of the budget goes to passages; graph facts are terse
# Under a time-filtered context's dated passages: what has no place in their order
OUTSIDE_TIMELINE = "## Outside the timeline: learnings and undated passages"
_YEAR = re.compile(r"\b(since|from|after|in|during)\s+(20\d\d)\b", re.I)


@dataclass
class HybridContext:
    """Passages with citations, the graph facts used, and markdown within `token_budget` tokens."""

    query: str
    kind: str  # the query class that chose the route
    route: str  # graph-first | per-ticker | time-filtered | hybrid | analysis
    tickers: list[str]
    related_tickers: list[str]
    passages: ContextResult
    graph: list[dict[str, Any]] = field(default_factory=list)  # one ticker context per ticker
    markdown: str = ""
    tokens: int = 0
    token_budget: int = 0
    vector_results: list[SearchHit] = field(default_factory=list)  # the hits whose passages were kept
    note: str | None = None  # why the context is thin: a ticker no document has, a budget no passage fits

    # seed 004's HybridContext names: ticker, vector_results (above), graph_context, formatted
    @property
    def ticker(self) -> str | None:
        return self.tickers[0] if self.tickers else None

    @property
    def graph_context(self) -> dict[str, Any]:
        """The graph context of the ticker asked about (seed 004 keeps one ticker's)."""
        return self.graph[0] if self.graph else {}

    @property
    def formatted(self) -> str:
        return self.markdown

    def __str__(self) -> str:  # seed 000's get_hybrid_context returns the prompt text
        return self.markdown

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query, "kind": self.kind, "route": self.route, "tickers": self.tickers,
            "related_tickers": self.related_tickers,
            "hits": [c.to_dict() for c in self.passages.citations],
            "graph": self.graph, "markdown": self.markdown, "tokens": self.tokens, "token_budget": self.token_budget,
            "ticker": self.ticker, "vector_results": [h.to_dict() for h in self.vector_results],
            "graph_context": self.graph_context, "formatted": self.formatted, "note": self.note,
        }


def _dedupe(hits: list[SearchHit]) -> list[SearchHit]:
    return first_by(hits, lambda h: h.chunk_id)


def _interleave(lists: list[list[SearchHit]]) -> list[SearchHit]:
    out: list[SearchHit] = []
    for rank in range(max((len(x) for x in lists), default=0)):
        out.extend(x[rank] for x in lists if rank < len(x))
    return out


def _graph_contexts(kb, collection: str, tickers: list[str]) -> list[dict[str, Any]]:
    out = []
    for t in tickers:
        try:
            out.append(ticker_context(kb.store, collection, t))
        except NotFoundError:
            continue  # a ticker the corpus names but no document is about
    return out


def _time_filter(query: str) -> dict[str, Any]:
    if m := _YEAR.search(query):
        year = int(m.group(2))
        if m.group(1).lower() in ("in", "during"):
            return {"date_from": dt.date(year, 1, 1), "date_to": dt.date(year, 12, 31)}
        return {"date_from": dt.date(year, 1, 1)}
    return {}


def _render(kb, query: str, kind: str, route: str, tickers: list[str], related: list[str], hits: list[SearchHit],
            graph: list[dict[str, Any]], token_budget: int,
            after: Callable[[SearchHit], bool] | None = None,
            doc_order: Callable[[SearchHit], Any] | None = None) -> HybridContext:
    """Graph facts first (at most a share of the budget), then the best passages in what is left,
    their documents in `doc_order` when given; passages `after` accepts go last, under `OUTSIDE_TIMELINE`."""
    store, provider = kb.search_context()
    count = provider.tokenizer().count
    graph_md = ""
    if graph:
        lines = "\n\n".join(context_markdown(g) for g in graph).splitlines()
        cap = int(token_budget * GRAPH_SHARE)
        while lines and count("## Knowledge graph\n\n" + "\n".join(lines)) > cap:
            lines.pop()
        graph_md = "## Knowledge graph\n\n" + "\n".join(lines) if lines else ""
    heading = "## Passages\n\n"
    used = count(graph_md + "\n\n" + heading) + 2 if graph_md else count(heading) + 1
    positions = store.chunk_positions([h.chunk_id for h in hits])
    available = max(0, token_budget - used)
    while True:
        passages = assemble(query, route, hits, count, available, positions, after,
                            OUTSIDE_TIMELINE if after is not None else "", doc_order)
        parts = [p for p in (graph_md, heading + passages.context if passages.context else "") if p]
        markdown = "\n\n".join(parts)
        tokens = count(markdown) if markdown else 0
        if tokens <= token_budget or available == 0:  # joins can shift a token or two: retry tighter
            break
        available = max(0, available - (tokens - token_budget) - 4)
    cited = {c.chunk_id: n for n, c in enumerate(passages.citations)}
    return HybridContext(query, kind, route, tickers, related, passages, graph, markdown, tokens, token_budget,
                         sorted((h for h in hits if h.chunk_id in cited), key=lambda h: cited[h.chunk_id]))


def hybrid_context(kb, query: str, ticker: str | None = None, token_budget: int = 4000,
                   collection: str | None = None, analysis_type: str | None = None,
                   exclude_doc_id: str | None = None) -> HybridContext:
    """Context for `query` routed by its class: relationship → graph first (related tickers, then search
    across them); comparison → one list per ticker; trend → time filter, oldest first (the latest:
    newest first); else hybrid search. Relevant learnings are always added (on the time-filtered
    route after the dated passages, under `OUTSIDE_TIMELINE`, with any undated passage). `analysis_type` limits the passages (not the
    learnings) to one document type; `exclude_doc_id` leaves a document out (seed 004: the analysis
    being written)."""
    if not query or not query.strip():
        raise ValidationError("query is empty; pass a question to build context for")
    if token_budget < 64:
        raise ValidationError(f"token_budget must be at least 64, got {token_budget}")
    collection = kb._collection(collection)
    plan = plan_query(kb.store, query, collection, kb.search_caches)
    space = kb.store.active_space()
    if not plan.tickers and not ticker and space:  # a described company ("the GPU maker") counts as named
        opts = SearchOptions.from_settings(kb.settings)
        plan = link_query(kb.store, plan, kb.provider.embed([query])[0], space["space"], collection, opts,
                          kb.search_caches)
    tickers = list(dict.fromkeys(([ticker.upper()] if ticker else []) + plan.tickers))
    depth = max(20, min(100, token_budget // 60))
    related: list[str] = []

    def search(q: str, **kw: Any) -> list[SearchHit]:
        return kb.search(q, mode="hybrid", collection=collection, top_k=depth, group=False,
                         doc_type=analysis_type, **kw).hits

    if plan.kind == "relationship" and tickers:
        route = "graph-first"
        graph = _graph_contexts(kb, collection, tickers)
        for g in graph:
            related += [p["ticker"] for p in g["peers"] if p["ticker"] not in tickers and p["ticker"] not in related]
        hits = search(query, ticker=tickers + related[:3])
    elif plan.kind == "comparison" and len(tickers) >= 2:
        route = "per-ticker"
        graph = _graph_contexts(kb, collection, tickers)
        hits = _interleave([search(query, ticker=t) for t in tickers])
    elif plan.kind == "trend":
        route = "time-filtered"
        graph = _graph_contexts(kb, collection, tickers[:1])
        # passages are picked best first and read in date order: picked in date order, the oldest
        # documents' least relevant sections filled the budget and the newest were left out
        hits = by_rank(search(query, ticker=tickers or None, **_time_filter(query)))
    else:
        route = "hybrid"
        graph = _graph_contexts(kb, collection, tickers[:1])
        hits = search(query, ticker=tickers[:1] or None)
    learnings = kb.search(query, mode="hybrid", collection=collection, doc_type=list(LEARNING_TYPES), top_k=2).hits
    # Learnings are picked after the first three passages so a tight budget still keeps one (after six,
    # six full sections could fill 1,500 tokens).
    after = order = None
    if route == "time-filtered":  # ...but read after the dated passages, whose order is the point
        timeline = {h.chunk_id for h in hits if h.doc_date is not None}
        after = lambda h: h.chunk_id not in timeline  # noqa: E731
        order = date_key(newest_first=plan.recent)
    hits = [h for h in _dedupe(hits[:3] + learnings + hits[3:]) if not exclude_doc_id or h.doc_id != exclude_doc_id]
    out = _render(kb, query, plan.kind, route, tickers, related, hits, graph, token_budget, after, order)
    out.note = _thin_context_note(kb, collection, ticker, hits, out, analysis_type)
    return out


def _thin_context_note(kb, collection: str, ticker: str | None, hits: list[SearchHit], out: HybridContext,
                       analysis_type: str | None = None) -> str | None:
    """One line on why a context holds less than asked for (None when nothing explains it)."""
    notes = []
    if analysis_type and (typed := kb.no_results_note(SearchFilters(collection=collection,
                                                                      doc_type=type_spellings(analysis_type)))):
        notes.append(f"{typed}; only learnings were added")
    known = kb.search_caches.known_tickers(kb.store, collection)
    if ticker and ticker.upper() not in known:
        notes.append(f"no document of collection '{collection}' has ticker {ticker.upper()}"
                     f"{did_you_mean(close_matches([ticker.upper()], sorted(known)))}; its passages were left out")
    if not hits:
        notes.append(kb.empty_collection_note(collection) or "no passage matched the question")
    elif not out.passages.citations:
        notes.append(f"no passage fits within token_budget {out.token_budget}; raise it")
    return "; ".join(notes) or None


def get_similar_analyses(kb, ticker: str, analysis_type: str | None = None, top_k: int = 5,
                         collection: str | None = None) -> list[SearchHit]:
    """Past analyses of `ticker` (of `analysis_type`, default any analysis type), one hit per document."""
    if not ticker or not ticker.strip():
        raise ValidationError("ticker is empty")
    types = [analysis_type] if analysis_type else list(ANALYSIS_TYPES)
    query = f"{ticker.upper()} {analysis_type or 'analysis'} thesis catalysts risks"
    hits = kb.search(query, mode="hybrid", collection=collection, ticker=ticker.upper(), doc_type=types,
                     top_k=max(top_k * 4, 20)).hits
    out, seen = [], set()
    for h in hits:
        if h.path not in seen:
            seen.add(h.path)
            out.append(h)
    return out[:top_k]


def build_analysis_context(kb, ticker: str, analysis_type: str = "stock-analysis", token_budget: int = 4000,
                           collection: str | None = None) -> HybridContext:
    """Context before a new analysis (seed 000 §5.3): the ticker's past analyses, peers' analyses,
    learnings and biases, and the ticker's graph context."""
    collection = kb._collection(collection)
    ticker = ticker.upper()
    graph = _graph_contexts(kb, collection, [ticker])
    peers = [p["ticker"] for g in graph for p in g["peers"]][:5]
    query = f"{ticker} {analysis_type} thesis catalysts risks"
    past = kb.search(query, mode="hybrid", collection=collection, ticker=ticker, top_k=6, group=False).hits
    peer_hits = kb.search(f"{analysis_type} thesis catalysts", mode="hybrid", collection=collection, ticker=peers,
                          top_k=4, group=False).hits if peers else []
    learnings = kb.search(f"{ticker} lessons bias mistakes", mode="hybrid", collection=collection,
                          doc_type=list(LEARNING_TYPES), top_k=3, group=False).hits
    hits = _dedupe(_interleave([past, peer_hits, learnings]))
    return _render(kb, query, "analysis", "analysis", [ticker], peers, hits, graph, token_budget)
