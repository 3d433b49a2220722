"""Incremental ingest of corpus roots (`rag ingest`), in one process through the same per-file
stages the Dagster assets run: new and changed files are processed, unchanged ones are left alone, bad input is recorded and skipped, an unexpected error in one file is that
file's failure (the run goes on), and `prune` removes documents whose files are gone."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from rag_lib.corpus_files import empty_folder_warning, file_gone, path_refusal
from rag_lib.documents import file_of, iter_corpus_files, record_of
from rag_lib.corpus_scan import FileTarget
from rag_lib.ingest.overlap import overlapped
from rag_lib.ingest.stages import Engine, Loaded
from rag_lib.ingest.state import (CHUNKS, EMBEDDINGS, RAW, SECTIONS, STAGES, VECTORS, StageOutcome, StageRunner,
                                  held_files, unread_records)
from rag_lib.errors import LimitExceededError, ValidationError
from rag_lib.graph.extract import forget_corpus_indexes
from rag_lib.log import get_logger
from rag_lib.models import FileOutcome, IngestReport, ParsedFile, Skipped, SourceFile

log = get_logger(__name__)

ProgressFn = Callable[[str, int, int], None]  # (file just done, files done, files in all)


def _placed(raw: Path, root: Path | None) -> tuple[Path, Path, bool]:
    """(root, path, is a folder) of one path argument. A directory is its own root; a file's root is
    `root` or its folder. A file is taken as spelled (its link, if it is one, is not followed here):
    reading it confines it to its root, so a link out of the root is refused there, as for every file
    of a folder."""
    spelled = Path(os.path.abspath(raw))
    if not os.path.lexists(spelled):
        raise ValidationError(f"{raw}: no such file or directory")
    if root is not None and not root.is_dir():
        raise ValidationError(f"--root {root}: not an existing directory (the root is the folder paths are relative to)")
    is_dir = spelled.is_dir()
    # a folder is resolved whole; a file only up to its folder
    path = spelled.resolve() if is_dir else spelled.parent.resolve() / spelled.name
    base = root.resolve() if root else (path if is_dir else path.parent)
    if root and not path.is_relative_to(base):
        raise ValidationError(f"{raw} is not inside --root {root}")
    return base, path, is_dir


def collect_files(paths: Iterable[Path], root: Path | None = None) -> list[tuple[Path, Path]]:
    """(root, file) pairs of the files under `paths` (see `_placed` for roots)."""
    pairs: list[tuple[Path, Path]] = []
    for raw in paths:
        base, path, _ = _placed(raw, root)
        pairs.extend((base, f) for f in iter_corpus_files(path))
    return pairs


@dataclass(frozen=True)
class PruneScope:
    """What one path argument of an ingest lets `prune` delete: documents under its folder (`rel`
    under the root, "" for the whole root) or of its one file (and its JSONL records), and only
    those read from that place on disk or whose file is gone: not another root's documents of the
    same collection, nor the rest of a folder when one file of it is ingested."""

    place: Path  # resolved folder or file
    rel: str
    folder: bool

    @classmethod
    def of(cls, raw: Path, root: Path | None) -> PruneScope:
        base, path, folder = _placed(raw, root)
        rel = path.relative_to(base).as_posix()
        return cls(Path(os.path.realpath(path)), "" if rel == "." else rel, folder)  # a link loop: no RuntimeError

    def covers_file(self, rel: str) -> bool:
        """A file's path (relative to its root) is within this argument."""
        return (not self.rel or rel.startswith(self.rel + "/")) if self.folder else rel == self.rel

    def covers(self, doc_path: str, source: str | None) -> bool:
        """A stored document (its path and the file it was read from) is within this argument."""
        if not self.covers_file(file_of(doc_path)):
            return False
        if file_gone(source):
            return True
        return Path(source).is_relative_to(self.place) if self.folder else Path(source) == self.place


def source_files(paths: Iterable[Path], collection: str, root: Path | None = None) -> list[SourceFile]:
    """The files under `paths` as `SourceFile`s of `collection` (see `collect_files` for roots)."""
    return [SourceFile(collection, base, file.relative_to(base).as_posix() if base.is_dir() else file.name)
            for base, file in collect_files(paths, root)]


