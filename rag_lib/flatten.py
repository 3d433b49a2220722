"""Documents → sections: one per top-level YAML key (readable text, not Python reprs) or per
markdown H2 (`_intro` for text before the first H2; `##` inside code fences is not a heading)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from rag_lib.errors import ConfigError
from rag_lib.models import Document, Section

INTRO = "_intro"


@dataclass(frozen=True)
class SectionMapping:
    skip_keys: frozenset[str]
    metadata_keys: frozenset[str]
    types: dict[str, dict[str, Any]] = field(default_factory=dict)
    descriptor_keys: frozenset[str] = frozenset()

    def title(self, doc_type: str, key: str) -> str:
        titles = self.types.get(doc_type, {}).get("titles") or {}
        return str(titles.get(key) or humanise(key))

    def indexes(self, doc_type: str, key: str, value: Any) -> bool:
        return key not in self.skip_keys and key not in (self.types.get(doc_type, {}).get("exclude") or [])

    @property
    def descriptor_names(self) -> frozenset[str]:
        """Section names that describe a YAML document (its bookkeeping keys and metadata scalars):
        search weighs them (`search.descriptor_weight`, `descriptor_weight_other`)."""
        return self.descriptor_keys | self.metadata_keys


@lru_cache(maxsize=8)
def load_mapping(path: Path) -> SectionMapping:
    """Read the section mapping file (see `rag_lib/sections.yaml`)."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read section mapping {path}: {exc}") from exc
    return SectionMapping(
        skip_keys=frozenset(data.get("skip_keys") or []),
        metadata_keys=frozenset(data.get("metadata_keys") or []),
        types=data.get("types") or {},
        descriptor_keys=frozenset(data.get("descriptor_keys") or []),
    )


def humanise(key: str) -> str:
    return re.sub(r"\s+", " ", str(key).replace("_", " ").replace("-", " ")).strip()


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    # Trailing blanks go line by line: the regex `[ \t]+\n` took quadratic time on a long run of spaces.
    return "\n".join(line.rstrip(" \t") for line in str(value).split("\n")).strip()


class _Blank:
    """Blankness of nested values, each container computed once (alias-shared subtrees included)
    and without recursion."""

    def __init__(self) -> None:
        self.memo: dict[int, bool] = {}
        self.keep: list[Any] = []  # holds containers so their ids stay unique while memoized

    def __call__(self, value: Any) -> bool:
        if value is None:
            return True
        if isinstance(value, str):
            return not value.strip()
        if not isinstance(value, (dict, list)):
            return False
        if id(value) in self.memo:
            return self.memo[id(value)]
        stack: list[tuple[Any, bool]] = [(value, False)]
        while stack:
            node, expanded = stack.pop()
            if id(node) in self.memo:
                continue
            children = [c for c in (node.values() if isinstance(node, dict) else node) if isinstance(c, (dict, list))]
            if not expanded:
                stack.append((node, True))
                stack.extend((c, False) for c in children if id(c) not in self.memo)
                continue
            self.keep.append(node)
            self.memo[id(node)] = all(
                self.memo.get(id(c), True) if isinstance(c, (dict, list)) else self(c)
                for c in (node.values() if isinstance(node, dict) else node)
            )
        return self.memo[id(value)]


def _is_blank(value: Any) -> bool:
    return _Blank()(value)


def render(value: Any, indent: int = 0) -> list[str]:
    """Readable lines for a nested YAML value: `key: value`, bullets for lists, nulls dropped.
    Walks with an explicit stack, so depth is bounded by memory, not by Python's recursion limit."""
    blank = _Blank()
    lines: list[str] = []
    if not isinstance(value, (dict, list)):
        if not blank(value):
            pad = "  " * indent
            lines.extend(f"{pad}{line}" for line in _scalar(value).splitlines())
        return lines
    # A frame: (iterator over the container's entries, its indent, (line index, parent pad) of the
    # `- ` bullet to put on the frame's first line when it is a list item, or None).
    stack: list[tuple[Any, int, tuple[int, str] | None]] = [(_entries(value), indent, None)]
    while stack:
        entries, level, bullet = stack[-1]
        pad = "  " * level
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            if bullet is not None and bullet[0] < len(lines):
                start, parent_pad = bullet
                lines[start] = f"{parent_pad}- {lines[start].lstrip()}"
            continue
        key, sub = entry
        if blank(sub):
            continue
        if key is not _ITEM:
            label = humanise(key)
            if isinstance(sub, (dict, list)):
                inline = _inline(sub, blank)
                if inline is not None:
                    lines.append(f"{pad}{label}: {inline}")
                else:
                    lines.append(f"{pad}{label}:")
                    stack.append((_entries(sub), level + 1, None))
            else:
                text = _scalar(sub)
                if "\n" in text:
                    lines.append(f"{pad}{label}:")
                    lines.extend(f"{pad}  {line}" for line in text.splitlines())
                else:
                    lines.append(f"{pad}{label}: {text}")
        elif isinstance(sub, (dict, list)):
            inline = _inline(sub, blank)
            if inline is not None:
                lines.append(f"{pad}- {inline}")
            else:
                stack.append((_entries(sub), level + 1, (len(lines), pad)))
        else:
            text = _scalar(sub)
            lines.append(f"{pad}- {text.replace(chr(10), ' ')}")
    return lines


