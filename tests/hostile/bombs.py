"""Hostile input files, generated on demand (no bomb is committed): each case is a file name, its
bytes, and the skip reason the loaders must give it (None: it must load, quickly)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str  # file name under the corpus root
    reason: str | None  # expected skip reason; None = ingested normally
    data: bytes
    skipped_path: str | None = None  # where the skip is recorded (default: the file's path)


def alias_bomb(levels: int, width: int = 9) -> str:
    """`levels` levels of `width` aliases each: 292 bytes expand to 9**6 = 531,441 scalars at 6."""
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    names = "abcdefghijklmnop"
    for i in range(1, levels):
        refs = ",".join(f"*{names[i - 1]}" for _ in range(width))
        lines.append(f"{names[i]}: &{names[i]} [{refs}]")
    return "\n".join(lines) + "\n"


def flow_nest(depth: int) -> str:
    return "deep: " + "[" * depth + "]" * depth + "\n"


def block_nest(depth: int) -> str:
    return "deep:\n" + "- " * depth + "x\n"


def cases() -> list[Case]:
    """Every library/CLI case of issue 15."""
    spaces = " " * 60_000
    nul_late = ("## Notes\n" + "ordinary text line\n" * 600).encode() + b"\x00tail\n"
    assert len(nul_late) > 8192 and b"\x00" not in nul_late[:8192]
    jsonl_escape = "\n".join([
        json.dumps({"_id": "../../etc/passwd", "title": "escape", "text": "attempt to escape the root"}),
        json.dumps({"_id": "good.md", "title": "impostor", "text": "attempt to replace good.md"}),
        json.dumps({"_id": "r1", "title": "plain record", "text": "a plain record about zebra migration"}),
        json.dumps({"_id": "r1", "title": "duplicate", "text": "the same id again"}),
    ]) + "\n"
    return [
        Case("nest50k.yaml", "too_deep", flow_nest(50_000).encode()),  # 100 KB: killed the server
        Case("nest5k.yaml", "too_deep", flow_nest(5_000).encode()),  # RecursionError ended the run
        Case("blocknest.yaml", "too_deep", block_nest(50_000).encode()),
        Case("alias6.yaml", "yaml_aliases", alias_bomb(6).encode()),  # 292 bytes, 63 s and 1 GB before
        Case("alias7.yaml", "yaml_aliases", alias_bomb(7).encode()),  # hours before
        Case("recursive.yaml", "yaml_aliases", b"a: &a [1, *a]\n"),
        Case("spaces60k.yaml", None, f"note: start{spaces}end\nother: value\n".encode()),  # 3.4-9.6 s before
        Case("spaces1m.yaml", "line_too_long", f"note: start{' ' * 1_000_000}end\n".encode()),
        Case("spacekey.yaml", None, f"? key{spaces}end\n: value\nnext: text\n".encode()),  # key-line pattern
        Case("frontnest.md", "too_deep", f"---\ntags: {'[' * 50_000}{']' * 50_000}\n---\n## Body\ntext\n".encode()),
        Case("frontalias.md", "yaml_aliases", f"---\n{alias_bomb(7)}---\n## Body\ntext\n".encode()),
        Case("nullate.md", "binary", nul_late),
        Case("deep.jsonl", "too_deep", (json.dumps({"_id": "d", "text": "x", "meta": [[[[1]]]]}).replace(
            "[[[[1]]]]", "[" * 50_000 + "]" * 50_000) + "\n").encode(), skipped_path="deep.jsonl:1"),
        Case("upload.jsonl", "invalid_id", jsonl_escape.encode(), skipped_path="upload.jsonl:1"),
    ]


GOOD_FILES = {
    "good.md": "# Good\n\n## Thesis\nNVDA datacenter revenue grows with accelerator demand and sovereign AI.\n",
    "notes/plain.yaml": "title: Plain\nthesis: Copper miners benefit from grid investment and electrification.\n",
}