FILES_PER_ROUND = 32  # files taken through the stages together: embedding batches of ~500+ chunks, steady progress
FIRST_ROUND = 2  # the first and last rounds' files; the rounds between double up to FILES_PER_ROUND
# A round's stages in three steps, each on its own thread (`overlapped`): while the encoder embeds one
# round, the next is read, parsed and chunked and the previous one published, so ingest goes at the
# encoder's pace. `rag ingest` adds a step between the first two (`StageRunner.encode_ahead`): a round
# chunked is queued for the encoder at once, so its workers take it up the moment the round before
# runs out, not once that round's vectors are cached and staged. At most ROUNDS_IN_FLIGHT rounds are
# between reading and publishing (the memory bound).
STEPS = ((RAW, SECTIONS, CHUNKS), (EMBEDDINGS,), (VECTORS,))
ROUNDS_IN_FLIGHT = 4
# what each stage is called in an ingest report's failure reasons and rag_failures sources
STEP = {RAW: "load", SECTIONS: "prepare", CHUNKS: "prepare", EMBEDDINGS: "embed", VECTORS: "publish"}


def ingest(
    engine: Engine,
    paths: Iterable[Path],
    collection: str,
    *,
    prune: bool = False,
    force: bool = False,
    root: Path | None = None,
    progress: ProgressFn | None = None,
    parsed: Mapping[str, ParsedFile] | None = None,
    max_request_chunks: int | None = None,
    prune_empty: bool = False,
) -> IngestReport:
    """Bring the collection in step with the files under `paths`; see module docstring. The files
    go through the per-file stage runner (`rag_lib.ingest.state`), the one the Dagster assets run,
    all stages in one process, up to `FILES_PER_ROUND` files at a time (`in_rounds`), a round's steps (`STEPS`)
    overlapping the other rounds'; a file's failure is its own in every step, as in one Dagster run.

    `parsed` (by path relative to the root): files loaded and flattened already (the server's parse
    sandbox), not parsed again. `max_request_chunks` (a server request): every document is prepared
    before any is embedded, and a document over `limits.max_chunks_per_document` or all of them over
    this number raise `LimitExceededError` with nothing embedded or written; without it, a document
    over the per-document limit is skipped with its reason and the others go on.

    `prune` leaves the documents of a root that lists no files at all (an unmounted disk leaves an
    empty folder) and warns; `prune_empty` deletes them too."""
    started = time.perf_counter()
    forget_corpus_indexes()  # files added since the last run name tickers and link targets for this one
    store = engine.store
    engine.publisher.ensure_space()
    report = IngestReport(collection=collection)
    paths = list(paths)
    listed = source_files(paths, collection, root)
    files, refused = _keyable(listed)
    _refuse_one_path_twice(files, collection)
    for skip in refused:  # recorded as the Dagster partition sync records them; no stage row can hold the path
        store.record_skip(skip)
        report.outcomes.append(FileOutcome(skip.path, "skipped", reason=skip.reason, detail=skip.detail))
    runner = StageRunner(engine.settings, store, lambda: engine, force=force, outage_raises=True)
    for source in files:
        early = (parsed or {}).get(source.rel)
        if early:
            runner.preset(Loaded(source, early.documents, early.skips, early.file_hash), early.sections)
    if max_request_chunks is not None:
        _refuse_over_limits(engine, runner, files, collection, force, max_request_chunks)
    seen: set[str] = set()
    targets = [FileTarget(s.collection, s.root, s.rel, s.rel) for s in files]
    rounds = [_Round(r) for r in in_rounds(targets)]
    steps = [lambda r, stages=stages: runner.run_all(r.targets, stages, r.outcomes) for stages in STEPS]
    steps.insert(1, lambda r: runner.encode_ahead(r.targets))
    done = 0
    try:
        # stopped early (Ctrl-C, an outage): the other steps stop at their next file, not their round's end
        for r in overlapped(rounds, steps, ROUNDS_IN_FLIGHT, stop=runner.stop):
            rows = runner.rows((RAW, CHUNKS), [(t.collection, t.rel) for t in r.targets])
            for t in r.targets:
                seen.update(_report_file(engine, report, t, r.outcomes[t.key], rows))
            runner.release(r.targets)
            for t in r.targets:
                done += 1
                if progress:
                    progress(str(t.path), done, len(files))
    finally:
        runner.abandon_started()  # rounds started for the encoder that a stopped run never embeds
    report.chunks_from_cache = runner.embed_totals["chunks_from_cache"]
    report.texts_embedded = runner.embed_totals["texts_embedded"]
    # Bulk loads build the HNSW index after loading; later ingests find it and insert into it.
    if report.chunks:
        engine.publisher.ensure_index()
    scopes = [PruneScope.of(p, root) for p in paths]
    empty = [] if prune_empty else _listing_nothing(scopes, [s.path for s in listed])
    if prune or prune_empty:
        report.pruned = _prune(store, collection, seen, scopes, {s.rel for s in files}, empty)
    else:  # said, not done: a renamed or deleted file's documents would otherwise be served unnoticed
        report.stale = _gone_documents(store, collection, seen, scopes, {s.rel for s in files}, empty, quiet=True).gone
    if skipped := {(record_of(o.path) or (o.path,))[0] for o in report.outcomes if o.status == "skipped"}:
        # "skipped" alone read as if the file were left out: its last good version still serves
        report.held = sorted(r["path"] for r in held_files(store, collection) if r["path"] in skipped)
    report.seconds = time.perf_counter() - started
    return report


