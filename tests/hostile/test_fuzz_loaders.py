"""Hypothesis fuzzing of the YAML, markdown and JSONL loaders and of flattening: any input either
loads (and flattens) or is skipped with a known reason; no exception escapes and nothing hangs
(each example has a deadline). Small limits make every limit's path reachable."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
import yaml

from rag_lib.config import ParseLimits
from rag_lib.documents import load_file
from rag_lib.flatten import _scalar, _top_key, flatten, load_mapping
from rag_lib.config import DEFAULT_SECTIONS_FILE
from rag_lib.models import Document, Skipped

REASONS = {
    "unknown_format", "too_large", "empty", "binary", "not_utf8", "malformed_yaml", "unsupported_structure",
    "template", "too_deep", "yaml_aliases", "too_many_nodes", "line_too_long", "value_too_long",
    "section_too_large", "malformed_json", "missing_id", "invalid_id", "duplicate_id", "invalid_character",
}  # not `load_error`: that is an unexpected exception, which the fuzzer must not find
LIMITS = ParseLimits(max_depth=12, max_nodes=300, max_document_chars=5000, max_section_chars=3000,
                     max_line_chars=20_000, max_value_chars=1000, max_id_chars=40)
MAPPING = load_mapping(DEFAULT_SECTIONS_FILE)
SAFE_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs", "Cc", "Zl", "Zp"))
FUZZ = settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow], database=None)
WORKDIR = Path(tempfile.mkdtemp(prefix="rag-fuzz-"))

YAML_PIECES = ["[", "]", "{", "}", ", ", ": ", "- ", "\n", "\n  ", "\n    - ", "&a ", "&b ", "*a", "*b", "<<: ",
               "? ", "'", '"', "#", "|\n  ", ">\n  ", "!!str ", "!!python/object:os.system ", "---\n", "...\n",
               "key", "value", "2024-02-30", "0x1F", "1e400", "null", "~", "{X}", "{TICKER}", " " * 50, "\t", "\x00",
               "\u2028", "\ufeff", "é", "NVDA", "_meta", "type: stock_analysis\n", "\\"]


@st.composite
def yaml_with_aliases(draw) -> str:
    """Well-formed flow YAML with anchors, aliases (to earlier anchors) and deep nesting."""
    anchors: list[str] = []

    def node(depth: int) -> str:
        kind = draw(st.sampled_from(["scalar", "alias", "seq", "map"] if depth < 6 else ["scalar", "alias"]))
        if kind == "alias" and anchors:
            return "*" + draw(st.sampled_from(anchors))
        anchor = ""
        if draw(st.integers(0, 3)) == 0:
            anchor = f"&n{len(anchors)} "
        if kind in ("scalar", "alias"):
            value = draw(st.text(SAFE_CHARS, max_size=12)) * draw(st.sampled_from([1, 1, 20, 200]))
            text = anchor + json.dumps(value, ensure_ascii=False)
        elif kind == "seq":
            text = anchor + "[" + ", ".join(node(depth + 1) for _ in range(draw(st.integers(0, 6)))) + "]"
        else:
            text = anchor + "{" + ", ".join(f"k{i}: {node(depth + 1)}" for i in range(draw(st.integers(0, 4)))) + "}"
        if anchor:
            anchors.append(anchor[1:-1])
        return text

    lines = []
    for i in range(draw(st.integers(1, 4))):
        nest = draw(st.sampled_from([0, 0, 3, 11, 12, 30]))  # around max_depth
        lines.append(f"key_{i}: {'[' * nest}{node(1)}{']' * nest}")
    if anchors:  # an alias fan-out: small text, large expansion
        refs = ["*" + a for a in anchors] * draw(st.sampled_from([0, 1, 9, 40]))
        lines.append(f"fanout: [{', '.join(refs)}]")
    return "\n".join(lines) + "\n"


block_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=60),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=60,
)


def yaml_like() -> st.SearchStrategy[str]:
    return st.one_of(
        yaml_with_aliases(),
        st.dictionaries(st.text(max_size=12), block_values, min_size=1, max_size=6).map(
            lambda d: yaml.safe_dump(d, allow_unicode=True)),
        st.lists(st.sampled_from(YAML_PIECES), max_size=60).map(lambda parts: "a: " + "".join(parts)),
        st.text(max_size=300),
    )


def check(path: Path) -> list[Document | Skipped]:
    items = load_file(path, path.parent, "fuzz", 100_000, LIMITS)
    assert items, "a file always yields a document or a skip"
    for item in items:
        event(item.reason if isinstance(item, Skipped) else "loaded")  # --hypothesis-show-statistics
        if isinstance(item, Skipped):
            assert item.reason in REASONS, (item.reason, item.detail)
            assert item.detail
        else:
            assert isinstance(item, Document)
            raw = path.read_text(encoding="utf-8-sig") if item.format == "yaml" else None
            sections = flatten(item, MAPPING, raw)
            assert all(isinstance(s.text, str) for s in sections)
    return items


@FUZZ
@given(yaml_like())
def test_yaml_loader_loads_or_skips(text: str):
    path = WORKDIR / "doc.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    check(path)


@FUZZ
@given(yaml_like(), st.text(max_size=300), st.sampled_from(["## ", "# ", "```\n", "~~~\n", "", "\n## A\n"]))
def test_markdown_loader_loads_or_skips(front: str, body: str, heading: str):
    path = WORKDIR / "doc.md"
    path.write_bytes(f"---\n{front}\n---\n{heading}{body}".encode("utf-8", "surrogatepass"))
    check(path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)
record_ids = st.one_of(st.text(max_size=50), st.integers(), st.sampled_from(
    ["../../etc/passwd", "/abs", "a/../b", "..", ".", "ok.md", "a\x00b", "x\u202ey", " pad", "#", "a#b"]), json_values)


@FUZZ
@given(st.lists(st.one_of(
    st.fixed_dictionaries({"_id": record_ids, "text": json_values}, optional={"title": json_values}).map(json.dumps),
    st.text(max_size=80),
    st.integers(1, 40).map(lambda n: '{"_id": "d", "text": "x", "m": ' + "[" * n + "]" * n + "}"),
), max_size=12))
@example(lines=["\x85"])  # only a character str.splitlines() breaks at: no records, a skip
@example(lines=['{"_id": "a", "text": "one\u2028record"}'])  # raw U+2028 inside a JSON string
def test_jsonl_loader_loads_or_skips(lines: list[str]):
    path = WORKDIR / "records.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
    items = check(path)
    docs = [i for i in items if isinstance(i, Document)]
    assert len({d.path for d in docs}) == len(docs)  # no record replaces another
    for doc in docs:
        assert doc.path == f"records.jsonl#{doc.doc_id}"
        assert ".." not in re.split(r"[/\\]", doc.doc_id) and "\x00" not in doc.doc_id


KEY_LINE = re.compile(r"^(['\"]?)([^\s#'\"][^:]*?)\1\s*:(\s|$)")  # the old quadratic pattern: the spec
line_text = st.text(alphabet=st.sampled_from(list("ab :'\"#\t-\u00a0")), max_size=20)


@settings(max_examples=300, deadline=None, database=None)
@given(line_text)
def test_linear_key_finder_agrees_with_the_old_pattern(line: str):
    match = KEY_LINE.match(line)
    assert _top_key(line) == (match.group(2) if match else None)


@settings(max_examples=300, deadline=None, database=None)
@given(st.text(alphabet=st.sampled_from(list("ab \t\n\r")), max_size=30))
def test_linear_trailing_blank_removal_agrees_with_the_old_pattern(text: str):
    assert _scalar(text) == re.sub(r"[ \t]+\n", "\n", text).strip()


def test_a_jsonl_record_may_hold_unicode_line_separators():
    # JSON strings may hold U+0085/U+2028/U+2029 unescaped; records end at "\n" (and "\r\n") only
    path = WORKDIR / "separators.jsonl"
    path.write_text('{"_id": "a", "text": "one\u2028record\u0085still one"}\r\n{"_id": "b", "text": "two"}\n',
                    encoding="utf-8")
    docs = [i for i in load_file(path, path.parent, "fuzz", 100_000, LIMITS) if isinstance(i, Document)]
    assert [d.doc_id for d in docs] == ["a", "b"] and "one\u2028record\u0085still one" in docs[0].body
