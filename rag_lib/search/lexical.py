"""Lexical retrieval: Postgres full text with BM25-style IDF weights. Natural-language queries match
any term (OR) and rank by weighted term ranks; tickers, ids and numbers also match exactly through
the `simple` configuration. Queries written in web-search syntax ("phrase", -word, OR) keep it."""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, field

from rag_lib.models import SearchFilters, SearchHit

_WEB_SYNTAX = re.compile(r'"|(^|\s)-\w|\sOR\s')
# Tokens that must match as written: tickers (NVDA), ids/files (NVDA_20250120T0900.yaml), numbers (145.50).
_EXACT = re.compile(r"\b(?:[A-Z]{2,6}|[\w.\-/]*\d[\w.\-/]*|\w+_\w+(?:\.\w+)?)\b")
GENERATION_TTL = 5.0  # seconds between checks that the collection changed (term statistics cache)


def is_websearch(query: str) -> bool:
    return bool(_WEB_SYNTAX.search(query))


def exact_tokens(query: str) -> list[str]:
    return [m.group(0) for m in _EXACT.finditer(query)]


def bm25_idf(n: int, df: int) -> float:
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


@dataclass
class _Stats:
    generation: tuple[int, int, str] | None = None
    checked: float = 0.0
    total: int = 0
    df: dict[tuple[str, str], int] = field(default_factory=dict)


class TermStatistics:
    """Per-collection document frequencies, cached and dropped when the collection changes."""

    def __init__(self) -> None:
        self._by_collection: dict[str | None, _Stats] = {}
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget every collection's statistics (after this process changed or dropped the data)."""
        with self._lock:
            self._by_collection.clear()

    def weights_many(self, store, collection: str | None, wanted: dict[str, list[str]],
                     cap: int | None = None) -> tuple[int, dict[str, dict[str, tuple[float, int]]]]:
        """(chunks in collection, {config: {lexeme: (IDF, document frequency)}}); a frequency read
        is exact up to `cap` (see `plan_terms`). The lexemes not cached yet are read in one round trip."""
        with self._lock:
            stats = self._by_collection.setdefault(collection, _Stats())
            now = time.monotonic()
            if now - stats.checked > GENERATION_TTL:
                generation = store.collection_generation(collection)
                if generation != stats.generation:
                    stats.generation, stats.df, stats.total = generation, {}, generation[1]
                stats.checked = now
            missing = {config: [lex for lex in lexemes if (config, lex) not in stats.df]
                       for config, lexemes in wanted.items()}
            if any(missing.values()):
                counts = store.term_statistics_many(collection, missing, stats.total, cap)
                stats.df.update({(config, lex): n for config, found in counts.items() for lex, n in found.items()})
            total = max(stats.total, 1)
            # df 0 may be stale (published since the last check): keep such a term, at the highest weight
            return stats.total, {config: {lex: (bm25_idf(total, stats.df[(config, lex)]), stats.df[(config, lex)])
                                          for lex in lexemes} for config, lexemes in wanted.items()}


@dataclass
class LexicalQuery:
    """Weighted lexemes per configuration, and the subset that selects candidate rows."""

    terms: dict[str, list[tuple[str, float]]]
    match: dict[str, list[str]]
    conjunctive: bool = False  # candidates hold every `match` lexeme of a config, not any


def plan_terms(store, stats: TermStatistics, query: str, collection: str | None, max_candidates: int,
               scaled: dict[str, float] | None = None) -> LexicalQuery:
    """All query lexemes score; the rarest select candidates until their document frequencies add up
    to `max_candidates` (max-score style pruning: rows holding only common terms rank low anyway).
    When even the rarest term is that common (a query of common words only), candidates are the rows
    holding all the terms, which rank highest; the store caps them at `max_candidates` either way.
    So a lexeme's frequency is only counted up to `max_candidates` + 1 rows, all that choice needs:
    a cold query at 1M chunks counted every row of its mid-frequency terms (57/270 ms p50/p95). Such
    a lexeme's IDF is then that of `max_candidates` + 1 rows, a little high; lexemes in ANALYZE's
    most-common list keep their share, and collections of up to that many chunks are counted exactly."""
    english, simple = store.query_lexemes_pair(query, " ".join(exact_tokens(query)))
    terms: dict[str, list[tuple[str, float]]] = {}
    by_rarity: list[tuple[int, str, str]] = []
    wanted = {config: lexemes for config, lexemes in (("english", english), ("simple", simple)) if lexemes}
    _, weights = stats.weights_many(store, collection, wanted, cap=max_candidates + 1)
    for config, lexemes in wanted.items():
        info = weights[config]
        terms[config] = [(lex, info[lex][0] * (scaled or {}).get(lex, 1.0)) for lex in lexemes]
        by_rarity += [(info[lex][1], config, lex) for lex in lexemes]
    match: dict[str, list[str]] = {}
    ranked = sorted(by_rarity)
    if len(ranked) > 1 and ranked[0][0] > max_candidates:
        for _, config, lex in ranked:
            match.setdefault(config, []).append(lex)
        return LexicalQuery(terms, match, conjunctive=True)
    budget = 0
    for df, config, lex in ranked:
        if match and budget + df > max_candidates:
            break
        match.setdefault(config, []).append(lex)
        budget += df
    return LexicalQuery(terms, match)


def lexical_search(store, stats: TermStatistics, query: str, filters: SearchFilters, limit: int,
                   timings: dict[str, float] | None = None,
                   scaled: dict[str, float] | None = None) -> list[tuple[SearchHit, float]]:
    """Chunks with their raw lexical scores, best first. `timings` gets the ms spent planning the
    terms (lexemes and their statistics) under `lexical_terms`. `scaled` multiplies the IDF weight
    of the lexemes it names (hybrid search's named tickers)."""
    cap = store.settings.search.lexical_max_candidates
    if is_websearch(query):
        return store.lexical_search({}, filters, limit, websearch=query, max_candidates=cap)
    t0 = time.perf_counter()
    planned = plan_terms(store, stats, query, filters.collection, cap, scaled)
    if timings is not None:
        timings["lexical_terms"] = round(timings.get("lexical_terms", 0.0) + (time.perf_counter() - t0) * 1000, 2)
    return store.lexical_search(planned.terms, filters, limit, match=planned.match,
                                conjunctive=planned.conjunctive, max_candidates=cap)


def normalise(score: float) -> float:
    """Raw lexical scores are unbounded; map them monotonically into [0, 1)."""
    return score / (1.0 + score) if score > 0 else 0.0
