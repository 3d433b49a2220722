"""Rule-based query understanding: the kind of question, and the tickers / document types it names.
Hints become soft boosts and routing choices, never hard filters."""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_lib.models import UNDECLARED_TYPES

KINDS = ("retrieval", "relationship", "trend", "comparison", "global")

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9.\-]*[A-Za-z0-9]|[A-Za-z]")
# Lower-case words that are also tickers; only their upper-case spelling counts as a ticker.
_COMMON = {
    "a", "all", "am", "an", "and", "are", "as", "at", "be", "by", "can", "car", "cat", "day", "do", "for",
    "go", "has", "have", "how", "i", "is", "it", "key", "low", "main", "meta", "new", "now", "of", "on",
    "one", "open", "or", "out", "pay", "real", "run", "see", "so", "the", "to", "two", "up", "very", "was",
    "well", "what", "who", "win", "why", "you", "cost", "life", "fast", "good", "care", "edit", "link",
}

_COMPARISON = re.compile(r"\b(vs\.?|versus|compare[sd]?|comparison|compared|difference between|differ|better than"
                         r"|worse than|against)\b", re.I)
_TREND = re.compile(r"\b(over time|trend(s|ing)?|evolv(e|ed|ing)|evolution|timeline|history of|historically"
                    r"|changed? (since|over)|progression|month over month|quarter over quarter|year over year)\b",
                    re.I)  # not "YoY"/"QoQ": like "Q4", the period of a figure ("RPO growth YoY"), not a change
# seed 004's time constraint "recent" (its trend words recent / latest / last N weeks): a trend question
# that wants the newest first (its bare "Q4" is left out: a quarter names a period, not a change)
_RECENT = re.compile(r"\b(recent(ly)?|latest|newest|last \d+ (days?|weeks?|months?|quarters?|years?)"
                     r"|(the )?(last|past) (week|month|quarter|year))\b", re.I)
# seed 004's relationship words too: competitors, peers, suppliers, customers
_RELATIONSHIP = re.compile(r"\b(depend(s|ent|ence)? on|relationship|related to|relate[sd]?|correlat\w*|impact(s|ed)? (of|on)"
                           r"|affect(s|ed)?|linked|connection between|exposure to|driven by|influence[sd]?"
                           r"|competitors?|competition|compete[sd]?|competing|peers?|suppliers?|customers?)\b", re.I)
_GLOBAL = re.compile(r"\b(all|every|each|list|overview|summar(y|ise|ize)|across|which (trades|stocks|analyses|documents)"
                     r"|any of|in general|overall|themes?)\b", re.I)

# Documents named in the plural: "which scanner configs", "stock analyses that", "closed trades".
_PLURAL_DOCUMENTS = re.compile(r"\b(documents|files|analyses|trades|scanners|configs|strategies|lessons|learnings"
                               r"|biases|mistakes|journals|profiles|reviews|watchlists)\b", re.I)

_MONTHS = {name.lower(): n for names in (calendar.month_name, calendar.month_abbr) for n, name in enumerate(names) if name}
# "February 2026", "Feb 20 2026", "January 20th, 2025": a month (and day) the question dates itself by
_DATE = re.compile(r"\b(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?(?:\s+(\d{1,2})(?:st|nd|rd|th)?)?,?\s+((?:19|20)\d\d)\b", re.I)
# "in January", "January's analyses", "the Feb 21 analyses", "december dump": a month (and day) without a year
_YEARLESS = re.compile(r"\b(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\b\.?(?:\s+(\d{1,2})(?:st|nd|rd|th)?\b)?"
                       r"(?!,?\s+\d)", re.I)
# Month names that are also everyday words ("it may", "march on") or abbreviations a sentence uses ("mar",
# "sep"): in lower case only followed by a day ("may 5"); capitalised always.
_AMBIGUOUS_MONTHS = {"may", "march", "mar", "jun", "sep", "oct", "nov", "jan", "aug", "apr", "jul", "dec", "feb"}

