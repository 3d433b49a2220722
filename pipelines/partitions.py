"""One partition per corpus file (key: path relative to its root; see rag_lib.watch)."""

from dagster import DynamicPartitionsDefinition

CORPUS_FILES = "corpus_files"
corpus_files = DynamicPartitionsDefinition(name=CORPUS_FILES)

import hashlib

# Dagster's run tags for a partition range (what single-run backfills use).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
MAX_RANGES = 4  # more scattered ranges than this become one span (current files inside are cheap no-ops)


def plan_ranges(wanted: list[str], ordered: list[str]) -> list[tuple[str, str]]:
    """Contiguous (start, end) ranges, in partition insertion order, covering `wanted`."""
    position = {k: i for i, k in enumerate(ordered)}
    idx = sorted({position[k] for k in wanted if k in position})
    if not idx:
        return []
    ranges: list[list[int]] = [[idx[0], idx[0]]]
    for i in idx[1:]:
        if i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    if len(ranges) > MAX_RANGES:
        ranges = [[idx[0], idx[-1]]]
    return [(ordered[a], ordered[b]) for a, b in ranges]


def range_tags(start: str, end: str) -> dict[str, str]:
    return {RANGE_START_TAG: start, RANGE_END_TAG: end}


def run_key(prefix: str, items: list[str]) -> str:
    return f"{prefix}-" + hashlib.sha256("\n".join(sorted(items)).encode()).hexdigest()[:16]
