"""Parse untrusted request content in a throwaway worker process first, so a parser that crashes
(C stack overflow), explodes (aliases), loops or holds the GIL costs that worker, never the server.

The server only ingests a file whose sandboxed parse finished within the time and memory limits;
the worker reports the document paths the file would produce, so callers can check identities, and
returns what it parsed (documents and their sections), so the server never parses the file again."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import resource
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from rag_lib.server.errors import DocumentRejectedError, ParserBusyError

log = logging.getLogger("rag_lib.server")

# "__main__" too: each worker then skips re-running the main script (e.g. the `rag` CLI) at start
_PRELOAD = ["__main__", "rag_lib.server.isolation", "rag_lib.documents", "rag_lib.flatten"]
_context_lock = threading.Lock()
_context: Any = None


def _ctx():
    """A forkserver context: workers fork from a small clean process (not from the server with its
    threads, pool and model), with the parsers already imported so a worker starts in milliseconds."""
    global _context
    with _context_lock:
        if _context is None:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(_PRELOAD)
            _context = ctx
        return _context


@dataclass(frozen=True)
class Preflight:
    """What the sandboxed parse found: document paths it would publish, skip reasons, and the parsed
    file itself (ingest uses it instead of parsing again)."""

    paths: list[str]
    skipped: list[tuple[str, str]]
    doc_ids: list[str] = dataclasses.field(default_factory=list)  # the id of each document in `paths`
    parsed: Any = None  # rag_lib.models.ParsedFile

    def moved_to(self, source: Path, target: Path) -> Preflight:
        """This result for the same file after it moved from `source` to `target` (a staged upload
        put in place): its documents name their new source path."""
        if self.parsed is None:
            return self
        docs = [dataclasses.replace(d, source_path=str(target)) if d.source_path == str(source) else d
                for d in self.parsed.documents]
        return dataclasses.replace(self, parsed=dataclasses.replace(self.parsed, documents=docs))


def _limit_self(memory_bytes: int, cpu_seconds: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing parser must not write core files


def _parse_job(path: str, root: str, collection: str, max_bytes: int, sections_file: str,
               limits: Any = None) -> Preflight:
    from rag_lib.corpus_files import read_text
    from rag_lib.documents import load_source
    from rag_lib.flatten import flatten, load_mapping
    from rag_lib.models import Document, ParsedFile, Skipped

    mapping = load_mapping(Path(sections_file))
    paths: list[str] = []
    doc_ids: list[str] = []
    skipped: list[tuple[str, str]] = []
    # one bounded read (size checked first, as everywhere): the file's digest comes from the same bytes
    items, digest = load_source(Path(path), Path(root), collection, max_bytes, limits)
    parsed = ParsedFile(digest, [], [], {})
    for item in items:
        if isinstance(item, Skipped):
            skipped.append((str(item.path), str(item.reason)))
            parsed.skips.append(item)
            continue
        assert isinstance(item, Document)
        # as Engine.flatten does it: YAML sections keep their line numbers from the raw text
        raw = read_text(Path(item.source_path), None, max_bytes) if item.format == "yaml" else None
        parsed.sections[item.path] = flatten(item, mapping, raw)
        parsed.documents.append(item)
        paths.append(str(item.path))
        doc_ids.append(str(item.doc_id))
    return Preflight(paths, skipped, doc_ids, parsed)


def _child(conn: Connection, memory_bytes: int, cpu_seconds: int, args: tuple) -> None:
    try:
        _limit_self(memory_bytes, cpu_seconds)
        conn.send(("ok", _parse_job(*args)))
    except MemoryError:
        conn.send(("error", "memory", "parsing needs more memory than the limit (settings.server.parse_memory_mb)"))
    except RecursionError:
        conn.send(("error", "too_deep", "the document nests too deeply to parse"))
    except BaseException as exc:  # noqa: BLE001 - any parser failure is this document's failure
        conn.send(("error", "parse_failed", f"{type(exc).__name__}: {str(exc)[:300]}"))
    finally:
        conn.close()


class Sandbox:
    """At most `workers` parses at once, each in a new forked worker that is killed on timeout."""

    def __init__(self, workers: int = 2, timeout: float = 10.0, memory_mb: int = 1024):
        self.slots = threading.BoundedSemaphore(max(1, workers))
        self.timeout = timeout
        self.memory_bytes = memory_mb * 1024 * 1024

    def preflight(self, path: Path, root: Path, collection: str, max_bytes: int, sections_file: Path,
                  limits: Any = None) -> Preflight:
        """Parse `path` in a worker; raise `DocumentRejectedError` if it crashes, times out or fails."""
        args = (str(path), str(root), collection, max_bytes, str(sections_file), limits)
        if not self.slots.acquire(timeout=3 * self.timeout):  # queue behind a few slow parses, not forever
            raise ParserBusyError("the server is busy parsing other uploads; retry in a moment")
        try:
            return self._run(args)
        finally:
            self.slots.release()

    def _run(self, args: tuple) -> Preflight:
        ctx = _ctx()
        parent, child = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(child, self.memory_bytes, int(self.timeout) + 1, args), daemon=True)
        proc.start()
        child.close()
        try:
            if not parent.poll(self.timeout):
                log.warning("parse worker timed out", extra={"seconds": self.timeout})
                raise DocumentRejectedError(
                    f"parsing this document took longer than {self.timeout:g} s; it was not ingested "
                    "(settings.server.parse_timeout_seconds)")
            try:
                result = parent.recv()
            except (EOFError, OSError):
                result = None
        finally:
            parent.close()
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        if result is None:
            log.warning("parse worker died", extra={"exitcode": proc.exitcode})
            raise DocumentRejectedError(
                "the parser crashed on this document (e.g. nesting too deep for the YAML loader); it was not ingested")
        if result[0] == "error":
            log.warning("parse worker refused a document", extra={"reason": result[1]})
            raise DocumentRejectedError(f"this document cannot be parsed safely ({result[1]}): {result[2]}")
        log.debug("document parsed", extra={"where": "sandbox", "documents": len(result[1].paths)})
        return result[1]


def warm_up() -> None:
    """Start the fork server now (it imports the parsers once), so the first upload's time limit
    measures parsing, not start-up."""
    ctx = _ctx()
    proc = ctx.Process(target=_noop, daemon=True)
    proc.start()
    proc.join(120)


def _noop() -> None:
    return None


_sandboxes: dict[tuple, Sandbox] = {}
_sandboxes_lock = threading.Lock()


def sandbox_for(settings: Any) -> Sandbox:
    """The process-wide sandbox for these server settings."""
    cfg = settings.server
    key = (cfg.parse_workers, cfg.parse_timeout_seconds, cfg.parse_memory_mb)
    with _sandboxes_lock:
        if key not in _sandboxes:
            _sandboxes[key] = Sandbox(*key)
        return _sandboxes[key]


_IN_PROCESS: ContextVar[bool] = ContextVar("rag_parse_in_process", default=False)


@contextmanager
def parsing_in_process() -> Iterator[None]:
    """Parse in this process within the block: a library call (a user's own script) is not a server
    taking its clients' input, and a worker would run an unguarded script's top-level code again
    (multiprocessing's `if __name__ == "__main__"` rule), failing the call."""
    token = _IN_PROCESS.set(True)
    try:
        yield
    finally:
        _IN_PROCESS.reset(token)


def preflight(kb: Any, path: Path, root: Path, collection: str) -> Preflight:
    """Sandboxed parse of one file with the knowledge base's settings (see `Sandbox.preflight`);
    in this process inside `parsing_in_process`."""
    settings = kb.settings
    if _IN_PROCESS.get():
        return _parse_job(str(path), str(root), collection, settings.max_file_bytes, str(settings.sections_file),
                          settings.limits)
    return sandbox_for(settings).preflight(path, root, collection, settings.max_file_bytes,
                                           Path(settings.sections_file), settings.limits)


__all__ = ["Preflight", "Sandbox", "parsing_in_process", "preflight", "sandbox_for", "warm_up"]
