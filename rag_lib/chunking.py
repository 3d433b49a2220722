"""Sections → chunks that fit the embedding model, prefix included, with nothing truncated.

A long section is split on its own structure first (sub-keys / H3), then paragraphs (markdown
tables and fenced code stay whole when they fit), lines, sentences and, last, token windows.
The pieces are packed greedily up to the budget with a piece-level overlap. A chunk's text is
always a contiguous span of its section's text, so its position in the source is exact.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from rag_lib.config import ChunkSettings
from rag_lib.models import Chunk, Document, Section
from rag_lib.tokens import SpanCounter, Tokenizer

CHUNKER_VERSION = "2"  # 2: a chunk's section path names its outermost YAML key, no markdown "key"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(\[])")
_FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Span:
    start: int
    end: int


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def context_prefix(doc: Document, section: Section) -> str:
    """`[doc_type] [ticker] [section]`: tells the model (and lexical search) where a chunk lives."""
    parts = [doc.doc_type] + ([doc.ticker] if doc.ticker else []) + [section.title]
    return " ".join(f"[{p}]" for p in parts)


def chunk_id(collection: str, path: str, section: str, ordinal: int, text_hash: str) -> str:
    return sha256(f"{collection}\x00{path}\x00{section}\x00{ordinal}\x00{text_hash}")[:32]


# ---- splitting -------------------------------------------------------------------------------

def _line_spans(text: str, span: Span) -> list[tuple[int, int, str]]:
    out, pos = [], span.start
    for line in text[span.start : span.end].splitlines(keepends=True):
        out.append((pos, pos + len(line), line))
        pos += len(line)
    return out


def _group(lines: list[tuple[int, int, str]], starts_group) -> list[Span]:
    groups: list[Span] = []
    cur_start: int | None = None
    cur_end = 0
    for start, end, line in lines:
        if cur_start is not None and starts_group(line):
            groups.append(Span(cur_start, cur_end))
            cur_start = None
        if cur_start is None:
            cur_start = start
        cur_end = end
    if cur_start is not None:
        groups.append(Span(cur_start, cur_end))
    return groups


def _by_structure(text: str, span: Span, markdown: bool) -> list[Span]:
    """Markdown: H3 and deeper headings. YAML text: lines at the span's shallowest indent."""
    lines = _line_spans(text, span)
    if markdown:
        return _group(lines, lambda line: bool(re.match(r"^#{3,6} ", line)))
    indents = [len(line) - len(line.lstrip(" ")) for _, _, line in lines if line.strip()]
    base = min(indents) if indents else 0
    return _group(lines, lambda line: line.strip() != "" and len(line) - len(line.lstrip(" ")) == base)


def _by_paragraph(text: str, span: Span) -> list[Span]:
    """Blank-line separated blocks; a fenced code block is one block even with blank lines."""
    blocks: list[Span] = []
    in_fence = False
    cur_start: int | None = None
    cur_end = span.start
    for start, end, line in _line_spans(text, span):
        if _FENCE.match(line):
            in_fence = not in_fence
        if not line.strip() and not in_fence:
            if cur_start is not None:
                blocks.append(Span(cur_start, cur_end))
                cur_start = None
            continue
        if cur_start is None:
            cur_start = start
        cur_end = end
    if cur_start is not None:
        blocks.append(Span(cur_start, cur_end))
    return blocks


def _by_line(text: str, span: Span) -> list[Span]:
    return [Span(s, e) for s, e, line in _line_spans(text, span) if line.strip()]


def _by_sentence(text: str, span: Span) -> list[Span]:
    out, pos = [], span.start
    for match in _SENTENCE_END.finditer(text, span.start, span.end):
        out.append(Span(pos, match.start()))
        pos = match.end()
    out.append(Span(pos, span.end))
    return [s for s in out if text[s.start : s.end].strip()]


