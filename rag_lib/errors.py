"""Typed exceptions: every failure a user can act on has its own class and one clear message."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

# A lone UTF-16 surrogate: not encodable as UTF-8, so neither PostgreSQL nor the tokenizer takes it
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def close_matches(asked: list[str], known: list[str]) -> list[str]:
    """The (at most two per asked value) `known` values spelled closest to each of `asked`."""
    return [m for a in asked for m in difflib.get_close_matches(a, known, n=2, cutoff=0.6)]


def did_you_mean(options: list[str]) -> str:
    """' (did you mean A or B?)' for a message about something not found; '' without options."""
    options = list(dict.fromkeys(options))
    return f" (did you mean {' or '.join(options)}?)" if options else ""


def first_of(items: Sequence[str], shown: int) -> str:
    """The first `shown` of `items`, comma-joined, and how many more: "a, b, c and 4 more"."""
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more} more" if more > 0 else "")


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first line of an unexpected error's message, cut to `limit` characters: database
    drivers append the statement and its parameters on later lines, which are for the log only."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return text if len(text) <= limit else text[:limit] + "…"


def unstorable_char(text: str) -> str | None:
    """"nul" or "surrogate" when PostgreSQL or the tokenizer cannot take `text`, else None."""
    if "\x00" in text:
        return "nul"
    if LONE_SURROGATE.search(text):
        return "surrogate"
    return None


_TEXT_PROBLEMS = {"nul": "holds a NUL character; remove it",
                  "surrogate": "holds an unpaired surrogate (text that is not valid Unicode); send it as UTF-8"}


def text_problem(text: str) -> str | None:
    """Why PostgreSQL or the tokenizer cannot take `text` (a NUL, an unpaired surrogate), or None."""
    kind = unstorable_char(text)
    return _TEXT_PROBLEMS[kind] if kind else None


class RagError(Exception):
    """Base class; `str(err)` is the one line shown to users (what, where, what to do)."""

    code = "rag_error"


class ConfigError(RagError):
    code = "config_error"


class DatabaseError(RagError):
    code = "database_error"


class DocumentError(RagError):
    """A file cannot be turned into a document; `reason` is a stable machine-readable key."""

    code = "document_error"

    def __init__(self, reason: str, message: str, path: str | None = None):
        self.reason = reason
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class EmbeddingError(RagError):
    code = "embedding_error"


class DimensionMismatchError(EmbeddingError):
    code = "dimension_mismatch"


class NotFoundError(RagError):
    code = "not_found"


class ValidationError(RagError):
    code = "invalid_input"


class DocumentConflictError(RagError):
    """A document path (or id) that already belongs to another file: another corpus root of the
    same collection, or an upload."""

    code = "document_conflict"


class ReembedRunningError(RagError):
    """A re-embed into a space that another process is re-embedding into right now."""

    code = "reembed_running"


class StoppedError(RagError):
    """A run was told to stop (Ctrl-C on `rag ingest`): raised inside its steps, never a file's failure."""

    code = "stopped"


class AmbiguousReferenceError(RagError):
    """A document id that several documents of a collection carry: a lookup or delete by that id
    would pick one at random (or delete them all); the caller must name the document by its path."""

    code = "ambiguous_reference"


class AdminRequiredError(DatabaseError):
    """The database role lacks something only an administrator can grant (an extension, a database,
    a privilege); `str(err)` names the statement the admin must run."""

    code = "admin_required"


class LimitExceededError(ValidationError):
    """A request that would need more work than a configured limit allows; the message names the
    setting and its value (HTTP 422)."""

    code = "limit_exceeded"


class QueryTimeoutError(RagError):
    """A database query stopped by its configured time limit; the message names the setting (HTTP 504)."""

    code = "query_timeout"


class TooManyChunksError(LimitExceededError):
    """A document that chunks into more than `limits.max_chunks_per_document` chunks."""

    reason = "too_many_chunks"
    setting = "limits.max_chunks_per_document"  # the limit it is over (see Skipped.limit)

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(f"{path}: {message}")
