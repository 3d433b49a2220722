"""One search: classify the query, gather semantic and/or lexical candidate lists (per ticker for
comparisons, per expansion when configured), fuse them, boost, rerank, group by unit."""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rag_lib.embedding import EmbeddingProvider
from rag_lib.documents import normalise_type
from rag_lib.flatten import load_mapping
from rag_lib.errors import ValidationError, text_problem
from rag_lib.models import SearchFilters, SearchHit, SearchResult, is_number, is_text_or_texts
from rag_lib.search import lexical
from rag_lib.graph import profiles
from rag_lib.search.classify import (DOC_TYPE_HINTS, DocumentNames, QueryPlan, classify, find_named_documents,
                                     without_date)
from rag_lib.search.fusion import (Candidates, boost, convex, date_boost, document_boost, document_evidence,
                                   graph_candidates, lexical_closeness, rescale_to_one, rrf, weigh_descriptors,
                                   weigh_stubs)
from rag_lib.search.rerank import QueryExpander, Reranker
from rag_lib.search.results import by_date, cover_named, excerpt, group_by_unit

MODES = ("semantic", "lexical", "hybrid")
CLOSENESS_CHUNKS = 5  # full text's and the semantic list's first chunks compared (search.lexical_far_ratio)
_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="rag-lexical")


@dataclass
class SearchOptions:
    """Knobs of hybrid retrieval (defaults from `settings.search`)."""

    rrf_k: int = 60
    candidate_depth: int = 50
    semantic_weight: float = 1.0
    lexical_weight: float = 1.0
    hint_boost: float = 0.15
    routing: bool = True
    rerank_depth: int = 30
    graph_fusion: bool = True
    graph_weight: float = 0.25
    graph_seeds: int = 10
    graph_candidates: int = 20
    entity_linking: bool = True
    link_threshold: float = 0.2
    link_margin: float = 0.1
    link_max: int = 1
    link_boost: float = 0.5
    document_weight: float = 0.2
    document_units: int = 3
    fusion: str = "convex"
    convex_alpha: float = 0.5
    convex_semantic_floor: float = 0.0
    lexical_far_ratio: float = 0.5
    convex_alpha_far: float = 0.7
    lexical_far_min_cosine: float = 0.35
    descriptor_weight: float = 1.0
    descriptor_weight_other: float = 0.4
    stub_words: int = 5
    stub_weight: float = 0.5
    feedback_weight: float = 0.8
    feedback_depth: int = 4
    feedback_scope: str = "shared"
    feedback_pool: int = 4
    feedback_walk_again: bool = False
    lexical_named_ticker_weight: float = 0.1
    lexical_drop_dates: bool = True
    aspect_window: int = 5
    named_documents: bool = True
    type_list_weight: float = 0.5
    top_k: int = 10  # the page a reader sees: a trend question's read in date order
    descriptors: frozenset[str] = frozenset()  # descriptor section names (the sections file's)

    @classmethod
    def from_settings(cls, settings) -> SearchOptions:
        s = settings.search
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{n: getattr(s, n) for n in names if hasattr(s, n)},
                   descriptors=load_mapping(Path(settings.sections_file)).descriptor_names)


class QueryVectors:
    """The vectors of recent query texts per embedding space, least recently used dropped first:
    a repeated query (a refreshed page, a popular question, an agent's retry) skips the model."""

    def __init__(self, size: int):
        self.size = size
        self._vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def embed(self, provider: EmbeddingProvider, texts: list[str]) -> np.ndarray:
        keys = [(provider.space, t) for t in texts]
        with self._lock:
            known = {k: self._vectors[k] for k in keys if k in self._vectors}
            for k in known:
                self._vectors.move_to_end(k)
        missing = [k[1] for k in keys if k not in known]
        if missing:
            fresh = dict(zip(missing, provider.embed(missing)))
            with self._lock:
                for text, vec in fresh.items():
                    self._vectors[(provider.space, text)] = vec
                while len(self._vectors) > self.size:
                    self._vectors.popitem(last=False)
            known.update({(provider.space, t): v for t, v in fresh.items()})
        return np.stack([known[k] for k in keys])


