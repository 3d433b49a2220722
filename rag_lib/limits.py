"""Parse limits checked BEFORE a file is parsed into Python objects: nesting depth, nodes and
characters after YAML alias expansion, longest line and value, text per section.

The checks are linear and never recurse: YAML is read as libyaml parser events (a state machine;
composing the tree is what recurses, and libyaml slows quadratically with depth, so the scan stops
at the first event over a limit), JSON with a bracket scan outside strings. A file over a limit is
a `LimitExceeded` with a stable reason key, a detail naming the limit, its setting and where, and
that setting's name (a skip records it: raising the setting has the file read again)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from rag_lib.config import ParseLimits, Settings

_SETTING = "RAG_LIMITS__"


@dataclass(frozen=True)
class LimitExceeded:
    """Why a text was refused: `reason` is a stable key, `detail` one line for people, `setting` the
    limit it is over (`limits.max_depth`; None when no setting would accept it)."""

    reason: str
    detail: str
    setting: str | None = None


def _where(mark) -> str:
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _over(reason: str, text: str, name: str) -> LimitExceeded:
    """A refusal for being over `limits.<name>`, its detail saying how to accept the text."""
    return LimitExceeded(reason, f"{text}; raise limits.{name} ({_SETTING}{name.upper()}) to accept it", f"limits.{name}")


def setting_values(settings: Settings, names: Iterable[str]) -> dict[str, Any]:
    """The current value of each named setting (`max_file_bytes`, `limits.max_depth`, ...) of a
    `rag_lib.config.Settings`: what a skip over one of them was judged under."""
    values = {}
    for name in names:
        value = settings
        for part in name.split("."):
            value = getattr(value, part, None)
        values[name] = value
    return values


def check_lines(text: str, limits: ParseLimits) -> LimitExceeded | None:
    """The first line longer than `max_line_chars`, if any (one pass, no regex)."""
    if len(text) <= limits.max_line_chars:
        return None
    for number, line in enumerate(text.split("\n"), start=1):
        if len(line) > limits.max_line_chars:
            return _over("line_too_long", f"line {number} has {len(line)} characters, over the limit of "
                         f"{limits.max_line_chars}", "max_line_chars")
    return None


@dataclass
class _Frame:
    anchor: str | None
    mark: object
    nodes: int = 1
    chars: int = 0
    height: int = 0  # levels of collections below this one (after alias expansion)


def check_yaml(text: str, limits: ParseLimits, what: str = "YAML") -> LimitExceeded | None:
    """Scan libyaml events once: depth, nodes and characters (aliases counted as expanded),
    value length, recursive aliases and per-top-level-key size. Malformed YAML is left to the
    loader (it reports the position)."""
    too_long = check_lines(text, limits)
    if too_long:
        return too_long
    stack: list[_Frame] = []
    anchors: dict[str, tuple[int, int, int]] = {}  # closed anchor -> (nodes, chars, height)
    open_anchors: set[str] = set()
    total_nodes = total_chars = aliases = 0
    # Per top-level key of the root mapping: the key's text and the root's chars before its value.
    expecting_key = True
    section_key: str | None = None
    section_mark = None
    section_start = 0

    def over_size(mark) -> LimitExceeded | None:
        if total_nodes > limits.max_nodes:
            if aliases:
                return _over("yaml_aliases", f"{what} aliases expand to over {limits.max_nodes} nodes{_where(mark)}",
                             "max_nodes")
            return _over("too_many_nodes", f"{what} has over {limits.max_nodes} nodes{_where(mark)}", "max_nodes")
        if total_chars > limits.max_document_chars:
            if aliases:
                return _over("yaml_aliases", f"{what} aliases expand to over {limits.max_document_chars} "
                             f"characters{_where(mark)}", "max_document_chars")
            return _over("too_large", f"{what} holds over {limits.max_document_chars} characters of text"
                         f"{_where(mark)}", "max_document_chars")
        return None

    def section_done(chars_after: int) -> LimitExceeded | None:
        size = chars_after - section_start
        if section_key is not None and size > limits.max_section_chars:
            return _over("section_too_large", f"section '{section_key[:80]}'{_where(section_mark)} holds "
                         f"{size} characters of text, over the limit of {limits.max_section_chars}", "max_section_chars")
        return None

    def add(nodes: int, chars: int, height: int, mark) -> LimitExceeded | None:
        """Account a finished child node to its parent (and the root section it belongs to)."""
        nonlocal expecting_key, section_key, section_mark, section_start
        if not stack:
            return None
        parent = stack[-1]
        parent.nodes += nodes
        parent.chars += chars
        parent.height = max(parent.height, height)
        if len(stack) == 1 and parent.anchor != "\x00seq":
            if expecting_key:
                section_start = parent.chars
            else:
                problem = section_done(parent.chars)
                if problem:
                    return problem
            expecting_key = not expecting_key
        return None

    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            mark = event.start_mark
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) + 1 > limits.max_depth:
                    return _over("too_deep", f"{what} nests deeper than {limits.max_depth} levels{_where(mark)}",
                                 "max_depth")
                if event.anchor:
                    open_anchors.add(event.anchor)
                frame = _Frame(event.anchor, mark)
                if not stack and isinstance(event, yaml.SequenceStartEvent):
                    frame.anchor = event.anchor or "\x00seq"  # root sequences have no sections
                stack.append(frame)
                total_nodes += 1
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                frame = stack.pop()
                if frame.anchor and frame.anchor != "\x00seq":
                    open_anchors.discard(frame.anchor)
                    anchors[frame.anchor] = (frame.nodes, frame.chars, frame.height + 1)
                problem = add(frame.nodes, frame.chars, frame.height + 1, mark)
                if problem:
                    return problem
                continue
            elif isinstance(event, yaml.ScalarEvent):
                size = len(event.value)
                if size > limits.max_value_chars:
                    return _over("value_too_long", f"a {what} value of {size} characters{_where(mark)} is over the "
                                 f"limit of {limits.max_value_chars}", "max_value_chars")
                if event.anchor:
                    anchors[event.anchor] = (1, size, 0)
                if len(stack) == 1 and expecting_key and stack[0].anchor != "\x00seq":
                    section_key, section_mark = event.value, mark
                total_nodes += 1
                total_chars += size
                problem = over_size(mark) or add(1, size, 0, mark)
                if problem:
                    return problem
                continue
            elif isinstance(event, yaml.AliasEvent):
                aliases += 1
                if event.anchor in open_anchors:
                    return LimitExceeded("yaml_aliases", f"{what} alias *{event.anchor}{_where(mark)} refers to a "
                                         "node that contains it (a recursive structure); remove the alias")
                nodes, chars, height = anchors.get(event.anchor, (1, 0, 0))
                if len(stack) + height > limits.max_depth:
                    return _over("too_deep", f"{what} alias *{event.anchor}{_where(mark)} nests deeper than "
                                 f"{limits.max_depth} levels when expanded", "max_depth")
                if len(stack) == 1 and expecting_key and stack[0].anchor != "\x00seq":
                    section_key, section_mark = f"*{event.anchor}", mark
                total_nodes += nodes
                total_chars += chars
                problem = over_size(mark) or add(nodes, chars, height, mark)
                if problem:
                    return problem
                continue
            else:
                continue
            problem = over_size(mark)
            if problem:
                return problem
    except yaml.YAMLError:
        return None  # the loader reports malformed YAML with its position
    return None


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def check_json(text: str, limits: ParseLimits, what: str = "JSON") -> LimitExceeded | None:
    """Nesting depth of one JSON text, scanning brackets outside strings (linear, no recursion)."""
    if text.count("[") + text.count("{") <= limits.max_depth:
        return None
    depth = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            if depth > limits.max_depth:
                return _over("too_deep", f"{what} nests deeper than {limits.max_depth} levels", "max_depth")
        else:
            depth -= 1
    return None