def _listing_nothing(scopes: list[PruneScope], listed: list[Path]) -> list[PruneScope]:
    """The roots (folder arguments that are their own root) under which this ingest listed no file
    at all. A subfolder emptied of its files is pruned as usual: its root lists others."""
    return [s for s in scopes if s.folder and not s.rel and not any(p.is_relative_to(s.place) for p in listed)]


@dataclass
class _Gone:
    """What a prune of some scopes would delete (`gone`), with the scopes that listed files
    (`listing`) and the source file of every document within the scopes' paths (`sources`), which
    its stage-row cleanup reads."""

    gone: list[str]
    listing: list[PruneScope]
    sources: dict[str, str | None]


def _gone_documents(store, collection: str, seen: set[str], scopes: list[PruneScope], on_disk: set[str],
                    empty: list[PruneScope], quiet: bool = False) -> _Gone:
    """The documents within `scopes` that this ingest did not see and whose files are known to be
    gone (`file_gone`): not one in a folder the walk could not read, nor one another process wrote
    after this ingest listed its folder, nor one under the `empty` scopes (roots that list no file at
    all: unless `quiet`, a warning names each that holds documents)."""
    # only the documents within the scopes' paths: a one-file ingest into 100k documents reads its own
    sources = store.document_sources_under(collection, [s.rel for s in scopes if s.folder],
                                           [s.rel for s in scopes if not s.folder])
    # a registered root whose folder is missing (an unmounted disk) has not lost its files
    away = [r.path for r in store.list_roots() if r.collection == collection and not r.path.is_dir()]
    listing = [s for s in scopes if s not in empty]
    unseen = {p: src for p, src in sources.items() if p not in seen and any(s.covers(p, src) for s in scopes)
              and not (src and any(Path(src).is_relative_to(a) for a in away))}
    held: set[str] = set()
    for scope in empty:  # an empty listing of a folder that holds documents is not their deletion
        # its documents: read from under it, or within no folder argument that listed files
        if mine := {p for p, src in unseen.items() if scope.covers(p, src) and (
                (src and Path(src).is_relative_to(scope.place)) or not any(s.covers(p, src) for s in listing))}:
            if not quiet:
                log.warning("%s", empty_folder_warning(scope.place, collection, len(mine)))
            held |= mine
    unseen = {p: src for p, src in unseen.items() if p not in held}
    gone = sorted(p for p, src in unseen.items() if file_of(p) in on_disk or file_gone(src))
    if (unlisted := sorted(set(unseen) - set(gone))) and not quiet:
        log.warning("prune kept %d document(s) whose file this ingest could not list but that is not gone "
                    "(an unreadable folder, or written meanwhile): %s", len(unlisted), ", ".join(unlisted[:10]))
    return _Gone(gone, listing, sources)


def _prune(store, collection: str, seen: set[str], scopes: list[PruneScope], on_disk: set[str],
           empty: list[PruneScope]) -> list[str]:
    """Delete the documents `_gone_documents` finds, and the stage rows of such files (a file put
    back later starts afresh); returns the paths deleted."""
    plan = _gone_documents(store, collection, seen, scopes, on_disk, empty)
    for path in plan.gone:
        store.delete_document(collection, path)
    kept_files = {file_of(p) for p in set(plan.sources) - set(plan.gone)}
    for (c, rel) in store.stage_index(RAW):
        if c == collection and rel not in on_disk and rel not in kept_files and any(
                s.covers_file(rel) for s in plan.listing):
            store.forget_file(c, rel, [])
    return plan.gone


def round_sizes(files: int) -> list[int]:
    """How many files each round takes: FIRST_ROUND first and last, doubling towards the middle up
    to FILES_PER_ROUND. Nothing overlaps the first round's preparing (the encoder waits for it) nor
    the last round's publishing (the encoder is done): with rounds of 32 files, those took ~2 s of a
    copy of the shared corpus's ~75 s."""
    head: list[int] = []
    tail: list[int] = []
    size, left = min(FIRST_ROUND, FILES_PER_ROUND), files
    while left > 0:
        for end in (head, tail):
            if left > 0:
                end.append(min(size, left))
                left -= end[-1]
        size = min(2 * size, FILES_PER_ROUND)
    return head + tail[::-1]


T = TypeVar("T")


