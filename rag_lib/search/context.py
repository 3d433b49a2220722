"""Context assembly for an LLM prompt: the best distinct passages within a token budget, in reading
order, each with a citation; and a check that a quoted passage really is in the cited chunk."""

from __future__ import annotations

import datetime as dt
import re
import unicodedata
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from rag_lib.models import SearchHit

NEAR_DUPLICATE = 0.8  # share of a passage's word 5-grams already in the context


@dataclass
class Citation:
    ref: str  # the marker in the context text: [1], [2], ...
    unit_id: str
    doc_id: str
    path: str
    section: str
    section_path: str
    chunk_id: str
    doc_type: str
    score: float
    text: str
    ticker: str | None = None
    doc_date: dt.date | None = None
    tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["doc_date"] = self.doc_date.isoformat() if self.doc_date else None
        return out


@dataclass
class ContextResult:
    query: str
    mode: str
    context: str
    citations: list[Citation]
    tokens: int
    token_budget: int
    dropped: dict[str, int] = field(default_factory=dict)  # duplicates / over budget

    def verify(self, ref: str, quote: str) -> bool:
        """True when `quote` appears in the passage cited as `ref` ("[2]", "2", a unit or chunk id)."""
        key = ref.strip()
        if key.isdigit():
            key = f"[{key}]"
        for c in self.citations:
            if key in (c.ref, c.unit_id, c.chunk_id):
                if quote_in_text(quote, c.text):
                    return True
        return False

    def to_dict(self) -> dict[str, Any]:
        return {
            "query": self.query, "mode": self.mode, "context": self.context,
            "citations": [c.to_dict() for c in self.citations], "tokens": self.tokens,
            "token_budget": self.token_budget, "dropped": self.dropped,
        }


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"').replace("\u201d", '"')
    return re.sub(r"\s+", " ", text).strip().lower()


def quote_in_text(quote: str, text: str) -> bool:
    """A quote matches when it appears verbatim up to case, whitespace and typographic quotes; an
    elided quote ("first part … last part") needs every part, in order."""
    parts = [p for p in (_normalise(x) for x in re.split(r"\.\.\.|…", quote)) if p]
    if not parts:
        return False
    haystack = _normalise(text)
    at = 0
    for part in parts:
        found = haystack.find(part, at)
        if found < 0:
            return False
        at = found + len(part)
    return True


def _shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def header(ref: str, hit: SearchHit) -> str:
    parts = [hit.path, f"§ {hit.section_path or hit.section}"]
    if hit.doc_date:
        parts.append(hit.doc_date.isoformat())
    return f"{ref} {' | '.join(parts)}"


def assemble(
    query: str,
    mode: str,
    hits: list[SearchHit],
    count: Callable[[str], int],
    token_budget: int,
    positions: dict[str, tuple[int, int]] | None = None,
    after: Callable[[SearchHit], bool] | None = None,
    after_heading: str = "",
    doc_order: Callable[[SearchHit], Any] | None = None,
) -> ContextResult:
    """Pick passages best first (skipping duplicates and what does not fit), then order them by
    document (best document first, or by `doc_order`: a timeline's dates) and position in the
    document; never exceeds `token_budget`. Passages `after` accepts go last, under `after_heading`
    (a timeline's learnings and undated passages: picked in rank order, but not read between the
    dated ones)."""
    chosen: list[SearchHit] = []
    seen_text: set[str] = set()
    seen_shingles: set[tuple[str, ...]] = set()
    dropped = {"duplicate": 0, "over_budget": 0}
    used = 0
    heading_cost = count(after_heading) + 2 if after_heading else 0
    last: set[str] = set()  # chunk ids of the chosen passages that go after the others
    for hit in hits:
        key = _normalise(hit.text)
        shingles = _shingles(hit.text)
        if key in seen_text or (shingles and len(shingles & seen_shingles) / len(shingles) >= NEAR_DUPLICATE):
            dropped["duplicate"] += 1
            continue
        cost = count(header("[00]", hit) + "\n" + hit.text) + 2
        later = after is not None and after(hit)
        if later and not last:
            cost += heading_cost  # the first passage after the others brings their heading
        if used + cost > token_budget:
            dropped["over_budget"] += 1
            continue
        chosen.append(hit)
        if later:
            last.add(hit.chunk_id)
        used += cost
        seen_text.add(key)
        seen_shingles |= shingles
    doc_rank: dict[str, int] = {}
    for n, hit in enumerate(chosen):
        doc_rank.setdefault(hit.path, n)
    positions = positions or {}
    chosen.sort(key=lambda h: (h.chunk_id in last, doc_order(h) if doc_order else 0, doc_rank[h.path],
                               positions.get(h.chunk_id, (0, 0))))
    citations: list[Citation] = []
    blocks: list[str] = []
    for n, hit in enumerate(chosen, 1):
        ref = f"[{n}]"
        block = passage = header(ref, hit) + "\n" + hit.text
        if after_heading and hit.chunk_id in last and (n == 1 or chosen[n - 2].chunk_id not in last):
            block = after_heading + "\n\n" + block  # dropped with its first passage if that must go
        blocks.append(block)
        citations.append(Citation(
            ref=ref, unit_id=hit.unit_id, doc_id=hit.doc_id, path=hit.path, section=hit.section,
            section_path=hit.section_path, chunk_id=hit.chunk_id, doc_type=hit.doc_type, score=round(hit.score, 6),
            text=hit.text, ticker=hit.ticker, doc_date=hit.doc_date, tokens=count(passage),
        ))
    text = "\n\n".join(blocks)
    tokens = count(text) if text else 0
    while tokens > token_budget and blocks:  # tokenisation across joins can differ by a token or two
        blocks.pop()
        citations.pop()
        dropped["over_budget"] += 1
        text = "\n\n".join(blocks)
        tokens = count(text) if text else 0
    return ContextResult(query, mode, text, citations, tokens, token_budget, dropped)