class SearchCaches:
    """What searches on one database reuse between queries: the term statistics (BM25 document
    frequencies), the tickers, dates and document types each collection holds (query routing), re-checked every
    `lexical.GENERATION_TTL` seconds, and the ticker profiles (entity linking), re-read every
    `profiles.CACHE_SECONDS`; so another process's writes show within those delays. The owner
    (`KnowledgeBase`) calls `clear()` after its own writes so they show at once."""

    def __init__(self) -> None:
        self.terms = lexical.TermStatistics()
        self._tickers: dict[str | None, tuple[float, set[str]]] = {}
        self._dates: dict[str | None, tuple[float, set[dt.date]]] = {}
        self._names: dict[str | None, tuple[float, DocumentNames]] = {}
        self._types: dict[str | None, tuple[float, set[str]]] = {}
        self._profiles: dict[tuple[str | None, str], tuple[float, profiles.Profiles]] = {}
        self._queries: QueryVectors | None = None  # kept by clear(): a query's vector does not depend on the data

    def embed(self, provider: EmbeddingProvider, texts: list[str], size: int) -> np.ndarray:
        """`provider.embed(texts)`, from the last `size` query texts' vectors where they are (0: never)."""
        if size <= 0:
            return provider.embed(texts)
        if self._queries is None or self._queries.size != size:
            self._queries = QueryVectors(size)
        return self._queries.embed(provider, texts)

    def known_tickers(self, store, collection: str | None) -> set[str]:
        return self._cached(self._tickers, collection, lambda: store.known_tickers(collection))

    def known_doc_types(self, store, collection: str | None) -> set[str]:
        """The document types `collection` (None: every collection) holds: a query may name them."""
        return self._cached(self._types, collection, lambda: store.known_doc_types(collection))

    def document_dates(self, store, collection: str | None) -> set[dt.date]:
        """The dates `collection`'s documents carry (a month named without a year resolves among them)."""
        return self._cached(self._dates, collection, lambda: store.document_dates(collection))

    def document_names(self, store, collection: str | None) -> DocumentNames:
        """The names of `collection`'s documents of the types a question can name (re-read every
        `profiles.CACHE_SECONDS`: documents are renamed rarely, and `clear()` follows our own writes)."""
        return self._cached(self._names, collection,
                            lambda: DocumentNames(store.document_names(collection, list(DOC_TYPE_HINTS))),
                            profiles.CACHE_SECONDS)

    def ticker_profiles(self, store, collection: str | None, space: str) -> profiles.Profiles:
        return self._cached(self._profiles, (collection, space),
                            lambda: store.ticker_profile_vectors(collection, space), profiles.CACHE_SECONDS)

    @staticmethod
    def _cached(cache: dict, key, read, ttl: float = lexical.GENERATION_TTL):
        """`cache[key]`'s value, or `read()`'s when there is none or it is older than `ttl` seconds."""
        now = time.monotonic()
        entry = cache.get(key)
        if entry is None or now - entry[0] > ttl:
            entry = (now, read())
            cache[key] = entry
        return entry[1]

    def clear(self) -> None:
        self.terms.clear()
        self._tickers = {}
        self._dates = {}
        self._names = {}
        self._types = {}
        self._profiles = {}


def plan_query(store, query: str, collection: str | None, caches: SearchCaches | None = None) -> QueryPlan:
    """The query's `QueryPlan`, with the tickers, dates and document types `collection` knows (from
    `caches` when given)."""
    caches = caches or SearchCaches()
    return classify(query, caches.known_tickers(store, collection), known_dates=caches.document_dates(store, collection),
                    collection_types=caches.known_doc_types(store, collection))


