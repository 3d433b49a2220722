"""Shaping ranked chunks into results: one per unit (best chunk), short excerpts of the best sentences."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from rag_lib.documents import FILE_DATE
from rag_lib.models import SearchHit

_TOKEN = re.compile(r"[a-z0-9][a-z0-9_.%$/-]*[a-z0-9%]|[a-z0-9]")
_STOP = {
    "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "has", "have", "how",
    "i", "in", "is", "it", "its", "my", "of", "on", "or", "our", "should", "that", "the", "their", "this", "to",
    "was", "what", "when", "where", "which", "who", "why", "with", "vs", "about", "into", "much", "many",
}


def first_by(hits: Iterable[SearchHit], key: Callable[[SearchHit], str]) -> list[SearchHit]:
    """The first hit of each `key`, in rank order."""
    seen: set[str] = set()
    out = []
    for hit in hits:
        if key(hit) not in seen:
            seen.add(key(hit))
            out.append(hit)
    return out


def written_at(hit: SearchHit) -> dt.datetime | None:
    """When the hit's document was written: its date at the time of day its file name carries
    (`NVDA_20250115T1000.yaml`, the corpus's naming) when the name is of that date, else at the
    start of the day; None when the document is undated."""
    if hit.doc_date is None:
        return None
    stamp = FILE_DATE.search(Path(hit.path).name)
    if stamp:
        year, month, day, hour, minute = map(int, stamp.groups())
        if (year, month, day) == (hit.doc_date.year, hit.doc_date.month, hit.doc_date.day) and hour < 24 and minute < 60:
            return dt.datetime(year, month, day, hour, minute)
    return dt.datetime.combine(hit.doc_date, dt.time.min)


def date_key(newest_first: bool = False) -> Callable[[SearchHit], float]:
    """A sort key putting hits in the order their documents were written (`written_at`), newest
    first when asked; undated hits after every dated one."""
    def key(hit: SearchHit) -> float:
        at = written_at(hit)
        if at is None:
            return math.inf
        seconds = at.replace(tzinfo=dt.timezone.utc).timestamp()
        return -seconds if newest_first else seconds
    return key


def by_date(hits: list[SearchHit], newest_first: bool = False) -> list[SearchHit]:
    """Trend questions read best oldest to newest, questions about the latest newest first, by date
    and time of day (`written_at`: two trades of one day in the order they were made); results
    written at the same time keep their rank order, undated ones theirs at the end."""
    return sorted(hits, key=date_key(newest_first))


def by_rank(hits: list[SearchHit]) -> list[SearchHit]:
    """Hits in the order search ranked them (a trend question's come back in date order): a
    reranked head by its rerank score, then the rest by fused score."""
    return sorted(hits, key=lambda h: (h.rerank_score is None,
                                       -(h.score if h.rerank_score is None else h.rerank_score)))


def group_by_unit(hits: Iterable[SearchHit]) -> list[SearchHit]:
    """Keep the best (first) chunk of each unit, in rank order."""
    return first_by(hits, lambda h: h.unit_id)


def cover_named(units: list[SearchHit], tickers: list[str], doc_types: list[str], window: int,
                documents: list[str] = ()) -> list[SearchHit]:
    """A question naming two or more tickers or document types asks about each ("how do the ticker
    profile, the earnings analysis and the strategy use that"): every ticker and document type it
    names gets its best-ranked unit among the first `window` units; one with none there has that
    unit moved to second place (the next missing one to third, ...) with the score of the unit
    whose place it takes, the first result keeping its place. Otherwise one document's many
    matching sections can fill the first places while the other named document's best section
    ranks 20th. A document the question names (`documents`, "the earnings-momentum strategy") is
    covered itself, in place of its type. `units`: one hit per unit, in rank order; `window` 0: as given."""
    named_types = {h.doc_type for h in units if h.path in documents}
    types = [t for t in doc_types if t not in named_types]
    several = len(tickers) + len(documents) + len(types) >= 2 if documents else \
        len(tickers) >= 2 or len(doc_types) >= 2  # one ticker and one type: one document, left as fused
    if window <= 0 or not several:
        return units
    wanted = [lambda h, d=d: h.path == d for d in documents] + \
        [lambda h, t=t: h.doc_type == t for t in types] + \
        [lambda h, t=t: (h.ticker or "").upper() == t for t in tickers]
    place = 1
    for named in wanted:
        if any(named(h) for h in units[:window]):
            continue
        best = next((h for h in units if named(h)), None)
        if best is not None:
            units = [h for h in units if h is not best]
            if place < len(units):  # the score of the place it takes: results stay in score order
                best.score = max(best.score, units[place].score)
            units.insert(place, best)
            place += 1
    return units


def _stem(word: str) -> str:
    return word[:6]


def query_stems(query: str) -> set[str]:
    return {_stem(w) for w in _TOKEN.findall(query.lower()) if w not in _STOP}


# Lines that carry no content of their own: a markdown heading, a front-matter or rule line, a table's
# separator row, a code fence. Alone as an excerpt they read as "## Summary" or "---".
_BARE = re.compile(r"^(#{1,6}\s.*|#{1,6}|[-=*_]{3,}|\|?[\s:|-]*-{3,}[\s:|-]*\|?|```.*|~~~.*)$")


EXCERPT_CHARS = 240  # an excerpt's length at most (`SearchHit.excerpt`)
# A flattened YAML key whose value is the indented block under it ("bear case:", "  - bias: x, ...").
_KEY_ONLY = re.compile(r"^(\s*)(?:-\s+)?[^\s:][^:]*:\s*$")
_WITHIN_LINE = re.compile(r"(?<=[.!?])\s+")


def _stems_of(text: str) -> set[str]:
    return {_stem(w) for w in _TOKEN.findall(text.lower())}


# A line that starts something of its own: a key, a list item, a table row, a heading, a quote, a fence
_STARTS_ITEM = re.compile(r"^\s*(?:[-*+>|#]|\d+[.)]\s|```|~~~|[^\s:][^:]{0,60}:(?:\s|$))")


_FENCE = re.compile(r"^\s*(```|~~~)")
_LAYOUT = re.compile(r"\S {3,}\S|[\u2500-\u257f]")  # a run of spaces inside a line, box drawing


def _logical_lines(text: str) -> list[str]:
    """The lines of `text` with hard-wrapped prose joined: a line that starts nothing of its own, at
    the indentation of a prose line that ended mid-sentence, continues it (a YAML block scalar's or a
    markdown paragraph's wrapped lines: "... (330% ARR growth)," / "strong cash flow, and ...")."""
    out: list[str] = []
    joinable = False  # whether the last line ended mid-sentence, in a paragraph
    code = False  # inside a fenced code block: its lines stay lines
    for line in text.splitlines():
        if not line.strip() or code:
            joinable = False
            code = code != bool(_FENCE.match(line))
            if line.strip():
                out.append(line.rstrip())
            continue
        indent = len(line) - len(line.lstrip())
        if joinable and indent == len(out[-1]) - len(out[-1].lstrip()) and not _STARTS_ITEM.match(line) \
                and not _LAYOUT.search(line.strip()):
            out[-1] += " " + line.strip()
        else:
            out.append(line.rstrip())
        code = bool(_FENCE.match(line))
        # prose only: a key's value or a list item on one line is complete ("limit: 50" / "end"), and
        # a diagram's or aligned table's lines are lines (a chunk can start inside a code block)
        joinable = not code and not _STARTS_ITEM.match(out[-1]) and not _LAYOUT.search(out[-1].strip()) \
            and out[-1][-1] not in ".!?:;|"
    return out


def _sentences_in_context(text: str) -> list[tuple[str, set[str]]]:
    """Each sentence of `text` (wrapped lines joined) with the stems of the keys it is nested under:
    in flattened YAML a key-only line ("bear case:") names what the indented lines below it are about."""
    out: list[tuple[str, set[str]]] = []
    keys: list[tuple[int, set[str]]] = []  # the open key-only lines: (indent, stems)
    for line in _logical_lines(text):
        indent = len(line) - len(line.lstrip())
        while keys and keys[-1][0] >= indent:
            keys.pop()
        inherited = set().union(*(k for _, k in keys)) if keys else set()
        out += [(s.strip(), inherited) for s in _WITHIN_LINE.split(line) if s.strip()]
        if _KEY_ONLY.match(line):
            keys.append((indent, _stems_of(line)))
    return out


def excerpt(text: str, query: str, max_chars: int = EXCERPT_CHARS) -> str:
    """The sentences sharing most words with the query, in their original order, within `max_chars`;
    with no sentence sharing a word (a semantic match), the passage's first sentences. Headings and
    rule lines are left out where there is anything else. A line nested under a key shares the key's
    words, so a matching "bear case:" comes with the lines that say what the bear case is."""
    stems = query_stems(query)
    nested = _sentences_in_context(text)
    sentences = [s for s, _ in nested]
    if not sentences:
        return ""
    content = [n for n, s in enumerate(sentences) if not _BARE.match(s)] or list(range(len(sentences)))
    overlaps = {n: len(stems & (_stems_of(sentences[n]) | nested[n][1])) for n in content}
    # most shared words first, then earliest; sentences sharing none only when none shares any
    order = sorted(content, key=lambda n: (-overlaps[n], n))
    if overlaps[order[0]] > 0:
        order = [n for n in order if overlaps[n] > 0]
    chosen: list[int] = []
    used = 0
    for n in order:
        length = len(sentences[n]) + 1
        if chosen and used + length > max_chars:
            continue
        chosen.append(n)
        used += length
        if used >= max_chars:
            break
    text = _joined(sentences, sorted(chosen), set(content))
    return text if len(text) <= max_chars else text[: max_chars - 1].rstrip() + "…"


def _joined(sentences: list[str], chosen: list[int], content: set[int]) -> str:
    """The chosen sentences in order, with " … " only where content between them was left out."""
    out = sentences[chosen[0]]
    for before, n in zip(chosen, chosen[1:]):
        gap = any(m in content for m in range(before + 1, n))
        out += (" … " if gap else " ") + sentences[n]
    return out