# Words that point at a document type (soft boost only).
DOC_TYPE_HINTS: dict[str, tuple[str, ...]] = {
    "earnings-analysis": ("earnings analysis", "earnings analyses", "earnings call", "earnings trade", "post-earnings"),
    "stock-analysis": ("stock analysis", "stock analyses"),
    "ticker-profile": ("ticker profile", "company profile"),
    "trade-journal": ("trade journal", "journal", "my trades", "trades"),
    "strategy": ("strategy", "strategies"),
    "learning": ("lesson", "lessons", "learning", "learnings", "bias", "biases", "mistake", "mistakes"),
    "scanner-config": ("scanner", "scanners", "scan config"),
    "research-analysis": ("research", "macro"),
    "watchlist": ("watchlist", "watch list"),
    "post-trade-review": ("post-trade review", "trade review"),
}


@dataclass
class QueryPlan:
    """What a query asks for and how retrieval should treat it."""

    query: str
    kind: str = "retrieval"
    tickers: list[str] = field(default_factory=list)
    doc_types: list[str] = field(default_factory=list)
    linked: dict[str, float] = field(default_factory=dict)  # tickers entity linking added, with similarity
    dates: list[str] = field(default_factory=list)  # [first, last] ISO day of a month or day the query names
    excluded: list[str] = field(default_factory=list)  # tickers the query excludes ("-NFLX"): their documents are left out
    # paths of the documents a question about several things names by name and type ("the
    # earnings-momentum strategy"): `find_named_documents`, set by hybrid search (`search.named_documents`)
    documents: list[str] = field(default_factory=list)
    # the collection's document types the query selects by their own name ("a trade journal", "the
    # stock analyses"; `find_type_lists`): hybrid search also retrieves among each one's documents
    # alone (`search.type_list_weight`) and keeps here only the types it did
    type_lists: list[str] = field(default_factory=list)
    # hybrid: how close full text's first chunks are to the question, relative to the semantic list's
    # (`rag_lib.search.fusion.lexical_closeness`); below `search.lexical_far_ratio` the semantic
    # lists weigh `search.convex_alpha_far`
    lexical_closeness: float | None = None

    @property
    def recent(self) -> bool:
        """A trend question asking for the newest ("latest", "recent", "the last 3 weeks"): its results
        read newest first; other trend questions ("how has X evolved") oldest first."""
        return self.kind == "trend" and asks_for_latest(self.query)

    @property
    def selects_documents(self) -> bool:
        """The question picks documents by what they are, naming them in the plural ("closed trades",
        "stock analyses dated February 2026", "documents that link to ..."), rather than asking about
        one ticker's or one named document's content ("the earnings momentum strategy's sizing")."""
        plural = _PLURAL_DOCUMENTS.search(self.query)
        return not self.tickers and bool(plural) and (bool(self.doc_types) or plural.group(1).lower() == "documents")

    @property
    def named_tickers(self) -> list[str]:
        """The tickers the question names itself (not those entity linking added)."""
        return [t for t in self.tickers if t not in self.linked]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def asks_for_latest(query: str) -> bool:
    """Whether the query asks for the newest ("latest", "recent", "the last 3 weeks")."""
    return _RECENT.search(query) is not None


# A word the query excludes in web-search syntax ("bull call spread" -NFLX), as full text reads it
_NEGATED = re.compile(r"(?:^|\s)-([A-Za-z][A-Za-z0-9.]*)")


def excluded_tickers(query: str, known: set[str]) -> list[str]:
    """Known tickers the query excludes with a leading minus ("-NFLX"): not named, but left out."""
    return list(dict.fromkeys(t.upper() for t in _NEGATED.findall(query) if t.upper() in known))


