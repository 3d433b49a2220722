"""Lexical retrieval: Postgres full text with BM25-style IDF weights. Natural-language queries match
any term (OR) and rank by weighted term ranks; tickers, ids and numbers also match exactly through
the `simple` configuration. Queries written in web-search syntax ("phrase", -word, OR) keep it."""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from rag_lib.models import SearchFilters, SearchHit

_WEB_SYNTAX = re.compile(r'"|(^|\s)-\w|\sOR\s')
# Tokens that must match as written: tickers (NVDA), ids/files (NVDA_20250120T0900.yaml), numbers (145.50).
_EXACT = re.compile(r"\b(?:[A-Z]{2,6}|[\w.\-/]*\d[\w.\-/]*|\w+_\w+(?:\.\w+)?)\b")
GENERATION_TTL = 5.0  # seconds between checks that the collection changed (term statistics cache)
QUERY_TERMS_CACHED = 1024  # per collection: query texts whose lexemes and frequencies are kept


def is_websearch(query: str) -> bool:
    return bool(_WEB_SYNTAX.search(query))


def exact_tokens(query: str) -> list[str]:
    return [m.group(0) for m in _EXACT.finditer(query)]


def bm25_idf(n: int, df: int) -> float:
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


@dataclass
class _Stats:
    generation: tuple[int, int, str, str] | None = None
    checked: float = 0.0
    total: int = 0
    common: dict[str, dict[str, float]] = field(default_factory=dict)  # {config: {lexeme: share of chunks}}
    # (english text, simple text) -> the store's `query_terms` for them: a repeated question (a page
    # refreshed, an agent's retry, the same words in another filter) skips the round trip
    queries: OrderedDict[tuple[str, str], dict[str, list[tuple[str, int]]]] = field(default_factory=OrderedDict)


class TermStatistics:
    """Per collection: its size and ANALYZE's most common lexemes, cached until the collection
    changes or ANALYZE runs again (checked every `GENERATION_TTL` seconds); the other lexemes'
    document frequencies come with the query's lexemes (rag_lexeme_frequencies), one round trip."""

    def __init__(self) -> None:
        self._by_collection: dict[str | None, _Stats] = {}
        self._lock = threading.RLock()

    def clear(self) -> None:
        """Forget every collection's statistics (after this process changed or dropped the data)."""
        with self._lock:
            self._by_collection.clear()

    def _current(self, store, collection: str | None) -> tuple[int, dict[str, dict[str, float]]]:
        with self._lock:
            stats = self._by_collection.setdefault(collection, _Stats())
            now = time.monotonic()
            if now - stats.checked <= GENERATION_TTL:
                return stats.total, stats.common
            if stats.generation is None:  # nothing cached to go on with: the others wait for this
                self._check(store, collection, stats)
                stats.checked = now
                return stats.total, stats.common
            stats.checked = now  # this thread checks; the others go on with what is cached
        # outside the lock: at 1M chunks a check takes ~70 ms (summing 100k documents' rows), which
        # every concurrent search's full-text planning waited for, every 5 s
        self._check(store, collection, stats)
        with self._lock:
            return stats.total, stats.common

    def _check(self, store, collection: str | None, stats: _Stats) -> None:
        """Read the collection's state; on a change, its size and ANALYZE's common lexemes."""
        generation = store.collection_generation(collection)
        if generation != stats.generation:
            counted, elements = store.element_statistics()
            # ANALYZE's shares are of the whole table: they stand for a collection that is (nearly) all of it
            common = elements if generation[1] >= 0.9 * counted else {}
            with self._lock:  # re-entrant: the first check holds it already
                stats.generation, stats.total, stats.common = generation, generation[1], common
                stats.queries.clear()  # the frequencies changed with the collection

    def frequencies(self, store, collection: str | None, english: str, simple: str,
                    cap: int | None = None) -> tuple[int, dict[str, list[tuple[str, int]]]]:
        """(chunks in collection, {config: [(lexeme, document frequency)]}): the lexemes of `english`
        and `simple` (see `store.query_terms`) in query order. ANALYZE's most common lexemes take
        their share of the collection (as they always have: the rankings stay what they were); the
        others' stored frequency is cut at `cap` when given (see `plan_terms`)."""
        total, common = self._current(store, collection)
        found = self._query_terms(store, collection, english, simple)
        out = {}
        for config, pairs in found.items():
            shares = common.get(config, {})
            out[config] = [(lex, round(shares[lex] * total) if lex in shares else n if cap is None else min(n, cap))
                           for lex, n in pairs]
        return total, out

    def _query_terms(self, store, collection: str | None, english: str,
                     simple: str) -> dict[str, list[tuple[str, int]]]:
        """The store's `query_terms`, kept per collection until it changes (`_check`)."""
        key = (english, simple)
        with self._lock:
            stats = self._by_collection.setdefault(collection, _Stats())
            found, generation = stats.queries.get(key), stats.generation
            if found is not None:
                stats.queries.move_to_end(key)
                return found
        found = store.query_terms(collection, english, simple)
        with self._lock:
            if stats.generation == generation:  # not read across a change of the collection
                stats.queries[key] = found
                while len(stats.queries) > QUERY_TERMS_CACHED:
                    stats.queries.popitem(last=False)
        return found


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
    total, found = stats.frequencies(store, collection, query, " ".join(exact_tokens(query)), cap=max_candidates + 1)
    return choose_terms(found, total, max_candidates, scaled)


def choose_terms(found: dict[str, list[tuple[str, int]]], total: int, max_candidates: int,
                 scaled: dict[str, float] | None = None) -> LexicalQuery:
    """The lexical query of `plan_terms` from each config's lexemes and their document frequencies
    in a collection of `total` chunks. A df of 0 may be stale (published since the last check): such
    a term is kept, at the highest weight."""
    n = max(total, 1)
    terms = {config: [(lex, bm25_idf(n, df) * (scaled or {}).get(lex, 1.0)) for lex, df in pairs]
             for config, pairs in found.items()}
    by_rarity = [(df, config, lex) for config, pairs in found.items() for lex, df in pairs]
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