_ITEM = object()  # the "key" of a list entry


def _entries(value: dict | list):
    return iter(value.items()) if isinstance(value, dict) else ((_ITEM, item) for item in value)


def _inline(value: dict | list, blank=_is_blank) -> str | None:
    """One-line form for small all-scalar dicts/lists (e.g. an entry: date, price, qty)."""
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if not blank(v)]
        if any(isinstance(v, (dict, list)) for _, v in items):
            return None
        text = ", ".join(f"{humanise(k)}: {_scalar(v)}" for k, v in items)
    else:
        items = [v for v in value if not blank(v)]
        if any(isinstance(v, (dict, list)) for v in items):
            return None
        text = "; ".join(_scalar(v) for v in items)
    return text if len(text) <= 160 and "\n" not in text else None


def _top_key(line: str) -> str | None:
    """The key of a `key: ...` / `"key": ...` line (what `^(['"]?)([^\\s#'"][^:]*?)\\1\\s*:(\\s|$)`
    matched), found with one `find` instead of a regex that backtracks quadratically on spaces."""
    quote = line[:1] if line[:1] in ("'", '"') else ""
    start = len(quote)
    if start >= len(line) or line[start].isspace() or line[start] in "#'\"":
        return None
    colon = line.find(":", start + 1)  # the first character may itself be a colon
    if colon < 0 or (colon + 1 < len(line) and not line[colon + 1].isspace()):
        return None
    key = line[start:colon].rstrip()
    if quote:
        if not key.endswith(quote) or len(key) < 2:
            return None
        key = key[:-1]
    return key or None


def key_lines(raw_text: str) -> dict[str, int]:
    """Line number (1-based) of each top-level key in the YAML source, for source positions."""
    found: dict[str, int] = {}
    for number, line in enumerate(raw_text.splitlines(), start=1):
        key = _top_key(line)
        if key is not None and key not in found:
            found[key] = number
    return found


def flatten_yaml(doc: Document, mapping: SectionMapping, raw_text: str | None = None) -> list[Section]:
    lines_of = key_lines(raw_text) if raw_text else doc.key_lines
    # `_indexing: {descriptors: false}` opts a document out of descriptor sections (stored texts do:
    # their `_meta` only repeats the id, type and ticker given with the text)
    indexing = doc.body.get("_indexing")
    descriptors = not (isinstance(indexing, dict) and indexing.get("descriptors") is False)
    sections: list[Section] = []
    for key, value in doc.body.items():
        key = str(key)
        if not mapping.indexes(doc.doc_type, key, value) or (not descriptors and key in mapping.descriptor_names):
            continue
        body_lines = render(value) if isinstance(value, (dict, list)) else render(value)
        text = "\n".join(body_lines)
        if text and not isinstance(value, (dict, list)):
            text = f"{humanise(key)}: {text}" if "\n" not in text else f"{humanise(key)}:\n{text}"
        sections.append(
            Section(
                name=key,
                title=mapping.title(doc.doc_type, key),
                ordinal=len(sections),
                text=text,
                line=lines_of.get(key, 0),
            )
        )
    return sections


_FENCE = re.compile(r"^\s*(```|~~~)")


def flatten_markdown(text: str) -> list[Section]:
    """Split on ATX `## ` lines outside fenced code; keep each section's exact source text."""
    sections: list[Section] = []
    lines = text.splitlines(keepends=True)
    in_fence = False
    name, start_char, start_line, buf = INTRO, 0, 1, []
    offset = 0

    def close() -> None:
        body = "".join(buf).strip("\n")
        if name == INTRO and not body.strip():
            return
        sections.append(Section(name=name, title=name, ordinal=len(sections), text=body,
                                char_start=start_char, line=start_line))

    for number, line in enumerate(lines, start=1):
        if _FENCE.match(line):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            close()
            name = line[3:].strip().rstrip("#").strip()
            start_char, start_line, buf = offset, number, []
        buf.append(line)
        offset += len(line)
    close()
    return sections


def flatten(doc: Document, mapping: SectionMapping, raw_text: str | None = None) -> list[Section]:
    """Sections of a document, in source order, each under its own name (see `named_apart`).
    Empty sections are kept (and never chunked)."""
    if doc.format == "yaml":
        return named_apart(flatten_yaml(doc, mapping, raw_text))
    if doc.format == "markdown":
        return named_apart(flatten_markdown(doc.body))
    text = f"{doc.title}\n\n{doc.body}" if doc.title else doc.body
    return [Section(name="text", title=doc.title or "text", ordinal=0, text=text)]


def named_apart(sections: list[Section]) -> list[Section]:
    """The sections with a name each their own: a name met again (a markdown heading written twice,
    a note pasted twice, a `## _intro` heading, YAML keys 1 and '1') becomes 'name (2)', 'name (3)'…,
    skipping names the document writes itself. A section's name is its unit id and its key in the
    store, where a repeated one failed the whole document; its title (what the model and the reader
    see) stays as written."""
    written = {s.name for s in sections}
    used: set[str] = set()
    out = []
    for section in sections:
        name, n = section.name, 1
        while name in used or (n > 1 and name in written):  # a later section keeps the name it was written with
            n += 1
            name = f"{section.name} ({n})"
        used.add(name)
        out.append(section if name == section.name else dataclasses.replace(section, name=name))
    return out
