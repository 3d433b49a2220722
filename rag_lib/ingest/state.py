"""The per-file state machine of the ingest engine: each stage takes the run's files, reads the
previous stages' stored outputs (one query per stage per run), calls the stage function
(`rag_lib.ingest.stages`), and stores its own output with the metadata shown for it. Each Dagster
asset (pipelines/assets.py) reports one stage; a run's first stage step runs the stages it selects
with the overlapped engine, as `rag ingest` does.

A bad file is an outcome (`skipped`), never an exception; any error in one file is a `failed`
outcome of that file only, and later stages report `upstream_failed` for it. A file whose stored
output is current is `unchanged` and re-emits the metadata of its last real run."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import shlex
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from rag_lib.config import Settings
from rag_lib.corpus_files import file_gone
from rag_lib.errors import DatabaseError, DocumentConflictError, RagError, StoppedError, TooManyChunksError
from rag_lib.db import database_error, database_gone
from rag_lib.ingest.stages import Engine, FileGroup, FileVectors, Loaded, Prepared, error_text, file_hash
from rag_lib.limits import setting_values
from rag_lib.log import get_logger
from rag_lib.documents import file_of
from rag_lib.models import Chunk, Document, Section, Skipped, SourceFile
from rag_lib.store import Store
from rag_lib.corpus_scan import FileTarget

log = get_logger(__name__)

RAW, SECTIONS, CHUNKS, EMBEDDINGS, VECTORS = "raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table"
STAGES = (RAW, SECTIONS, CHUNKS, EMBEDDINGS, VECTORS)
# Outputs whose `documents` hold the section or chunk texts: read whole only for the files a stage
# works on (an unchanged re-run read and decoded every text of the corpus to find nothing to do).
BULKY = (SECTIONS, CHUNKS)
PREVIEW_CHUNKS = 5


@dataclass
class StageOutcome:
    """What one stage did to one file. `documents` (vector_table): each document path's status in
    this run, new | changed | unchanged, with its chunk count."""

    key: str
    status: str  # ok | unchanged | skipped | failed | upstream_failed
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    reason: str | None = None  # failed: the error's code (RagError.code, else `<stage>_failed`)
    documents: dict[str, tuple[str, int]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def _refuse_takeover(t: FileTarget, sources: dict[str, str | None]) -> None:
    """Raise `DocumentConflictError` when a document of this file (`sources`: its documents' source
    files) was read from another file that still exists (two roots of one collection with the same
    relative path would otherwise overwrite each other's document on every run); a file that moved
    (the old one is known to be gone, `file_gone`) takes over, and one that cannot be checked (an
    unreadable folder, a link loop) does not."""
    # the entry itself, or where its link leads (what loading records); realpath, as a link loop makes resolve() raise
    mine = {str(t.path), os.path.realpath(t.path)}
    for path, source in sources.items():
        if source and source not in mine and not file_gone(source):
            raise DocumentConflictError(
                f"document '{path}' of collection '{t.collection}' was read from {source}, which still exists; "
                f"{t.path} has the same path under its root {t.root}. Ingest one of them into another "
                "collection (--collection), or delete that document (rag delete) or its file first")


def _digest_or_none(t: FileTarget, settings: Settings) -> str | None:
    """The file's digest, or None when it cannot be opened (gone, a dangling link): loading it then
    records why it is skipped."""
    try:
        return file_hash(t.path, t.root, settings)
    except OSError:
        return None


def _entry_size(path) -> int:
    """The file's size, or the directory entry's own (a link whose target is gone or refused)."""
    try:
        return path.stat().st_size
    except OSError:
        return os.lstat(path).st_size


def _doc_meta(doc: Document) -> dict[str, Any]:
    meta = {f.name: getattr(doc, f.name) for f in dataclasses.fields(doc) if f.name not in ("body", "key_lines")}
    meta["doc_date"] = doc.doc_date.isoformat() if doc.doc_date else None
    return meta


def _doc_from_meta(meta: dict[str, Any]) -> Document:
    data = dict(meta)
    data["doc_date"] = dt.date.fromisoformat(data["doc_date"]) if data.get("doc_date") else None
    return Document(body=None, **data)


def _ident(t: FileTarget) -> tuple[str, str]:
    return t.collection, t.rel


_MISSING = object()  # a stage row looked up and not found (so not looked up again)


def upstream_outcome(key: str, raw: dict | None, before: dict | None, previous: str) -> StageOutcome | None:
    """What a stage reports instead of working on a file, from the stored rows of raw_documents and of
    the stage before it (`previous`), or None when the file is ready: raw_documents missing (failed),
    skipped or failed (upstream_failed); the previous stage failed (upstream_failed), skipped this
    content (skipped), or is missing or older than raw_documents (failed). The stage assets and
    `knowledge_graph` (after vector_table) apply this one rule."""
    if raw is None:
        return StageOutcome(key, "failed", error=f"{RAW} has not been materialized for {key}")
    if raw["status"] == "skipped":
        return StageOutcome(key, "skipped", {"skip_reason": raw.get("skip_reason")})
    if raw["status"] == "failed":
        return StageOutcome(key, "upstream_failed", error=raw.get("error"))
    if before is not None and before.get("status") in ("failed", "upstream_failed"):
        return StageOutcome(key, "upstream_failed", error=before.get("error"))
    if before is not None and before.get("status") == "skipped" and before.get("file_hash") == raw["file_hash"]:
        return StageOutcome(key, "skipped", {"skip_reason": before.get("skip_reason"),
                                             "skip_detail": before.get("skip_detail")})
    if before is None or before.get("file_hash") != raw["file_hash"]:
        return StageOutcome(key, "failed", error=f"{previous} is missing or older than {RAW} for {key}; rematerialize it")
    return None


def outage_error(exc: BaseException) -> DatabaseError:
    """The one line `rag ingest` ends with when the database stops answering mid-run."""
    return DatabaseError(f"the database stopped answering during the ingest ({type(exc).__name__}); "
                         "what was published stays; start it (rag db start) and run the ingest again")


class StageRunner:
    """Runs the stages over many files with one store and engine; `force` redoes current files too.

    One runner serves one run: what a stage parsed, wrote or read is kept for the later stages of
    the same run (a file is read and parsed once per run, a stored output read at most once)."""

    def __init__(self, settings: Settings, store: Store, engine: Callable[[], Engine], force: bool = False,
                 recording: Callable[[], AbstractContextManager] = nullcontext, outage_raises: bool = False):
        self.settings = settings
        self.store = store
        self._make_engine = engine
        self.recording = recording  # a context in which embedding calls are recorded in the metrics
        self.force = force
        # `rag ingest`: a provider failing for every file (an outage, not a bad file) raises
        self.outage_raises = outage_raises
        # chunks given a vector by the embeddings stage, those of them from the embedding cache, and the
        # distinct texts the provider embedded for the others (chunks with the same text share one)
        self.embed_totals: dict[str, int] = {"chunks": 0, "chunks_from_cache": 0, "texts_embedded": 0}
        self._rows: dict[tuple[str, str, str], Any] = {}
        self._heads: set[tuple[str, str, str]] = set()  # keys of _rows holding a BULKY output without its documents
        self._loaded: dict[tuple[str, str], Loaded] = {}
        self._sections: dict[tuple[str, str], list[Section]] = {}
        self._vectors: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        # encode_ahead: the chunks it started embedding (with the file's hash) and their groups by file key
        self._chunks: dict[tuple[str, str], tuple[str, list[Chunk]]] = {}
        self._started: dict[str, FileGroup] = {}
        self.stopping = threading.Event()  # set by `stop`: the stages stop between files

    @cached_property
    def engine(self) -> Engine:
        """The library's stage functions (loads the model: only when a stage runs, not to forget a file)."""
        return self._make_engine()

    def preset(self, loaded: Loaded, sections: dict[str, list[Section]] | None = None) -> None:
        """A file loaded (and flattened) already, e.g. by the server's parse sandbox: not parsed again."""
        self._loaded[(loaded.source.collection, loaded.source.rel)] = loaded
        for path, secs in (sections or {}).items():
            self._sections[(loaded.source.collection, path)] = secs

    def loaded(self, source: SourceFile) -> Loaded | None:
        """The file as this run parsed it already (None: not yet)."""
        return self._loaded.get((source.collection, source.rel))

    def sections(self, collection: str, doc_path: str) -> list[Section] | None:
        """A document's sections as given by `preset` (None: flatten it)."""
        return self._sections.get((collection, doc_path))

    # ---- stored outputs, read once per run ---------------------------------------------

    def rows(self, stages: tuple[str, ...], idents: list[tuple[str, str]],
             whole: bool = False) -> dict[tuple[str, str, str], Any]:
        """(collection, path, stage) → stored output; one query for what this run has not seen yet.
        A BULKY output comes without its `documents` unless `whole`."""
        def known(key: tuple[str, str, str]) -> bool:
            return key in self._rows and not (whole and key in self._heads)

        todo = [i for i in idents if not all(known((*i, st)) for st in stages)]
        if todo:
            heads = () if whole else tuple(st for st in stages if st in BULKY)
            found = self.store.load_stage_outputs(stages, todo, heads)
            for c, p in todo:
                for st in stages:
                    key = (c, p, st)
                    if known(key):
                        continue
                    self._rows[key] = found.get(key, _MISSING)
                    if st in heads and key in found:
                        self._heads.add(key)
                    else:
                        self._heads.discard(key)
        out = {}
        for c, p in idents:
            for st in stages:
                value = self._rows.get((c, p, st), _MISSING)
                if value is not _MISSING:
                    out[(c, p, st)] = value
        return out

    def _save(self, saves: list) -> None:
        self.store.save_stage_outputs(saves)
        for c, p, stage, payload, _ in saves:
            self._rows[(c, p, stage)] = payload
            self._heads.discard((c, p, stage))

    def _skip(self, skip: Skipped) -> None:
        """The one place a skipped input is recorded (with its reason)."""
        self.store.record_skip(skip)

    # ---- shared rules ------------------------------------------------------------------

    def _payload(self, stage: str, status: str, file_hash_: str | None, meta: dict[str, Any] | None = None,
                 ident: tuple[str, str] | None = None, **data: Any) -> dict[str, Any]:
        """A stage output to store; given the file (`ident`), with what it was `judged` under."""
        payload = {"status": status, "file_hash": file_hash_, "fingerprint": self.engine.fingerprint,
                   "version": self.engine.versions[stage], "meta": meta or {}, **data}
        if ident is not None:
            payload["judged"] = self._judged(ident, stage, data.get("skipped", ()))
        return payload

    def _before(self, ident: tuple[str, str], stage: str) -> dict[str, Any]:
        """The stored output of the stage before `stage` for a file, as this run read or wrote it
        ({}: none, or `stage` is the first)."""
        if stage == RAW:
            return {}
        row = self._rows.get((*ident, STAGES[STAGES.index(stage) - 1]), _MISSING)
        return row if isinstance(row, dict) else {}

    def _judged(self, ident: tuple[str, str], stage: str, skipped) -> dict[str, Any]:
        """The limits (setting → value) that decided which of a file's documents reach this stage's
        output: those the output before it was judged under, and those its own `skipped` entries
        are over (their `limit`). A file without skips over a limit has none."""
        judged = dict(self._before(ident, stage).get("judged") or {})
        judged.update(setting_values(self.settings, [s["limit"] for s in skipped if s.get("limit")]))
        return judged

    def _is_current(self, stage: str, mine: dict[str, Any] | None, digest: str | None,
                    ident: tuple[str, str]) -> bool:
        """The stored output was made from this file content by this stage version, under the
        limits it was judged under (`_judgement_holds`)."""
        return (not self.force and mine is not None and mine.get("status") in ("ok", "skipped")
                and mine.get("file_hash") == digest and mine.get("fingerprint") == self.engine.fingerprint
                and mine.get("version") == self.engine.versions[stage] and "meta" in mine
                and self._judgement_holds(stage, mine, ident))

    def _judgement_holds(self, stage: str, mine: dict[str, Any], ident: tuple[str, str]) -> bool:
        """The limits that decided which documents reach a stored output have the values it was
        judged under: raising one brings back what was skipped for being over it, and the outputs
        after it are made again (they hold those documents too). An output stored before outputs
        recorded this holds unless it has skips of its own (judged again, once) or the output
        before it was made since (that one may hold other documents)."""
        if "judged" in mine:
            return judgement_holds(mine["judged"], self.settings)
        if mine.get("status") == "skipped" or mine.get("skipped"):
            return False
        return "judged" not in self._before(ident, stage)

    def _upstream(self, t: FileTarget, stage: str, rows: dict, saves: list) -> StageOutcome | None:
        """`upstream_outcome` for this stage; an outcome the previous stage decided (it failed, or
        skipped this content) is stored too, so the stages after this one see it rather than a
        missing row."""
        c, p = _ident(t)
        raw = rows.get((c, p, RAW))
        outcome = upstream_outcome(t.key, raw, rows.get((c, p, STAGES[STAGES.index(stage) - 1])),
                                   STAGES[STAGES.index(stage) - 1])
        if outcome is not None and outcome.status != "failed" and raw["status"] not in ("skipped", "failed"):
            if outcome.status == "skipped":  # e.g. chunks over limits.max_chunks_per_document
                payload = self._payload(stage, "skipped", raw["file_hash"], outcome.metadata, (c, p), **outcome.metadata)
            else:
                payload = self._payload(stage, "upstream_failed", raw["file_hash"], error=outcome.error)
            saves.append((c, p, stage, payload, raw["file_hash"]))
        return outcome

    def _failed(self, t: FileTarget, stage: str, exc: BaseException, saves: list) -> StageOutcome:
        if self.outage_raises and database_gone(exc):
            # not this file's failure: every later file would wait out the pool's timeout in turn
            raise outage_error(exc) from exc
        # a traceback only for the unexpected: our own errors, the file system's and the database's say
        # all in one line (the database's DETAIL and CONTEXT lines, and where: in the debug log)
        one_line = isinstance(exc, (RagError, OSError)) or database_error(exc)
        log.error("%s failed for %s: %s", stage, t.key, error_text(exc), exc_info=None if one_line else exc)
        if one_line:
            log.debug("%s failed for %s", stage, t.key, exc_info=exc)
        message = error_text(exc)
        saves.append((t.collection, t.rel, stage, self._payload(stage, "failed", None, error=message), None))
        reason = exc.code if isinstance(exc, RagError) else f"{stage}_failed"
        return StageOutcome(t.key, "failed", {"error": message}, error=message, reason=reason)

    def _run(self, stage: str, targets: list[FileTarget], needs: tuple[str, ...], work,
             still_current=None) -> list[StageOutcome]:
        """The common loop of the stages after raw_documents: batched reads, per-file isolation,
        unchanged files re-emit their stored metadata, one batched write. `work(t, raw, rows)` returns
        (metadata, payload data), or None when the stage finishes that file itself (status `pending`);
        it gets the outputs of `needs` whole, read only for the files it works on."""
        rows = self.rows((RAW, *needs, stage), [_ident(t) for t in targets])
        outcomes: dict[str, StageOutcome] = {}
        saves: list = []
        todo: list[FileTarget] = []
        for t in targets:
            c, p = _ident(t)
            with self._isolated(t, stage, rows, saves, outcomes):
                early = self._upstream(t, stage, rows, saves)
                if early:
                    outcomes[t.key] = early
                    continue
                raw = rows[(c, p, RAW)]
                mine = rows.get((c, p, stage))
                if (self._is_current(stage, mine, raw["file_hash"], (c, p))
                        and (still_current is None or still_current(t, raw, rows))):
                    outcomes[t.key] = StageOutcome(t.key, "unchanged", mine["meta"])
                    continue
                todo.append(t)
        if todo:
            rows = {**rows, **self.rows(needs, [_ident(t) for t in todo], whole=True)}
        for t in todo:
            c, p = _ident(t)
            with self._isolated(t, stage, rows, saves, outcomes):
                raw = rows[(c, p, RAW)]
                done = work(t, raw, rows)
                if done is None:
                    outcomes[t.key] = StageOutcome(t.key, "pending")
                    continue
                meta, data = done
                saves.append((c, p, stage, self._payload(stage, "ok", raw["file_hash"], meta, (c, p), **data),
                              raw["file_hash"]))
                outcomes[t.key] = StageOutcome(t.key, "ok", meta)
        self._save(saves)
        return [outcomes[t.key] for t in targets]

    @contextmanager
    def _isolated(self, t: FileTarget, stage: str, rows: dict, saves: list,
                  outcomes: dict[str, StageOutcome]) -> Iterator[None]:
        """The per-file boundary of `_run`: an error is this file's outcome, not the run's."""
        c, p = _ident(t)
        try:
            yield
        except TooManyChunksError as exc:  # bad input, not a failure: skipped with the reason
            digest = rows[(c, p, RAW)]["file_hash"]
            self._skip(Skipped(c, exc.path, exc.reason, str(exc), digest))
            skip = {"skip_reason": exc.reason, "skip_detail": str(exc)}
            saves.append((c, p, stage, self._payload(stage, "skipped", digest, skip, (c, p), **skip,
                                                     skipped=[_skip_entry(exc)]), digest))
            outcomes[t.key] = StageOutcome(t.key, "skipped", skip)
        except Exception as exc:  # noqa: BLE001 - the per-file boundary: the file fails, not the run
            outcomes[t.key] = self._failed(t, stage, exc, saves)

    # ---- stages ------------------------------------------------------------------------

    def run_all(self, targets: list[FileTarget], stages: tuple[str, ...] = STAGES,
                out: dict[str, dict[str, StageOutcome]] | None = None) -> dict[str, dict[str, StageOutcome]]:
        """The stages in order over the files (all of them: what one Dagster run does): key → stage →
        outcome, added to `out` when given. Different files' stages may run on different threads at
        once (`rag ingest` overlaps them); one file's stages run in order."""
        out = {t.key: {} for t in targets} if out is None else out
        for stage in stages:
            for outcome in getattr(self, stage)(targets):
                out.setdefault(outcome.key, {})[stage] = outcome
        return out

    def stop(self) -> None:
        """Stop the stages running on other threads at their next file (publishing: after the
        document being written, whole; embedding: within a mini-batch); what a stage has not
        finished is not stored, so the next run does it (`rag ingest` on Ctrl-C)."""
        self.stopping.set()  # the encoder's waits and queuing look at it (`OnnxEncoder.submit_rows`)

    def abandon_started(self) -> None:
        """Forget what `encode_ahead` started and `embeddings` will not finish (the run stopped)."""
        for group in dict.fromkeys(self._started.values()):  # a group by identity (FileGroup: eq=False)
            self.engine.embedder.abandon(group.call)
        self._started.clear()
        self._chunks.clear()

    def release(self, targets: list[FileTarget]) -> None:
        """Forget what this run keeps of files it is done with (parsed documents, stored outputs,
        vectors): a long run holds only the files in flight."""
        for t in targets:
            c, p = _ident(t)
            self._started.pop(t.key, None)
            self._loaded.pop((c, p), None)
            self._vectors.pop((c, p), None)
            self._chunks.pop((c, p), None)
            for stage in STAGES:
                self._rows.pop((c, p, stage), None)
                self._heads.discard((c, p, stage))

    def raw_documents(self, targets: list[FileTarget]) -> list[StageOutcome]:
        """Read and parse each file; an unchanged file (same bytes, same loader) is not parsed again.
        A file whose path (under its root) names a document read from another file that still exists
        (another root of the collection, an upload) fails with `DocumentConflictError`: it would
        replace that document."""
        rows = self.rows((RAW,), [_ident(t) for t in targets])
        claims: dict[tuple[str, str], dict[str, str | None]] = {}  # (collection, file) → its documents' sources
        for c in {t.collection for t in targets}:
            here = {t.rel: t for t in targets if t.collection == c}
            for path, source in self.store.document_sources_of(c, list(here)).items():
                claims.setdefault((c, file_of(path)), {})[path] = source
            # A file whose recorded source is gone was moved with its folder: it is read from here now,
            # also when its bytes are unchanged (the conflict check below relies on the sources). Gone
            # as prune means it: a source that cannot be checked (an unreadable folder) is still there.
            moves = {path: os.path.realpath(here[rel].path) for (cc, rel), sources in claims.items() if cc == c
                     for path, source in sources.items() if source and file_gone(source)}
            if moves:
                self.store.move_document_sources(c, moves)
                for path, source in moves.items():
                    claims[(c, file_of(path))][path] = source
        outcomes: list[StageOutcome] = []
        saves: list = []
        for t in targets:
            c, p = _ident(t)
            try:
                loaded = self._loaded.get((c, p))
                if loaded is None and not os.path.lexists(t.path):  # a FIFO or a link is there: loading records why it is skipped
                    raise FileNotFoundError(f"{t.path} does not exist (deleted files are removed by the corpus sensor)")
                mine = rows.get((c, p, RAW))
                digest = loaded.file_hash if loaded else None
                if mine is not None and self._is_current(RAW, mine, digest or _digest_or_none(t, self.settings), (c, p)):
                    status = "unchanged" if mine["status"] == "ok" else mine["status"]
                    outcomes.append(StageOutcome(t.key, status, mine["meta"]))
                    continue
                _refuse_takeover(t, claims.get((c, p), {}))
                if loaded is None:
                    loaded = self.engine.preparer.load(SourceFile(t.collection, t.root, t.rel))
                    self._loaded[(c, p)] = loaded
                # read again: why an earlier version was skipped no longer holds (a broken file put
                # back to the bytes that are live publishes nothing, which would clear it otherwise)
                self.store.clear_skips(c, p)
                for skip in loaded.skips:
                    self._skip(skip)
                docs, skips = loaded.documents, loaded.skips
                status = "ok" if docs else "skipped"
                reason = skips[0].reason if skips and not docs else None
                meta: dict[str, Any] = {"documents": len(docs), "skipped_records": len(skips),
                                        "size_bytes": _entry_size(t.path),
                                        "content_hash": loaded.file_hash[:16]}
                if docs:
                    d = docs[0]
                    meta.update(doc_type=d.doc_type, doc_id=d.doc_id, format=d.format, ticker=d.ticker or "",
                                doc_date=d.doc_date.isoformat() if d.doc_date else "")
                if reason:
                    meta.update(skip_reason=reason, skip_detail=skips[0].detail)
                if warnings := [w for d in docs for w in d.warnings]:
                    meta["warnings"] = "; ".join(warnings)
                payload = self._payload(
                    RAW, status, loaded.file_hash, meta, (c, p), documents=[_doc_meta(d) for d in docs],
                    skipped=[{"path": s.path, "reason": s.reason, "detail": s.detail, "limit": s.limit} for s in skips],
                    skip_reason=reason)
                saves.append((c, p, RAW, payload, loaded.file_hash))
                outcomes.append(StageOutcome(t.key, status, meta))
            except Exception as exc:  # noqa: BLE001 - the per-file boundary (RecursionError, MemoryError too)
                outcomes.append(self._failed(t, RAW, exc, saves))
        self._save(saves)
        return outcomes

    def flattened_sections(self, targets: list[FileTarget]) -> list[StageOutcome]:
        def work(t: FileTarget, raw: dict, rows: dict) -> tuple[dict, dict]:
            loaded = self._loaded.get(_ident(t))
            if loaded is None or loaded.file_hash != raw["file_hash"]:  # raw_documents ran in another run
                loaded = self.engine.preparer.load(SourceFile(t.collection, t.root, t.rel))
            if loaded.file_hash != raw["file_hash"]:
                raise ValueError(f"{t.rel} changed after {RAW} was materialized; rematerialize from {RAW}")
            out, total, empty = [], 0, 0
            for doc in loaded.documents:
                sections = self._sections.get((t.collection, doc.path))
                sections = self.engine.preparer.flatten(doc) if sections is None else sections
                total += len(sections)
                empty += sum(1 for s in sections if s.is_empty)
                out.append({"path": doc.path, "sections": [dataclasses.asdict(s) for s in sections]})
            names = [s["name"] for d in out for s in d["sections"]][:20]
            return ({"sections": total, "empty_sections": empty, "section_names": ", ".join(names)},
                    {"documents": out})

        return self._run(SECTIONS, targets, (), work)

    def chunks(self, targets: list[FileTarget]) -> list[StageOutcome]:
        def work(t: FileTarget, raw: dict, rows: dict) -> tuple[dict, dict]:
            by_path = {d["path"]: d["sections"] for d in rows[(t.collection, t.rel, SECTIONS)]["documents"]}
            out, counts, preview, skipped = [], [], [], []
            for meta in raw["documents"]:
                doc = _doc_from_meta(meta)
                sections = [Section(**s) for s in by_path.get(doc.path, [])]
                try:
                    chunks = self.engine.preparer.chunk(doc, sections)
                except TooManyChunksError as exc:  # this document is skipped; the file's others go on
                    skipped.append(exc)
                    continue
                counts.extend(c.token_count for c in chunks)
                preview.extend(chunks[: max(0, PREVIEW_CHUNKS - len(preview))])
                out.append({"path": doc.path, "section_tokens": {s.name: s.token_count for s in sections},
                            "chunks": [c.to_dict() for c in chunks]})
            if skipped and not out:
                for exc in skipped[1:]:
                    self._skip(Skipped(t.collection, exc.path, exc.reason, str(exc), raw["file_hash"]))
                raise skipped[0]  # the whole file is skipped (recorded by the stage loop)
            for exc in skipped:
                self._skip(Skipped(t.collection, exc.path, exc.reason, str(exc), raw["file_hash"]))
            meta = {"chunks": len(counts), "tokens": sum(counts), "max_tokens": max(counts, default=0),
                    "token_counts": counts,
                    "preview": [{"section_path": c.section_path, "tokens": c.token_count, "text": c.text[:80]}
                                for c in preview]}
            if skipped:
                meta["skipped_documents"] = len(skipped)
            return meta, {"documents": out, "skipped": [_skip_entry(e) for e in skipped]}

        return self._run(CHUNKS, targets, (SECTIONS,), work)

    def encode_ahead(self, targets: list[FileTarget]) -> None:
        """Start embedding the chunks of the files among `targets` that the `embeddings` stage will
        embed (chunked in this run, not embedded yet): the provider works on them while the files
        before them are still being embedded and published (`rag ingest` runs this on a thread of
        its own as soon as a round is chunked), and `embeddings` then finishes what was started.
        A file not started here is embedded by `embeddings` as before; errors are its too."""
        try:
            self._encode_ahead(targets)
        except Exception as exc:  # noqa: BLE001 - `embeddings` does the work and reports per file
            # a database gone is the run's one error line (the stage meets it next), not a warning here too
            log.log(logging.INFO if database_gone(exc) else logging.WARNING,
                    "could not start embedding %d files ahead (%s); the embeddings stage embeds them",
                    len(targets), error_text(exc))

    def _encode_ahead(self, targets: list[FileTarget]) -> None:
        idents = [_ident(t) for t in targets]
        rows = self.rows((RAW, CHUNKS, EMBEDDINGS), idents)
        files: list[tuple[str, list[Chunk]]] = []
        for t, (c, p) in zip(targets, idents):
            raw, chunked = rows.get((c, p, RAW)), rows.get((c, p, CHUNKS))
            if (raw is None or raw["status"] != "ok" or chunked is None or chunked.get("status") != "ok"
                    or chunked.get("file_hash") != raw["file_hash"] or (c, p, CHUNKS) in self._heads
                    or self._is_current(EMBEDDINGS, rows.get((c, p, EMBEDDINGS)), raw["file_hash"], (c, p))):
                continue
            chunks = [Chunk.from_dict(x) for d in chunked["documents"] for x in d["chunks"]]
            files.append((t.key, chunks))
            self._chunks[(c, p)] = (raw["file_hash"], chunks)
        for group in self.engine.embedder.start_files(files, stop=self.stopping):
            for key, _ in group.files:
                self._started[key] = group

    def embeddings(self, targets: list[FileTarget]) -> list[StageOutcome]:
        """Embed the chunks of all the run's files together (the encoder wants large batches); a
        failing batch is retried file by file so one bad file fails alone. What `encode_ahead`
        started for these files is finished here."""
        cfg = self.engine.settings.embedding
        pending: dict[str, tuple[FileTarget, str, list[Chunk]]] = {}

        def collect(t: FileTarget, raw: dict, rows: dict) -> None:
            ahead = self._chunks.pop(_ident(t), None)
            if ahead is not None and ahead[0] == raw["file_hash"]:
                pending[t.key] = (t, raw["file_hash"], ahead[1])
                return
            payload = rows[(t.collection, t.rel, CHUNKS)]
            pending[t.key] = (t, raw["file_hash"], [Chunk.from_dict(c) for d in payload["documents"] for c in d["chunks"]])

        outcomes = self._run(EMBEDDINGS, targets, (CHUNKS,), collect)
        started = [g for g in dict.fromkeys(self._started.pop(t.key, None) for t in targets) if g is not None]
        try:
            with self.recording():
                result = self.engine.embedder.embed_files([(key, cs) for key, (_, _, cs) in pending.items()], started,
                                                          stop=self.stopping)
        except Exception as exc:  # noqa: BLE001 - the provider failed for every file: each is recorded failed
            if self.outage_raises and database_gone(exc):
                raise outage_error(exc) from exc
            if self.outage_raises or isinstance(exc, StoppedError):
                raise
            result = FileVectors(errors={key: exc for key in pending})
        self.embed_totals["chunks"] += sum(len(cs) for key, (_, _, cs) in pending.items() if key not in result.errors)
        self.embed_totals["chunks_from_cache"] += result.cache_hits
        self.embed_totals["texts_embedded"] += result.embedded
        meta = {"model": cfg.key, "dimensions": cfg.dimensions, "provider": self.engine.provider.name}
        staged, saves, done = [], [], {}
        for key, (t, digest, cs) in pending.items():
            if key in result.errors:
                done[key] = self._failed(t, EMBEDDINGS, result.errors[key], saves)
                continue
            staged.append((t.collection, t.rel, [(c.chunk_id, c.content_hash) for c in cs], result.vectors[key]))
            m = {"vectors": len(cs), **meta}
            saves.append((t.collection, t.rel, EMBEDDINGS,
                          self._payload(EMBEDDINGS, "ok", digest, m, _ident(t), space=self.engine.provider.space,
                                        vectors=len(cs)), digest))
            done[key] = StageOutcome(t.key, "ok", m)
        unstaged = self._stage_vectors(staged, cfg.key, cfg.dimensions)
        for c, p, ids, vectors in staged:
            if (c, p) not in unstaged:
                self._vectors[(c, p)] = {cid: v for (cid, _), v in zip(ids, vectors)}
        saves = [s for s in saves if (s[0], s[1]) not in unstaged]
        for key, (t, _, _) in pending.items():
            if _ident(t) in unstaged:
                done[key] = self._failed(t, EMBEDDINGS, unstaged[_ident(t)], saves)
        self._save(saves)
        return [done.get(o.key, o) for o in outcomes]

    def _stage_vectors(self, staged: list, model: str, dimensions: int) -> dict[tuple[str, str], Exception]:
        """Stage the files' vectors in one transaction, or when that fails, file by file (so one
        file's error fails that file only); (collection, path) → the error of each file not staged.
        The database gone is every file's error at once: retrying each would wait it out in turn."""
        try:
            self.store.save_staged_vectors(staged, model, dimensions)
            return {}
        except Exception as exc:  # noqa: BLE001 - each file's error is its outcome
            if len(staged) == 1 or database_gone(exc):
                return {(c, p): exc for c, p, _, _ in staged}
            log.warning("staging the vectors of %d files failed (%s); staging them file by file", len(staged),
                        error_text(exc))
            return {ident: e for one in staged for ident, e in self._stage_vectors([one], model, dimensions).items()}

    def vector_table(self, targets: list[FileTarget]) -> list[StageOutcome]:
        """Publish each file's documents (one transaction each) from the stored sections, chunks and
        staged vectors; a document live and current already is left alone (unless forced), and
        records that vanished from a multi-document file are deleted, not orphaned."""
        self.engine.publisher.ensure_space()
        states = {c: self.store.document_states(c) for c in sorted({t.collection for t in targets})}
        pending: dict[str, tuple[FileTarget, dict, dict]] = {}

        def published_current(t: FileTarget, raw: dict, rows: dict) -> bool:
            kept = _skipped_paths(rows.get((t.collection, t.rel, CHUNKS)))
            return all(self.engine.publisher.is_current(_doc_from_meta(m), states[t.collection]) for m in raw["documents"]
                       if m["path"] not in kept)

        def collect(t: FileTarget, raw: dict, rows: dict) -> None:
            pending[t.key] = (t, raw, {st: rows.get((t.collection, t.rel, st)) for st in (SECTIONS, CHUNKS, VECTORS)})

        # An unchanged file's documents must still be live and current (a deleted one is republished).
        outcomes = self._run(VECTORS, targets, (SECTIONS, CHUNKS, EMBEDDINGS), collect, still_current=published_current)
        outcomes = self._rows_of_unchanged(targets, outcomes)
        if not pending:
            return outcomes
        idents = [_ident(t) for t, _, _ in pending.values()]
        # this round's files only: the embedding step may be adding the next round's meanwhile
        staged = {i: self._vectors[i] for i in idents if i in self._vectors}
        cfg = self.engine.settings.embedding
        staged.update(self.store.load_staged_vectors([i for i in idents if i not in staged], cfg.key, cfg.dimensions))
        saves: list = []
        done: dict[str, StageOutcome] = {}
        for key, (t, raw, stored) in pending.items():
            if self.stopping.is_set():  # the files not published yet stay as they were, for the next run
                break
            try:
                meta, published, statuses = self._publish_file(t, raw, stored, staged.get(_ident(t), {}),
                                                               states[t.collection])
                saves.append((t.collection, t.rel, VECTORS,
                              self._payload(VECTORS, "ok", raw["file_hash"], meta, _ident(t), documents=published),
                              raw["file_hash"]))
                done[key] = StageOutcome(t.key, "ok", meta, documents=statuses)
            except Exception as exc:  # noqa: BLE001 - the per-file boundary
                done[key] = self._failed(t, VECTORS, exc, saves)
        self._save(saves)
        return [done.get(o.key, o) for o in outcomes]

    def _rows_of_unchanged(self, targets: list[FileTarget], outcomes: list[StageOutcome]) -> list[StageOutcome]:
        """An unchanged file's vector_table metadata as its last publish stored it, with this run's
        `rows_written` (none) and the `rows_stored` it serves: its chunks stage's count, as every
        document of it is live and current with those chunks. (Before 2026-11-28 the stored metadata
        had one `rows`: the rows its publish wrote, shown again for an unchanged file as if stored.)"""
        chunks = self.rows((CHUNKS,), [_ident(t) for t in targets])  # read by `_run` already
        by_key = {t.key: t for t in targets}
        out = []
        for o in outcomes:
            if o.status == "unchanged":
                t = by_key[o.key]
                chunked = (chunks.get((t.collection, t.rel, CHUNKS)) or {}).get("meta") or {}
                meta = {k: v for k, v in o.metadata.items() if k != "rows"}
                meta.update(rows_written=0, rows_stored=int(chunked.get("chunks", meta.get("rows_stored", 0))))
                o = dataclasses.replace(o, metadata=meta)
            out.append(o)
        return out

    def _publish_file(self, t: FileTarget, raw: dict, stored: dict, staged: dict[str, np.ndarray],
                      states: dict[str, tuple[str, str]]) -> tuple[dict, list[str], dict[str, tuple[str, int]]]:
        cfg = self.engine.settings.embedding
        sections_out = {d["path"]: d["sections"] for d in stored[SECTIONS]["documents"]}
        chunks_out = {d["path"]: d for d in stored[CHUNKS]["documents"]}
        kept = _skipped_paths(stored[CHUNKS])  # over the chunk limit: the live version (if any) stays
        # the documents as this run parsed them (with their body, which the graph reads) when it did
        loaded = self._loaded.get(_ident(t))
        parsed = {d.path: d for d in loaded.documents} if loaded and loaded.file_hash == raw["file_hash"] else {}
        published, statuses, written, live = [], {}, 0, 0
        for meta in raw["documents"]:
            doc = parsed.get(meta["path"]) or _doc_from_meta(meta)
            if doc.path in kept:
                continue
            entry = chunks_out[doc.path]
            published.append(doc.path)
            live += len(entry["chunks"])  # a current document's live rows are these chunks too
            if not self.force and self.engine.publisher.is_current(doc, states):
                statuses[doc.path] = ("unchanged", 0)  # e.g. the other records of a changed JSONL file
                continue
            sections = [Section(**{**s, "token_count": entry["section_tokens"].get(s["name"], s["token_count"])})
                        for s in sections_out.get(doc.path, [])]
            chunks = [Chunk.from_dict(c) for c in entry["chunks"]]
            missing = [c.chunk_id for c in chunks if c.chunk_id not in staged]
            if missing:  # e.g. staged by another model, under settings naming another space
                raise ValueError(f"{len(missing)} chunks of {doc.path} have no vector staged by {cfg.space}; "
                                 "rematerialize embeddings")
            vectors = (np.stack([staged[c.chunk_id] for c in chunks]) if chunks
                       else np.zeros((0, cfg.dimensions), dtype=np.float32))
            self.engine.publisher.publish(Prepared(doc, sections, chunks), vectors)
            statuses[doc.path] = ("changed" if doc.path in states else "new", len(chunks))
            written += len(chunks)
        gone = set((stored.get(VECTORS) or {}).get("documents", [])) - set(published) - kept
        gone |= {p for p in states if p.startswith(f"{t.rel}#")} - set(published) - kept  # JSONL records
        if unread := unread_records(raw):
            # which `_id` a broken line had can't be told: every absent record keeps its live version
            # until the file reads cleanly (then the ones removed on purpose go)
            if held := {p for p in gone if p.startswith(f"{t.rel}#")}:
                log.warning("%s: %d record(s) absent from this version kept, since %d line(s) could not be read "
                            "(%s); fix those lines and ingest again", t.rel, len(held), len(unread), ", ".join(unread[:5]))
                gone -= held
        for ref in sorted(gone):
            self.store.delete_document(t.collection, ref)
        # rows_written: the chunk rows this publish wrote (a current document is left alone);
        # rows_stored: the file's chunk rows in the serving table after it
        return ({"documents": len(published), "rows_written": written, "rows_stored": live,
                 "space": self.engine.provider.space, "removed": len(gone)}, published, statuses)

    # ---- housekeeping ------------------------------------------------------------------

    def forget(self, t: FileTarget) -> list[str]:
        """Delete a (deleted) file's documents and stage rows."""
        raw = self.store.load_stage_outputs((RAW,), [_ident(t)]).get((t.collection, t.rel, RAW)) or {}
        return self.store.forget_file(t.collection, t.rel, [d["path"] for d in raw.get("documents", [])])


def _skip_entry(exc: TooManyChunksError) -> dict[str, str]:
    return {"path": exc.path, "reason": exc.reason, "detail": str(exc), "limit": exc.setting}


def judgement_holds(judged: dict[str, Any] | None, settings: Settings) -> bool:
    """Whether `settings` have the values a stored output's limits were judged under (None: an
    output with skips stored before outputs recorded them, judged again)."""
    return judged is not None and setting_values(settings, judged) == judged


def unread_records(raw: dict) -> list[str]:
    """A JSONL file's lines skipped without a record id to tell (`<file>:<line>`; a duplicate `_id`
    names a record that is there)."""
    return [s["path"] for s in raw.get("skipped", []) if s.get("reason") != "duplicate_id"]


def _skipped_paths(chunks_row: dict | None) -> set[str]:
    """Documents of a file that the chunks stage skipped (over the per-document chunk limit)."""
    return {s["path"] for s in (chunks_row or {}).get("skipped", []) if s.get("path")}


def held_files(store: Store, collection: str | None = None) -> list[dict[str, Any]]:
    """Files served from an older version: their newest content was skipped (malformed, over a
    limit) and the documents of their last good version are still live. Each: collection, path,
    reason, detail, documents (how many served), examples (their first paths), target, and
    `action`, what to do about it."""
    rows = store.held_files(collection, RAW, CHUNKS)
    for row in rows:
        row["action"] = (f"fix {row['path']} and run rag ingest on it again, or delete what is served: "
                         f"rag delete {shlex.quote(row['target'])} --collection {shlex.quote(row['collection'])}")
    return rows


@dataclass
class ReconcilePlan:
    """Files that need a run: never processed, failed somewhere, or stale (content or settings);
    and `held`, files a run cannot bring up to date: their current content is skipped while an
    older version is served (its vectors stay in the space and settings they were made with)."""

    missing: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return sorted(set(self.missing) | set(self.failed) | set(self.stale))


def plan_reconcile(store: Store, settings: Settings, targets: list[FileTarget], fingerprint: str) -> ReconcilePlan:
    """Compare the files on disk with the stored stage outputs."""
    raw = store.stage_index(RAW)
    published = store.stage_index(VECTORS)
    broken = {k for stage in STAGES for k, (_, status, _) in store.stage_index(stage).items()
              if status in ("failed", "upstream_failed")}
    held = {(r["collection"], r["path"]) for r in held_files(store)}
    # files whose skips were judged under limits that have other values now: a run judges them again
    rejudged = {(c, p) for (c, p, _), judged in store.skip_judgements((RAW, CHUNKS)).items()
                if not judgement_holds(judged, settings)}
    plan = ReconcilePlan()
    for t in targets:
        ident = (t.collection, t.rel)
        if ident in broken:
            plan.failed.append(t.key)
            continue
        if ident not in raw:
            plan.missing.append(t.key)
            continue
        digest, status, _ = raw[ident]
        if digest != file_hash(t.path, t.root, settings) or ident in rejudged:
            plan.stale.append(t.key)
        elif status == "skipped":
            if ident in held:  # a run would skip it again: its older version stays as it is
                plan.held.append(t.key)
        elif ident not in published:
            plan.missing.append(t.key)
        elif published[ident][2] != fingerprint:
            plan.stale.append(t.key)  # a run under new settings may publish what was over a limit
        elif ident in held:
            plan.held.append(t.key)
    return plan