def find_tickers(query: str, known: set[str]) -> list[str]:
    """Known tickers named in the query: upper-case always, lower-case unless a common word; not
    those it excludes ("-NFLX")."""
    found: list[str] = []
    excluded = set(excluded_tickers(query, known))
    for token in _WORD.findall(query):
        upper = token.upper()
        if upper in known and upper not in excluded and (token.isupper() or token.lower() not in _COMMON) \
                and upper not in found:
            found.append(upper)
    return found


def find_dates(query: str, held: set[dt.date] | None = None) -> list[str]:
    """The first month or day the query names, as [first, last] ISO dates (empty when none). One named
    without a year ("in January", "the Feb 21 analyses") is the latest such month or day some document
    of `held` (the collection's document dates) falls in: a reader means the last January they wrote
    about, not every January, nor one the knowledge base holds nothing from."""
    m = _DATE.search(query)
    if not m:
        return _yearless_dates(query, held or set())
    return _month_or_day(int(m.group(3)), _MONTHS[m.group(1).lower()], int(m.group(2)) if m.group(2) else None)


def _month_or_day(year: int, month: int, day: int | None) -> list[str]:
    """[first, last] ISO day of `day` (when that month has it), else of the whole month."""
    last = calendar.monthrange(year, month)[1]
    if day is not None and 1 <= day <= last:
        return [dt.date(year, month, day).isoformat()] * 2
    return [dt.date(year, month, 1).isoformat(), dt.date(year, month, last).isoformat()]


def _yearless(query: str) -> re.Match[str] | None:
    """The first month (and day) named without a year that reads as a date, not as a word ("it may")."""
    for m in _YEARLESS.finditer(query):
        word = m.group(1)
        if m.group(2) or not word.islower() or word.lower() not in _AMBIGUOUS_MONTHS:
            return m
    return None


def _yearless_dates(query: str, held: set[dt.date]) -> list[str]:
    m = _yearless(query)
    if not m or not held:
        return []
    month = _MONTHS[m.group(1).lower()]
    day = int(m.group(2)) if m.group(2) else None
    years = sorted({d.year for d in held if d.month == month and (day is None or d.day == day)})
    if not years:
        return []
    return _month_or_day(years[-1], month, day)


def without_date(query: str) -> str:
    """The query without the month or day `find_dates` reads in it."""
    if _DATE.search(query):
        return _DATE.sub(" ", query, count=1)
    m = _yearless(query)
    return query[:m.start()] + " " + query[m.end():] if m else query


def find_doc_types(query: str, known: set[str] | None = None) -> list[str]:
    text = " " + re.sub(r"\s+", " ", query.lower()) + " "
    found = []
    for doc_type, phrases in DOC_TYPE_HINTS.items():
        if known is not None and doc_type not in known:
            continue
        if any(re.search(r"\b" + re.escape(p) + r"\b", text) for p in phrases):
            found.append(doc_type)
    return found


def name_words(text: str) -> tuple[str, ...]:
    """A name's or a query's words as names are matched: lower case, split at anything but a letter or
    a digit, words holding a digit left out (dates, serial numbers: `NVDA_20250115T1000`, `-001`)."""
    return tuple(w for w in re.split(r"[^a-z0-9]+", text.lower()) if w and not any(c.isdigit() for c in w))


class DocumentNames:
    """The names a question can call documents by: each document's file name (without extensions)
    and id, as `name_words` reads them, when two words or more (one word is a ticker's or a type's
    business), indexed by their first word."""

    def __init__(self, documents: list[tuple[str, str, str]]):
        self._by_first: dict[str, list[tuple[tuple[str, ...], str, str]]] = {}
        for path, doc_id, doc_type in documents:
            stem = path.rsplit("/", 1)[-1].split(".", 1)[0]
            for name in {name_words(stem), name_words(doc_id)}:
                if len(name) >= 2:
                    self._by_first.setdefault(name[0], []).append((name, path, doc_type))

    def named_in(self, query: str) -> list[tuple[str, str]]:
        """(path, doc_type) of the documents whose name occurs in `query` as consecutive words, in order."""
        words = name_words(query)
        found: list[tuple[str, str]] = []
        for i, word in enumerate(words):
            for name, path, doc_type in self._by_first.get(word, ()):
                if words[i:i + len(name)] == name and (path, doc_type) not in found:
                    found.append((path, doc_type))
        return found