def link_query(store, plan: QueryPlan, vector, space: str, collection: str | None, opts: SearchOptions,
               caches: SearchCaches | None = None) -> QueryPlan:
    """A query naming no ticker but describing one ("the GPU maker") gets the ticker its vector
    matches confidently among the ticker profiles, as if it had named it (`plan.linked` says so)."""
    if not (opts.entity_linking and opts.routing) or plan.tickers or vector is None:
        return plan
    known = (caches or SearchCaches()).ticker_profiles(store, collection, space)
    linked = [(t, s) for t, s in profiles.link_tickers(known, vector, opts.link_threshold, opts.link_margin,
                                                        opts.link_max) if t not in plan.excluded]
    if linked:
        plan.tickers = [t for t, _ in linked]
        plan.linked = dict(linked)
    return plan


def _hints(hits: list[SearchHit], plan: QueryPlan, opts: SearchOptions) -> list[SearchHit]:
    """Soft boosts: named tickers, document types, documents and dates by `hint_boost`, linked tickers
    by `link_boost`."""
    named = plan.named_tickers
    hits = date_boost(boost(hits, named, plan.doc_types, opts.hint_boost), plan.dates, opts.hint_boost)
    hits = document_boost(hits, plan.documents, opts.hint_boost)
    return boost(hits, list(plan.linked), [], opts.link_boost) if plan.linked else hits


