"""Why a search found nothing, in one line for its user: the collection holds no documents, or a
filter matches none of its documents (a type, ticker or path mistyped, dates outside what it holds),
or the filters match apart but not together, or the similarity threshold is above every result."""

from __future__ import annotations

from typing import Any

from rag_lib.errors import close_matches, did_you_mean
from rag_lib.models import SearchFilters


def plural(n: int, word: str) -> str:
    """`1 document`, `2 documents`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _values(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def empty_collection_note(facts: dict[str, Any]) -> str | None:
    """The collection holds no documents (a name mistyped, or documents ingested into another
    collection): say so and name the collections that hold some. None when it holds documents."""
    if facts["documents"]:
        return None
    held = ", ".join(f"{c['collection']} ({plural(c['documents'], 'document')})"
                     for c in facts["collections"] if c["documents"])
    return f"collection '{facts['collection']}' holds no documents" + (f"; these do: {held}" if held else "")


def _unmatched(name: str, filters: SearchFilters, facts: dict[str, Any]) -> str:
    """One filter that alone matches no document of the collection, with what the collection has."""
    if name == "doc_type":
        asked = _values(filters.doc_type)
        types = facts["doc_types"]
        listing = ", ".join(f"{t} ({n})" for t, n in types.items())
        return (f"no document of type {', '.join(asked)}{did_you_mean(close_matches(asked, list(types)))}"
                + (f"; its types: {listing}" if listing else ""))
    if name == "ticker":
        asked = [t.upper() for t in _values(filters.ticker)]
        return f"no document with ticker {', '.join(asked)}{did_you_mean(close_matches(asked, facts['tickers']))}"
    if name == "dates":
        span = " to ".join(str(d) for d in (filters.date_from, filters.date_to) if d)
        which = "on or after" if filters.date_to is None else "on or before" if filters.date_from is None else "from"
        first, last = facts["dated"]
        held = f" (its documents are dated {first} to {last})" if first else " (none of its documents is dated)"
        return f"no document dated {which} {span}{held}"
    if name == "path":
        slash = "/" if filters.path.endswith("/") else ""
        return (f"no document path starts with '{filters.path}'"
                + did_you_mean(close_matches([filters.path.rstrip("/")], [p + slash for p in facts["path_prefixes"]])))
    if name == "section":
        return f"no section is named '{filters.section}'"
    if name == "section_contains":
        return f"no section path contains '{filters.section_contains}'"
    if name == "formats":
        return f"no document of format {', '.join(filters.formats or [])} (formats: yaml, markdown, jsonl)"
    return "no document carries the tags " + ", ".join(f"{k}={v}" for k, v in (filters.tags or {}).items())


def no_results_note(facts: dict[str, Any], filters: SearchFilters, min_similarity: float = 0.0) -> str | None:
    """Why a search of `filters` (with the store's `empty_search_facts` for them) found nothing; None
    when nothing explains it (no document was close enough to a question without a threshold)."""
    if note := empty_collection_note(facts):
        return note
    where = f"in collection '{facts['collection']}'"
    if facts["unmatched"]:
        return f"{where}: " + "; ".join(_unmatched(name, filters, facts) for name in facts["unmatched"])
    if len(facts["filters"]) > 1:
        return f"{where}, each filter matches documents, but no document matches all of them"
    if min_similarity > 0:
        return f"no result is as similar to the question as min_similarity {min_similarity} asks"
    return None