def in_rounds(items: list[T]) -> list[list[T]]:
    """`items` cut into consecutive rounds of `round_sizes`."""
    rounds, start = [], 0
    for size in round_sizes(len(items)):
        rounds.append(items[start: start + size])
        start += size
    return rounds


@dataclass
class _Round:
    """Files taken through the stages together, with their outcomes (key → stage → outcome)."""

    targets: list[FileTarget]
    outcomes: dict[str, dict[str, StageOutcome]] = field(default_factory=dict)


def _refuse_one_path_twice(files: list[SourceFile], collection: str) -> None:
    """Two files of one ingest with the same path under their roots (`a/x.md` and `b/x.md`, both
    `x.md`) would be one document, the second silently replacing the first: refused before anything."""
    first: dict[str, SourceFile] = {}
    for source in files:
        other = first.setdefault(source.rel, source)
        if other is not source and other.path != source.path:
            raise ValidationError(
                f"{other.path} and {source.path} would both be document '{source.rel}' of collection "
                f"'{collection}': ingest them into different collections, or ingest their common folder as one root")


def _keyable(files: list[SourceFile]) -> tuple[list[SourceFile], list[Skipped]]:
    """The files whose path can key a stage row, and a `path_too_long` skip for each other one."""
    refusals = [(source, path_refusal(source.collection, source.rel)) for source in files]
    return [s for s, r in refusals if r is None], [r for _, r in refusals if r is not None]


def _refuse_over_limits(engine: Engine, runner: StageRunner, files: list[SourceFile], collection: str,
                        force: bool, max_request_chunks: int) -> None:
    """A server request: prepare every document that would be embedded (no database, nothing
    written) and raise over the per-document or per-request chunk limit; the runner keeps what was
    parsed so the stages do not parse it again."""
    states = engine.store.document_states(collection)
    total = 0
    for source in files:
        loaded = runner.loaded(source) or engine.preparer.load(source)
        runner.preset(loaded)
        for doc in loaded.documents:
            if not force and engine.publisher.is_current(doc, states):
                continue
            total += len(engine.preparer.prepare(doc, runner.sections(collection, doc.path)).chunks)  # TooManyChunksError
            if total > max_request_chunks:
                raise LimitExceededError(
                    f"this request has at least {total} chunks, over limits.max_chunks_per_request={max_request_chunks} "
                    "(RAG_LIMITS__MAX_CHUNKS_PER_REQUEST); send fewer documents per request or raise the setting")


def _report_file(engine: Engine, report: IngestReport, t: FileTarget, stages: dict[str, StageOutcome],
                 rows: dict) -> set[str]:
    """One file's outcomes in the report (per document, JSONL records each), its failure recorded;
    returns the document paths a prune must keep."""
    raw = rows.get((t.collection, t.rel, RAW)) or {}
    documents = [d["path"] for d in raw.get("documents", [])]
    warnings = {d["path"]: d.get("warnings") or [] for d in raw.get("documents", [])}
    for s in raw.get("skipped", []):
        report.outcomes.append(FileOutcome(s["path"], "skipped", reason=s["reason"], detail=s["detail"]))
    keep = {t.rel, *documents, *(s["path"] for s in raw.get("skipped", []))}
    if unread_records(raw):
        # which record a broken line held can't be told: the publisher keeps every live record of the
        # file (`unread_records`), and so must prune (it deleted them) and the stale list
        keep |= set(engine.store.document_sources_under(t.collection, [], [t.rel]))
    failed = next((stages[st] for st in STAGES if st in stages and stages[st].status == "failed"), None)
    if failed is not None:  # the file keeps its last good version (prune leaves it)
        stage = next(st for st in STAGES if stages.get(st) is failed)
        engine.store.record_failure(f"ingest:{STEP[stage]}", f"{t.rel}: {failed.error}", run_id=engine.embedder.run_id,
                                    collection=t.collection,
                                    partition=t.rel)
        for path in documents or [t.rel]:
            report.outcomes.append(FileOutcome(path, "failed", reason=failed.reason or f"{STEP[stage]}_failed",
                                               detail=failed.error))
        return keep
    chunk_skips = (rows.get((t.collection, t.rel, CHUNKS)) or {}).get("skipped", [])
    for s in chunk_skips:
        report.outcomes.append(FileOutcome(s["path"], "skipped", reason=s["reason"], detail=s["detail"]))
    skipped = {s["path"] for s in chunk_skips}
    published = stages.get(VECTORS)
    for path in documents:
        if path in skipped:
            continue
        status, chunks = published.documents.get(path, ("unchanged", 0)) if published else ("unchanged", 0)
        report.outcomes.append(FileOutcome(path, status, chunks=chunks, warnings=warnings[path]))
    return keep