@contextmanager
def _timed(timings: dict[str, float], stage: str) -> Iterator[None]:
    """Add the block's wall time in ms to `timings[stage]` (each stage of a search is reported)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[stage] = round(timings.get(stage, 0.0) + (time.perf_counter() - t0) * 1000, 2)


def _validate(query: str, mode: str, top_k: int, filters: SearchFilters, min_similarity: float = 0.0) -> None:
    """A `ValidationError` naming the argument for what the database would otherwise reject obscurely."""
    if not isinstance(query, str):
        raise ValidationError(f"query must be a string, got {type(query).__name__}")
    if not query.strip():
        raise ValidationError("query is empty; pass some words to search for")
    for name, value in (("query", query), ("section", filters.section), ("path", filters.path),
                        ("section_contains", filters.section_contains)):
        if value is not None and not isinstance(value, str):
            raise ValidationError(f"{name} must be a string, got {value!r}")
        if value and (problem := text_problem(value)):
            raise ValidationError(f"{name} {problem}")
    if filters.tags is not None and not isinstance(filters.tags, dict):
        raise ValidationError(f"tags must be a mapping of tag to value(s), got {filters.tags!r}")
    if mode not in MODES:
        raise ValidationError(f"unknown search mode '{mode}'; use one of {', '.join(MODES)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= 1000:
        raise ValidationError(f"top_k must be a whole number between 1 and 1000, got {top_k!r}")
    if not is_number(min_similarity) or not 0 <= min_similarity <= 1:
        raise ValidationError(f"min_similarity must be a number between 0 and 1 (a cosine), got {min_similarity!r}")
    for name in ("doc_type", "ticker"):
        value = getattr(filters, name)
        if value is not None and not is_text_or_texts(value):
            raise ValidationError(f"{name} must be a string or a list of strings, got {value!r}")
    for name in ("date_from", "date_to"):
        value = getattr(filters, name)
        if value is not None and not isinstance(value, dt.date):
            raise ValidationError(f"{name} must be a date (YYYY-MM-DD), got {value!r}")
    if filters.date_from and filters.date_to and filters.date_from > filters.date_to:
        # an empty answer would read as "nothing was written then"
        raise ValidationError(f"date_from {filters.date_from} is after date_to "
                              f"{filters.date_to}, so no document can match; swap them or drop one")


def _ticker_variants(plan: QueryPlan, filters: SearchFilters) -> list[SearchFilters]:
    """Comparisons and relationships between tickers retrieve for each ticker as well."""
    if plan.kind not in ("comparison", "relationship") or len(plan.tickers) < 2:
        return []
    allowed = filters.ticker
    allowed = None if not allowed else {t.upper() for t in ([allowed] if isinstance(allowed, str) else allowed)}
    return [dataclasses.replace(filters, ticker=t) for t in plan.tickers if allowed is None or t in allowed]


def _type_variants(plan: QueryPlan, filters: SearchFilters, opts: SearchOptions) -> list[SearchFilters]:
    """A question naming no ticker that selects documents by their type's name ("which fields does a
    trade journal record", "the stock analyses that ...", `plan.type_lists`) retrieves among each such
    type's documents alone as well: its own sections then compete with the many documents that only
    describe the type. Within the caller's `doc_type` filter; none when that filter is the type alone
    (the list would repeat the query's own)."""
    if opts.type_list_weight <= 0 or plan.tickers:
        return []
    given = filters.doc_type
    allowed = None if not given else {normalise_type(t) for t in ([given] if isinstance(given, str) else given)}
    return [dataclasses.replace(filters, doc_type=t) for t in plan.type_lists
            if allowed is None or (normalise_type(t) in allowed and allowed != {normalise_type(t)})]


def _without_excluded(hits: list[SearchHit], plan: QueryPlan) -> list[SearchHit]:
    """`hits` without the documents of the tickers the query excludes ("-NFLX"): full text leaves them
    out, and the semantic list, which cannot read the minus, must not bring them back."""
    if not plan.excluded:
        return hits
    return [h for h in hits if (h.ticker or "").upper() not in plan.excluded]


def _has_word(text: str) -> bool:
    """Whether `text` holds a word of two letters or more (what is left of a query is worth a search)."""
    return re.search(r"[^\W\d_]{2,}", text) is not None


def _named_ticker_weights(query: str, plan: QueryPlan, opts: SearchOptions) -> dict[str, float] | None:
    """Full-text weights for the tickers a hybrid query names (`lexical_named_ticker_weight` times
    their IDF). A named ticker picks documents, not sections: every chunk of its documents holds it
    (the ticker field and the embedded prefix), and sections that repeat it in their text outrank the
    one that answers. The ticker hint boost and the semantic list still prefer its documents. None
    when the weight is 1.0 or the query is nothing but tickers."""
    named = plan.named_tickers
    if opts.lexical_named_ticker_weight == 1.0 or not named:
        return None
    rest = re.sub(r"\b(?:" + "|".join(map(re.escape, named)) + r")\b", " ", query, flags=re.I)
    if not _has_word(rest):
        return None
    return {t.lower(): opts.lexical_named_ticker_weight for t in named}


def _full_text_query(query: str, plan: QueryPlan, opts: SearchOptions) -> str:
    """A hybrid query's full-text words: without the month or day it names (`lexical_drop_dates`),
    which picks documents (documents dated then are boosted) and in full text only matched the
    sections that repeat the month ("February 2026" in every analysis's date, status and text); kept
    when the question selects documents ("stock analyses dated February 2026": the sections stating
    the date answer it) or has no other word."""
    if not (opts.lexical_drop_dates and plan.dates) or plan.selects_documents:
        return query
    rest = without_date(query)
    return rest if _has_word(rest) else query


def _weigh_far_full_text(store, space: str, vector, lists: list[Candidates], plan: QueryPlan, opts: SearchOptions,
                         timings: dict[str, float]) -> SearchOptions:
    """`opts` with the semantic lists weighing `convex_alpha_far` when full text matched only words the
    question uses incidentally ("how much am I allowed to lose on one position": chart notes about
    "one position"): its first chunks are on average less than `lexical_far_ratio` times as close to
    the question as the semantic list's first, and that list found something close (its best cosine
    at least `lexical_far_min_cosine`; when nothing is, full text's words may be all the question
    has). Only for questions naming no ticker: a named ticker's documents are preferred anyway and
    full text's words pick sections among them (two cross-document comparisons fell). Sets
    `plan.lexical_closeness`. Full-text chunks the semantic list did not reach get their cosine from
    the vectors the process holds (a collection of at most `search.exact_max_rows` chunks), else
    count at the semantic list's last cosine, at least their own: no query is added."""
    semantic, full_text = lists[0].hits, next((c.hits for c in lists if c.source == "lexical"), [])
    with _timed(timings, "closeness"):
        first = full_text[:CLOSENESS_CHUNKS]
        reached = {h.chunk_id: h.similarity for h in semantic}
        for hit in first:
            if hit.similarity is None:
                hit.similarity = reached.get(hit.chunk_id)
        missing = [h for h in first if h.similarity is None]
        if missing:
            found = store.held_similarities(vector, space, missing[0].collection, [h.chunk_id for h in missing])
            for hit in missing:
                hit.similarity = found.get(hit.chunk_id)
        closeness = lexical_closeness(semantic, full_text, CLOSENESS_CHUNKS)
    if closeness is None:
        return opts
    plan.lexical_closeness = round(closeness, 4)
    best = semantic[0].similarity if semantic[0].similarity is not None else semantic[0].score
    if closeness < opts.lexical_far_ratio and best >= opts.lexical_far_min_cosine:
        return dataclasses.replace(opts, convex_alpha=opts.convex_alpha_far)
    return opts


def _first_pass(lists: list[Candidates], plan: QueryPlan, opts: SearchOptions, mode: str,
                timings: dict[str, float]) -> list[SearchHit]:
    """The lists fused, with the query's hints, descriptor weights and (hybrid) document evidence."""
    with _timed(timings, "fusion"):
        if len(lists) == 1:
            ranked = lists[0].hits  # one list keeps its own scale: cosine or normalised full-text rank
        elif opts.fusion == "convex" and mode == "hybrid":  # lists of one kind share a scale: RRF as before
            ranked = convex(lists, opts.convex_alpha, opts.convex_semantic_floor)
        else:
            ranked = rrf(lists, opts.rrf_k)
        ranked = _hints(ranked, plan, opts)
        # in every mode: unweighted, descriptor sections cost semantic search as much as hybrid
        # (dev semantic 0.661 -> 0.630, lexical 0.633 -> 0.592; README, Retrieval)
        weight = opts.descriptor_weight if plan.selects_documents else opts.descriptor_weight_other
        ranked = weigh_stubs(weigh_descriptors(ranked, opts.descriptors, weight), opts.stub_words, opts.stub_weight)
    if mode == "hybrid":
        with _timed(timings, "evidence"):
            ranked = document_evidence(ranked, opts.document_units, opts.document_weight)
    return ranked


def feedback_chunks(ranked: list[SearchHit], depth: int, shared: bool = False) -> list[str]:
    """Pseudo-relevance feedback (Rocchio) moves the query's vector towards the mean stored vector of
    these chunks: the best chunk of each of the first `depth` units ranked. A question that describes
    instead of names borrows the words of what it found first. Empty with `shared` when no document
    holds two of those units (the first pass agrees on nothing)."""
    chunks: list[str] = []
    units: set[tuple[str, str]] = set()
    docs: set[tuple[str, str]] = set()
    for hit in ranked:
        if (hit.collection, hit.unit_id) not in units:
            units.add((hit.collection, hit.unit_id))
            docs.add((hit.collection, hit.path))
            chunks.append(hit.chunk_id)
            if len(chunks) >= depth:
                break
    return [] if shared and len(docs) == len(chunks) else chunks


def search(
    store,
    provider: EmbeddingProvider,
    query: str,
    *,
    mode: str = "semantic",
    filters: SearchFilters | None = None,
    top_k: int = 10,
    min_similarity: float = 0.0,
    group: bool = True,
    options: SearchOptions | None = None,
    reranker: Reranker | None = None,
    expander: QueryExpander | None = None,
    caches: SearchCaches | None = None,
) -> SearchResult:
    """Search the active embedding space (semantic), the full-text index (lexical) or both fused
    with reciprocal rank fusion (hybrid). With `group`, one result per unit (its best chunk).
    `caches`: what to reuse from earlier searches on this database (none: look everything up)."""
    filters = filters or SearchFilters()
    _validate(query, mode, top_k, filters, min_similarity)
    caches = caches or SearchCaches()
    opts = options or SearchOptions.from_settings(store.settings)
    timings: dict[str, float] = {}
    t_start = time.perf_counter()
    # lexical mode needs the space too when a threshold asks for the full-text hits' cosine
    needs_vectors = mode != "lexical" or min_similarity > 0
    space = store.active_space() if needs_vectors else None
    if needs_vectors and space is None:
        return SearchResult(query, mode, [], timings)
    with _timed(timings, "plan"):
        plan = plan_query(store, query, filters.collection, caches) if opts.routing else QueryPlan(query)
        if mode == "hybrid" and opts.routing and opts.named_documents and plan.doc_types:
            plan.documents = find_named_documents(plan, caches.document_names(store, filters.collection))
    # Grouping collapses chunks into units, so fetch deeper when many units are wanted.
    depth = max(opts.candidate_depth, top_k * (2 if group else 1))

    queries = [(query, 1.0)]
    expansions: list[str] = []
    if expander is not None:  # callers pass one only when the request asks for expansion
        with _timed(timings, "expand"):
            expansions = list(expander.expand(query))
        queries += [(q, 0.5) for q in expansions]
    # hybrid only: convex fusion divides each list by its own best hit, so a type's best section counts fully there
    by_type = _type_variants(plan, filters, opts) if mode == "hybrid" else []
    plan.type_lists = [f.doc_type for f in by_type]
    variants = [(filters, 1.0)] + [(f, 0.5) for f in _ticker_variants(plan, filters)] \
        + [(f, opts.type_list_weight) for f in by_type]

    def embed(texts: list[str]) -> np.ndarray:
        with _timed(timings, "embed"):
            return caches.embed(provider, texts, store.settings.search.query_cache_size)

    vectors = embed([q for q, _ in queries]) if mode == "semantic" else None
    may_feed = mode == "hybrid" and opts.feedback_weight > 0
    # per filter variant, the query's nearest `feedback_pool` x depth chunks when it was ranked exactly,
    # the walk's hits after an HNSW walk (None: feedback walks again, `feedback_walk_again`): feedback
    # re-scores them instead of ranking every filtered row again
    pools: list[list[str] | None] = [None] * len(variants)
    # per filter variant, the exact-or-HNSW decision its first pass got: feedback's query reuses it
    # instead of counting the filtered rows again (a round trip; up to exact_max_rows index entries)
    scans: list[tuple[str, int | None] | None] = [None] * len(variants)

    def semantic_lists(depth: int) -> list[Candidates]:
        lists: list[Candidates] = []
        with _timed(timings, "semantic"):
            for n, ((q, qw), vec) in enumerate(zip(queries, vectors)):
                for i, (f, fw) in enumerate(variants):
                    # an expansion's hits are held to their cosine with the query itself (below), not to it
                    hits = store.semantic_search(vec, space["space"], space["dimensions"], f, depth,
                                                 min_similarity if n == 0 else 0.0,
                                                 pool=depth * opts.feedback_pool if may_feed and n == 0 else 0)
                    if n == 0:
                        pools[i], scans[i] = hits.pool, hits.scan
                        if pools[i] is None and hits.scan is not None and hits.scan[0] == "hnsw" \
                                and not opts.feedback_walk_again:
                            pools[i] = [h.chunk_id for h in hits]  # what the walk found, re-scored by feedback
                    if n > 0:
                        for hit in hits:
                            hit.similarity = None
                    lists.append(Candidates("semantic", hits, opts.semantic_weight * qw * fw))
        return lists

    def lexical_lists(depth: int) -> list[Candidates]:
        lists: list[Candidates] = []
        scaled = _named_ticker_weights(query, plan, opts) if mode == "hybrid" else None
        with _timed(timings, "lexical"):
            for q, qw in queries:
                q = _full_text_query(q, plan, opts) if mode == "hybrid" else q
                for f, fw in variants:
                    scored = lexical.lexical_search(store, caches.terms, q, f, depth, timings, scaled)
                    for hit, raw in scored:
                        hit.score = lexical.normalise(raw)
                    lists.append(Candidates("lexical", [h for h, _ in scored], opts.lexical_weight * qw * fw))
        return lists

    def named_documents_list(depth: int) -> list[Candidates]:
        # The sections of the documents the question names, ranked by their cosine with it, as one
        # more semantic list: their embedded text does not carry the name (a ticker's does), so their
        # answering sections ("entry rules", cosine 0.32) were not among the candidates at all. Kept
        # through feedback, which moves towards the other named things' documents.
        hits: list[SearchHit] = []
        with _timed(timings, "named"):
            for path in plan.documents:
                hits += store.semantic_search(vectors[0], space["space"], space["dimensions"],
                                              dataclasses.replace(filters, path=path), depth, min_similarity)
        hits.sort(key=lambda h: -h.score)
        return [Candidates("semantic", hits, opts.semantic_weight)] if hits else []

    def gather(depth: int) -> list[Candidates]:
        if mode == "semantic":
            return semantic_lists(depth)
        if mode == "lexical":
            return lexical_lists(depth)
        # hybrid: the full-text query runs on another pooled connection while this thread embeds
        future = _POOL.submit(lexical_lists, depth)
        nonlocal vectors
        if vectors is None:
            vectors = embed([q for q, _ in queries])
        sem = semantic_lists(depth)
        return sem + future.result() + (named_documents_list(opts.candidate_depth) if plan.documents else [])

    lists = gather(depth)
    # Grouping can leave fewer units than asked for: go deeper while some list was cut off at `depth`.
    while group and depth < 1000 and any(len(c.hits) >= depth for c in lists) \
            and len({h.unit_id for c in lists for h in c.hits}) < top_k:
        depth = min(1000, depth * 2)
        lists = gather(depth)
    if min_similarity > 0:  # a threshold holds for every candidate, whichever list found it
        if vectors is None:  # lexical mode
            vectors = embed([query])
        with _timed(timings, "similarity"):
            lists = _with_similarity(store, space["space"], vectors[0], lists, min_similarity)

    t0 = time.perf_counter()
    if vectors is not None:
        with _timed(timings, "link"):
            plan = link_query(store, plan, vectors[0], space["space"], filters.collection, opts, caches)
    if mode == "hybrid" and opts.fusion == "convex" and opts.lexical_far_ratio > 0 and lists[0].hits \
            and not plan.named_tickers:
        opts = _weigh_far_full_text(store, space["space"], vectors[0], lists, plan, opts, timings)
    named = plan.named_tickers
    feedback = may_feed and (opts.feedback_scope != "unnamed" or not named)
    # Feedback replaces the query's own semantic lists (hybrid gathers them first, one per filter
    # variant) and fuses the other lists again; fusion rewrites the hits' scores, so from copies.
    kept = [dataclasses.replace(c, hits=[copy.copy(h) for h in c.hits]) for c in lists[len(variants):]] \
        if feedback else []
    ranked = _without_excluded(_first_pass(lists, plan, opts, mode, timings), plan)
    toward = feedback_chunks(ranked, opts.feedback_depth, opts.feedback_scope == "shared") if feedback else []
    if toward:
        with _timed(timings, "feedback"):
            # one query per variant: the moved vector and each hit's cosine with the query itself
            # are computed in the database, in the query's own round trip. After an exact ranking,
            # its pool and the full-text hits are re-scored (with the documents of `toward`): the
            # moved vector's nearest lie among the query's own (README: "Pseudo-relevance feedback's cost")
            found = list(dict.fromkeys(h.chunk_id for c in kept for h in c.hits))
            # the other lists' hits without a similarity (full text, expansions) get it in the first
            # variant's round trip, not in a lookup of their own once the search is done
            unknown = list(dict.fromkeys(h.chunk_id for c in kept for h in c.hits if h.similarity is None))
            again = [Candidates("semantic", store.semantic_search(
                vectors[0], space["space"], space["dimensions"], f, depth, min_similarity, toward=toward,
                weight=opts.feedback_weight, among=None if pool is None else pool + found, scan=scan,
                cosines=unknown if i == 0 else ()),
                opts.semantic_weight * fw) for i, ((f, fw), pool, scan) in enumerate(zip(variants, pools, scans))]
        if again[0].hits:  # none: no vector stored for the first units, the first pass stands
            cosines = again[0].hits.cosines
            for hit in (h for c in kept for h in c.hits if h.similarity is None):
                hit.similarity = cosines.get(hit.chunk_id)
            lists = again + kept
            ranked = _without_excluded(_first_pass(lists, plan, opts, mode, timings), plan)
    # The graph list only for queries anchored on graph nodes (a ticker or a document type named):
    # on the dev set it lowered vocabulary-mismatch and platform questions, which name neither.
    if mode == "hybrid" and opts.graph_fusion and ranked and (plan.tickers or plan.doc_types):
        with _timed(timings, "graph"):
            related = graph_candidates(store, filters, ranked, opts)
            if related is not None:
                # under convex fusion the first pass (document evidence included) stands for the
                # retrievers' lists, with their summed weight; under RRF the lists are fused again
                base = lists if opts.fusion != "convex" else [
                    Candidates("fused", ranked, sum(c.weight for c in lists if c.hits))]
                ranked = _without_excluded(_hints(rrf(base + [related], opts.rrf_k), plan, opts), plan)
    if reranker is not None and ranked:
        with _timed(timings, "rerank"):
            head = ranked[: opts.rerank_depth]
            scores = reranker.rerank(query, [h.text for h in head])
            for hit, score in zip(head, scores):
                hit.rerank_score = float(score)  # the fused `score` stays beside it
            ranked = sorted(head, key=lambda h: -(h.rerank_score or 0.0)) + ranked[opts.rerank_depth:]
    with _timed(timings, "group"):
        if group:
            ranked = group_by_unit(ranked)
            if mode == "hybrid" and reranker is None:  # a reranker's order stands (not measured with one)
                ranked = cover_named(ranked, plan.named_tickers, plan.doc_types, opts.aspect_window, plan.documents)
        # Global questions ("across", "each", "all") keep the fused order: moving a document's third and
        # later units behind every other document's first two (as they once did) buried the sections
        # such questions ask for (dev2 cross_doc 0.486 -> 0.515, dev unchanged; README, Retrieval).
        hits = rescale_to_one(ranked)[:top_k]
        if plan.kind == "trend":
            # Only the page a reader sees (`search.top_k`) reads in date order; deeper results keep their
            # rank. Sorting all of a 100-result request by date put the year's oldest loose matches ahead
            # of the answer (`rag eval` asks for 100: the question scored nDCG@10 0).
            page = min(len(hits), opts.top_k)
            hits = by_date(hits[:page], newest_first=plan.recent) + hits[page:]
    if min_similarity <= 0 and vectors is not None:
        # no threshold: only the hits returned need their cosine, not every candidate
        with _timed(timings, "similarity"):
            hits = _with_similarity(store, space["space"], vectors[0], [Candidates("result", hits, 1.0)], 0.0)[0].hits
    with _timed(timings, "excerpts"):
        for hit in hits:
            hit.excerpt = excerpt(hit.text, query)
    timings["search"] = round(sum(timings.get(k, 0) for k in ("semantic", "lexical", "feedback")), 2)  # database time
    timings["fuse"] = round((time.perf_counter() - t0) * 1000, 2)  # everything after retrieval
    timings["total"] = round((time.perf_counter() - t_start) * 1000, 2)
    return SearchResult(query, mode, hits, timings, plan=plan.to_dict(), reranked=reranker is not None,
                        expanded=expansions)


def _with_similarity(store, space: str, vector, lists: list[Candidates], min_similarity: float) -> list[Candidates]:
    """Give every candidate its cosine with the query (full-text and expansion hits are looked up in
    one query) and drop those below `min_similarity`, whichever list found them, before fusion."""
    known: dict[str, float] = {}
    for cand in lists:
        for hit in cand.hits:
            if hit.similarity is not None:
                known[hit.chunk_id] = hit.similarity
    missing = {h.chunk_id for c in lists for h in c.hits if h.chunk_id not in known}
    known.update(store.similarities(vector, space, sorted(missing)))
    out = []
    for cand in lists:
        for hit in cand.hits:
            hit.similarity = known.get(hit.chunk_id)
        kept = [h for h in cand.hits if min_similarity <= 0 or (h.similarity or 0.0) >= min_similarity]
        out.append(dataclasses.replace(cand, hits=kept))
    return out