class Chunker:
    """Splits sections into chunks whose embed text fits `tokenizer.limit`."""

    def __init__(self, tokenizer: Tokenizer, settings: ChunkSettings):
        self.tok = tokenizer
        self.settings = settings
        self.limit = tokenizer.limit

    def _leaves(self, counter: SpanCounter, span: Span, budget: int, level: int,
                markdown: bool) -> list[tuple[Span, int]]:
        text = counter.text
        tokens = counter.count(span.start, span.end)
        if tokens <= budget:
            return [(span, tokens)]
        splitters = [
            lambda s: _by_structure(text, s, markdown),
            lambda s: _by_paragraph(text, s),
            lambda s: _by_line(text, s),
            lambda s: _by_sentence(text, s),
        ]
        for lvl in range(level, len(splitters)):
            parts = splitters[lvl](span)
            if len(parts) > 1:
                out: list[tuple[Span, int]] = []
                for part in parts:
                    out.extend(self._leaves(counter, part, budget, lvl, markdown))
                return out
        # Last resort: consecutive token windows (no words lost, none cut mid-token).
        piece = text[span.start : span.end]
        return [
            (Span(span.start + a, span.start + b), counter.count(span.start + a, span.start + b))
            for a, b in self.tok.windows(piece, budget, self.settings.overlap_tokens)
        ]

    def _pack(self, text: str, leaves: list[tuple[Span, int]], budget: int, carry_headings: bool = True) -> list[Span]:
        """Greedy packing with piece-level overlap; a heading never ends a chunk (it moves on
        with the text it introduces, even if that needs a re-split with a tighter budget) unless
        `carry_headings` is off."""
        chunks: list[Span] = []
        current: list[tuple[Span, int]] = []

        def is_heading(leaf: tuple[Span, int]) -> bool:
            piece = text[leaf[0].start : leaf[0].end].strip()
            return "\n" not in piece and bool(re.match(r"^#{1,6} ", piece))

        for leaf in leaves:
            if current and sum(t for _, t in current) + leaf[1] > budget:
                carry: list[tuple[Span, int]] = []
                while carry_headings and current and is_heading(current[-1]):
                    carry.insert(0, current.pop())
                if current:
                    chunks.append(Span(current[0][0].start, current[-1][0].end))
                    tail: list[tuple[Span, int]] = []
                    for prev in reversed(current):
                        too_big = sum(t for _, t in tail) + prev[1] > self.settings.overlap_tokens
                        if too_big or len(tail) + 1 >= len(current):
                            break
                        tail.insert(0, prev)
                    fits = sum(t for _, t in tail + carry) + leaf[1] <= budget
                    current = (tail + carry) if fits else carry
                else:
                    current = carry
            current.append(leaf)
        if current:
            chunks.append(Span(current[0][0].start, current[-1][0].end))
        return chunks

    def split_section(self, doc: Document, section: Section,
                      counter: SpanCounter | None = None) -> list[tuple[Span, str, int]]:
        """(span in section text, embed text, token count) for each chunk of one section."""
        text = section.text
        if not text.strip():
            return []
        counter = counter or self.tok.span_counter(text)
        prefix = context_prefix(doc, section) + "\n"
        prefix_tokens = self.tok.count(prefix)
        budget = min(self.settings.max_tokens, self.limit) - prefix_tokens
        if budget < 16:
            budget = self.limit - prefix_tokens
        start = len(text) - len(text.lstrip())
        whole = Span(start, len(text.rstrip()))
        result: list[tuple[Span, str, int]] = []
        pending = self._pack(text, self._leaves(counter, whole, budget, 0, doc.format == "markdown"), budget)
        while pending:
            span = pending.pop(0)
            embed_text = prefix + text[span.start : span.end]
            # the prefix ends in a newline: where words are split at whitespace, its tokens and the
            # span's add up to the embed text's
            tokens = (prefix_tokens + counter.count(span.start, span.end) if self.tok.splits_on_whitespace
                      else self.tok.count(embed_text))
            if tokens > self.limit:
                # A heading kept with its text, or boundary effects, made a packed chunk overflow:
                # re-split it with a tighter budget.
                pending[:0] = self._resplit(counter, span, budget - (tokens - self.limit) - 8,
                                            self.limit - prefix_tokens - 4, doc.format == "markdown")
                continue
            result.append((span, embed_text, tokens))
        return result

    def _resplit(self, counter: SpanCounter, span: Span, tighter: int, room: int, markdown: bool) -> list[Span]:
        """An overflowing chunk's span packed again within `tighter` tokens; always smaller pieces,
        so re-splitting ends: when packing gives the same span back (a heading and the paragraph
        after it over the budget together), the heading ends a chunk of its own; when even that
        does not split it, or the budget is pathological (a giant heading), plain token windows of
        `room` tokens."""
        if tighter >= 16:
            leaves = self._leaves(counter, span, tighter, 0, markdown)
            for carry_headings in (True, False):
                packed = self._pack(counter.text, leaves, tighter, carry_headings)
                if packed != [span]:
                    return packed
        piece = counter.text[span.start : span.end]
        return [Span(span.start + a, span.start + b) for a, b in self.tok.windows(piece, room)]

    def chunk(self, doc: Document, sections: list[Section]) -> list[Chunk]:
        """Chunks of a document, in order, with deterministic ids."""
        chunks: list[Chunk] = []
        for section in sections:
            counter = self.tok.span_counter(section.text)
            section.token_count = counter.count(0, len(section.text))
            own_start = 0  # where the chunk's text stops repeating the chunk before (overlap)
            for n, (span, embed_text, tokens) in enumerate(self.split_section(doc, section, counter)):
                text_hash = sha256(embed_text)
                chunks.append(
                    Chunk(
                        chunk_id=chunk_id(doc.collection, doc.path, section.name, n, text_hash),
                        collection=doc.collection,
                        path=doc.path,
                        doc_id=doc.doc_id,
                        doc_type=doc.doc_type,
                        section=section.name,
                        section_path=_section_path(section, span, doc.format, own_start),
                        ordinal=len(chunks),
                        text=section.text[span.start : span.end],
                        embed_text=embed_text,
                        token_count=tokens,
                        content_hash=text_hash,
                        char_start=section.char_start + span.start,
                        char_end=section.char_start + span.end,
                        ticker=doc.ticker,
                        doc_date=doc.doc_date,
                        metadata={"section_title": section.title, "line": section.line, "part": n},
                    )
                )
                own_start = span.end
        return chunks


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _section_path(section: Section, span: Span, doc_format: str, own_start: int = 0) -> str:
    """`section > sub-heading/sub-key` of the span, so a result says where inside it lives: a heading
    on its first line; in YAML, the top-level key under which the span's own text begins (from
    `own_start`, past the overlap repeated from the chunk before: the indented tail of another key).
    Markdown and JSONL text has no keys (a code line or "Note:" named none)."""
    text = section.text
    first = text[span.start : span.end].lstrip().split("\n", 1)[0]
    heading = re.match(r"^#{3,6} (.+)$", first)
    if heading:
        return f"{section.name} > {heading.group(1).strip()}"
    if doc_format != "yaml" or span.start == 0:
        return section.name
    lines: list[tuple[int, str]] = []  # (offset, line) of the section's non-blank lines
    at = 0
    for line in text.split("\n"):
        if line.strip():
            lines.append((at, line))
        at += len(line) + 1
    begin = max(span.start, own_start)
    i = next((n for n, (at, line) in enumerate(lines) if at + len(line) > begin and at < span.end), None)
    if i is None:
        return section.name
    top = min(_indent(line) for _, line in lines)
    while i > 0 and _indent(lines[i][1]) > top:  # up to the top-level key that holds it
        i -= 1
    key = re.match(r"^-?\s*([^:\n]{1,60}):", lines[i][1].lstrip())
    return f"{section.name} > {key.group(1).strip()}" if key else section.name