def find_named_documents(plan: QueryPlan, names: DocumentNames, limit: int = 3) -> list[str]:
    """Paths of the documents a question about several things names by name and by type: "does the
    earnings-momentum scanner look in the window the pre-earnings momentum strategy enters",
    "did the NVDA setup satisfy the earnings-momentum strategy's entry rules". A name without its
    type ("AI capex concerns") is a topic, not a document; a question about one document finds it
    anyway (its sections would crowd the other answers out), and one selecting documents ("documents
    that link to the earnings momentum strategy") is not about the one it names. At most `limit`."""
    if not plan.doc_types or plan.selects_documents:
        return []
    found = [(p, t) for p, t in names.named_in(plan.query) if t in plan.doc_types][:limit]
    named_types = {t for _, t in found}
    others = len(plan.named_tickers) + len([t for t in plan.doc_types if t not in named_types])
    return [p for p, _ in found] if found and len(found) + others >= 2 else []


def _plural(word: str) -> str:
    """`word`'s regular English plural: analysis -> analyses, strategy -> strategies, config -> configs."""
    if word.endswith("is"):
        return word[:-2] + "es"
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def find_type_lists(query: str, types: set[str]) -> list[str]:
    """The document types among `types` (the collection's own) the query selects by their name: one
    of its kind, after "a"/"an" and at most two other words ("a trade journal", "a bias learning
    file"), or all of them, in the plural ("the stock analyses"). A name inside a longer one the query
    names does not count ("a meeting note": `meeting-note`, not `note`), nor does the type of the
    documents that declare none (`UNDECLARED_TYPES`: "a research note" is not one of those). None in
    a collection of one type, where it selects nothing."""
    if len(types) < 2:
        return []
    text = " " + " ".join(re.findall(r"[a-z0-9]+", query.lower())) + " "
    spans: dict[str, tuple[int, int]] = {}
    for doc_type in sorted(types - set(UNDECLARED_TYPES.values())):
        words = re.findall(r"[a-z0-9]+", doc_type.lower())
        if not words:
            continue
        one = re.search(r" an? (?:[a-z0-9]+ ){0,2}(" + re.escape(" ".join(words)) + ") ", text)
        every = re.search(r" (" + re.escape(" ".join(words[:-1] + [_plural(words[-1])])) + ") ", text)
        if one or every:
            spans[doc_type] = (one or every).span(1)
    return [t for t, (a, b) in spans.items()
            if not any(oa <= a and b <= ob and ob - oa > b - a for oa, ob in spans.values())]


def classify(query: str, known_tickers: set[str] | None = None, known_types: set[str] | None = None,
             known_dates: set[dt.date] | None = None, collection_types: set[str] | None = None) -> QueryPlan:
    """Classify a query; comparison needs two subjects, so it wins over the other kinds.
    `collection_types`: the collection's document types, which the query may select by name."""
    tickers = find_tickers(query, known_tickers or set())
    doc_types = find_doc_types(query, known_types)
    if _COMPARISON.search(query) and (len(tickers) >= 2 or re.search(r"\b(compare|versus|vs\.?)\b", query, re.I)):
        kind = "comparison"
    elif _TREND.search(query) or _RECENT.search(query):
        kind = "trend"
    elif _RELATIONSHIP.search(query):
        kind = "relationship"
    elif _GLOBAL.search(query):
        kind = "global"
    else:
        kind = "retrieval"
    return QueryPlan(query=query, kind=kind, tickers=tickers, doc_types=doc_types, dates=find_dates(query, known_dates),
                     excluded=excluded_tickers(query, known_tickers or set()),
                     type_lists=find_type_lists(query, collection_types or set()))
