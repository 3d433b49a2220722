"""The pipeline stages per file, as the orchestrator runs them: each stage reads the previous
stage's stored output (rag_stage_outputs), does its work through `Pipeline`, stores its own
output and returns a `StageOutcome` for people (counts, reasons, previews).

A bad file is an outcome (`skipped`), never an exception; an unexpected error in one file is a
`failed` outcome of that file only, and later stages report `upstream_failed` for it."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rag_lib.errors import RagError
from rag_lib.log import get_logger
from rag_lib.models import Chunk, Document, Section, Skipped
from rag_lib.pipeline import Pipeline, Prepared
from rag_lib.watch import FileTarget

log = get_logger(__name__)

RAW, SECTIONS, CHUNKS, EMBEDDINGS, VECTORS = "raw_documents", "flattened_sections", "chunks", "embeddings", "vector_table"
STAGES = (RAW, SECTIONS, CHUNKS, EMBEDDINGS, VECTORS)
EMBED_GROUP_CHUNKS = 512  # chunks per provider call group, as in rag_lib.ingest


@dataclass
class StageOutcome:
    """What one stage did to one file."""

    key: str
    status: str  # ok | unchanged | skipped | failed | upstream_failed
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == "failed"


def _doc_meta(doc: Document) -> dict[str, Any]:
    meta = {f.name: getattr(doc, f.name) for f in dataclasses.fields(doc) if f.name != "body"}
    meta["doc_date"] = doc.doc_date.isoformat() if doc.doc_date else None
    return meta


def _doc_from_meta(meta: dict[str, Any]) -> Document:
    data = dict(meta)
    data["doc_date"] = dt.date.fromisoformat(data["doc_date"]) if data.get("doc_date") else None
    return Document(body=None, **data)


def _file_hash(target: FileTarget) -> str:
    return hashlib.sha256(target.path.read_bytes()).hexdigest()


def token_histogram(counts: list[int], edges: tuple[int, ...] = (0, 16, 32, 64, 128, 192, 256, 512)) -> str:
    """A markdown table of chunk token counts per bucket."""
    rows = ["| tokens | chunks |", "|---|---|"]
    for lo, hi in zip(edges, edges[1:] + (None,)):
        n = sum(1 for c in counts if c >= lo and (hi is None or c < hi))
        rows.append(f"| {lo}–{hi - 1 if hi else '∞'} | {n} |")
    return "\n".join(rows)


class StageRunner:
    """Runs stages for files with one `Pipeline`; `force` redoes work even for current files."""

    def __init__(self, pipeline: Pipeline, force: bool = False):
        self.pipeline = pipeline
        self.store = pipeline.store
        self.force = force
        self._states: dict[str, dict[str, tuple[str, str]]] = {}
        self.embed_totals: dict[str, int] = {}

    # ---- helpers -----------------------------------------------------------------------

    def _states_of(self, collection: str) -> dict[str, tuple[str, str]]:
        if collection not in self._states:
            self._states[collection] = self.store.document_states(collection)
        return self._states[collection]

    def _save(self, t: FileTarget, stage: str, payload: dict[str, Any], digest: str | None) -> None:
        payload.setdefault("fingerprint", self.pipeline.fingerprint)
        self.store.save_stage(t.collection, t.rel, stage, payload, digest)

    def _upstream(self, t: FileTarget, stage: str) -> tuple[dict[str, Any] | None, StageOutcome | None]:
        """The stored raw + previous stage output, or the outcome to report instead of working."""
        raw = self.store.load_stage(t.collection, t.rel, RAW)
        if raw is None:
            return None, StageOutcome(t.key, "failed", error=f"{RAW} has not been materialized for {t.key}")
        if raw["status"] == "skipped":
            return None, StageOutcome(t.key, "skipped", {"skip_reason": raw.get("skip_reason")})
        if raw["status"] == "failed":
            return None, StageOutcome(t.key, "upstream_failed", error=raw.get("error"))
        previous = STAGES[STAGES.index(stage) - 1]
        before = raw if previous == RAW else self.store.load_stage(t.collection, t.rel, previous)
        if before is not None and before.get("status") in ("failed", "upstream_failed"):
            # Stored too, so the stages after this one see the failure rather than a missing row.
            self._save(t, stage, {"status": "upstream_failed", "error": before.get("error"),
                                  "file_hash": raw["file_hash"]}, raw["file_hash"])
            return None, StageOutcome(t.key, "upstream_failed", error=before.get("error"))
        if before is None or before.get("file_hash") != raw["file_hash"]:
            return None, StageOutcome(
                t.key, "failed", error=f"{previous} is missing or older than {RAW} for {t.key}; rematerialize it")
        if not self.force and raw.get("current"):
            mine = self.store.load_stage(t.collection, t.rel, stage)
            if (mine and mine.get("status") == "ok" and mine.get("file_hash") == raw["file_hash"]
                    and mine.get("fingerprint") == self.pipeline.fingerprint):
                return None, StageOutcome(t.key, "unchanged", {"documents": len(raw["documents"])})
        return raw, None

    def _guard(self, t: FileTarget, stage: str, fn) -> StageOutcome:
        """Run one file's stage; an unexpected error becomes that file's `failed` outcome."""
        try:
            return fn()
        except (RagError, OSError, ValueError, TypeError, KeyError) as exc:
            log.exception("%s failed for %s", stage, t.key)
            message = f"{type(exc).__name__}: {exc}"
            self._save(t, stage, {"status": "failed", "error": message, "file_hash": None}, None)
            return StageOutcome(t.key, "failed", {"error": message}, error=message)

    # ---- stages ------------------------------------------------------------------------

    def raw_documents(self, t: FileTarget) -> StageOutcome:
        return self._guard(t, RAW, lambda: self._raw(t))

    def _raw(self, t: FileTarget) -> StageOutcome:
        if not t.path.is_file():
            raise FileNotFoundError(f"{t.path} does not exist (deleted files are removed by the corpus sensor)")
        file_hash = _file_hash(t)
        items = self.pipeline.load(t.path, t.root, t.collection)
        docs = [i for i in items if isinstance(i, Document)]
        skips = [i for i in items if isinstance(i, Skipped)]
        for s in skips:
            self.store.record_skip(s)
        states = self._states_of(t.collection)
        current = bool(docs) and all(self.pipeline.is_current(d, states) for d in docs)
        status = "skipped" if not docs else "ok"
        reason = skips[0].reason if skips and not docs else None
        payload = {
            "status": status, "file_hash": file_hash, "current": current,
            "documents": [_doc_meta(d) for d in docs],
            "skipped": [{"path": s.path, "reason": s.reason, "detail": s.detail} for s in skips],
            "skip_reason": reason,
        }
        self._save(t, RAW, payload, file_hash)
        meta: dict[str, Any] = {
            "documents": len(docs), "skipped_records": len(skips), "size_bytes": t.path.stat().st_size,
            "content_hash": file_hash[:16], "up_to_date": current,
        }
        if docs:
            d = docs[0]
            meta.update(doc_type=d.doc_type, doc_id=d.doc_id, format=d.format, ticker=d.ticker or "",
                        doc_date=d.doc_date.isoformat() if d.doc_date else "")
        if reason:
            meta.update(skip_reason=reason, skip_detail=skips[0].detail)
        return StageOutcome(t.key, status, meta)

    def flattened_sections(self, t: FileTarget) -> StageOutcome:
        return self._guard(t, SECTIONS, lambda: self._sections(t))

    def _sections(self, t: FileTarget) -> StageOutcome:
        raw, early = self._upstream(t, SECTIONS)
        if early:
            return early
        if _file_hash(t) != raw["file_hash"]:
            raise ValueError(f"{t.rel} changed after {RAW} was materialized; rematerialize from {RAW}")
        docs = [i for i in self.pipeline.load(t.path, t.root, t.collection) if isinstance(i, Document)]
        out, total, empty = [], 0, 0
        for doc in docs:
            sections = self.pipeline.sections(doc)
            total += len(sections)
            empty += sum(1 for s in sections if s.is_empty)
            out.append({"path": doc.path, "sections": [dataclasses.asdict(s) for s in sections]})
        self._save(t, SECTIONS, {"status": "ok", "file_hash": raw["file_hash"], "documents": out}, raw["file_hash"])
        names = [s["name"] for d in out for s in d["sections"]][:20]
        return StageOutcome(t.key, "ok", {"sections": total, "empty_sections": empty,
                                          "section_names": ", ".join(names)})

    def chunks(self, t: FileTarget) -> StageOutcome:
        return self._guard(t, CHUNKS, lambda: self._chunks(t))

    def _chunks(self, t: FileTarget) -> StageOutcome:
        raw, early = self._upstream(t, CHUNKS)
        if early:
            return early
        sections_out = self.store.load_stage(t.collection, t.rel, SECTIONS)
        by_path = {d["path"]: d["sections"] for d in sections_out["documents"]}
        out, counts, preview = [], [], []
        for meta in raw["documents"]:
            doc = _doc_from_meta(meta)
            sections = [Section(**s) for s in by_path.get(doc.path, [])]
            chunks = self.pipeline.chunker.chunk(doc, sections)
            counts.extend(c.token_count for c in chunks)
            preview.extend(chunks[:5 - len(preview)] if len(preview) < 5 else [])
            out.append({
                "path": doc.path,
                "section_tokens": {s.name: s.token_count for s in sections},
                "chunks": [c.to_dict() for c in chunks],
            })
        self._save(t, CHUNKS, {"status": "ok", "file_hash": raw["file_hash"], "documents": out}, raw["file_hash"])
        return StageOutcome(t.key, "ok", {
            "chunks": len(counts), "tokens": sum(counts), "max_tokens": max(counts, default=0),
            "token_counts": counts,
            "preview": [{"section_path": c.section_path, "tokens": c.token_count, "text": c.text[:80]} for c in preview],
        })

    def embeddings(self, targets: list[FileTarget]) -> list[StageOutcome]:
        """Embed the chunks of many files together (the encoder wants large batches); a failing
        group is retried file by file so one bad file fails alone."""
        outcomes: dict[str, StageOutcome] = {}
        ready: list[tuple[FileTarget, dict[str, Any], list[Chunk]]] = []
        for t in targets:
            try:
                raw, early = self._upstream(t, EMBEDDINGS)
                if early:
                    outcomes[t.key] = early
                    continue
                payload = self.store.load_stage(t.collection, t.rel, CHUNKS)
                chunks = [Chunk.from_dict(c) for d in payload["documents"] for c in d["chunks"]]
                ready.append((t, raw, chunks))
            except (RagError, OSError, ValueError, TypeError, KeyError) as exc:
                outcomes[t.key] = StageOutcome(t.key, "failed", error=f"{type(exc).__name__}: {exc}")
        totals = Counter()

        def embed_group(group: list[tuple[FileTarget, dict[str, Any], list[Chunk]]]) -> None:
            try:
                result = self.pipeline.embed([c for _, _, cs in group for c in cs])
            except (RagError, OSError, ValueError) as exc:
                if len(group) > 1:
                    log.warning("embedding %d files failed (%s); retrying file by file", len(group), exc)
                    for item in group:
                        embed_group([item])
                    return
                t = group[0][0]
                outcomes[t.key] = self._guard(t, EMBEDDINGS, lambda exc=exc: _raise(exc))
                return
            totals.update(cache_hits=result.cache_hits, embedded=result.embedded)
            offset = 0
            for t, raw, cs in group:
                vecs = result.vectors[offset: offset + len(cs)]
                offset += len(cs)
                outcomes[t.key] = self._guard(
                    t, EMBEDDINGS, lambda t=t, raw=raw, cs=cs, vecs=vecs: self._store_vectors(t, raw, cs, vecs))

        group: list[tuple[FileTarget, dict[str, Any], list[Chunk]]] = []
        for item in ready:
            group.append(item)
            if sum(len(cs) for _, _, cs in group) >= EMBED_GROUP_CHUNKS:
                embed_group(group)
                group = []
        if group:
            embed_group(group)
        self.embed_totals = dict(totals)
        return [outcomes[t.key] for t in targets]

    def _store_vectors(self, t: FileTarget, raw: dict[str, Any], chunks: list[Chunk], vectors: np.ndarray) -> StageOutcome:
        cfg = self.pipeline.settings.embedding
        self.store.save_stage_vectors(
            t.collection, t.rel, [(c.chunk_id, c.content_hash) for c in chunks], vectors, cfg.model, cfg.dimensions)
        payload = {"status": "ok", "file_hash": raw["file_hash"], "model": cfg.model, "dimensions": cfg.dimensions,
                   "space": self.pipeline.provider.space, "vectors": len(chunks)}
        self._save(t, EMBEDDINGS, payload, raw["file_hash"])
        return StageOutcome(t.key, "ok", {"vectors": len(chunks), "model": cfg.model, "dimensions": cfg.dimensions,
                                          "provider": self.pipeline.provider.name})

    def vector_table(self, t: FileTarget) -> StageOutcome:
        return self._guard(t, VECTORS, lambda: self._publish(t))

    def _publish(self, t: FileTarget) -> StageOutcome:
        raw, early = self._upstream(t, VECTORS)
        if early:
            return early
        cfg = self.pipeline.settings.embedding
        sections_out = {d["path"]: d["sections"] for d in self.store.load_stage(t.collection, t.rel, SECTIONS)["documents"]}
        chunks_out = {d["path"]: d for d in self.store.load_stage(t.collection, t.rel, CHUNKS)["documents"]}
        staged = self.store.load_stage_vectors(t.collection, t.rel)
        published, rows = [], 0
        for meta in raw["documents"]:
            doc = _doc_from_meta(meta)
            entry = chunks_out[doc.path]
            sections = [Section(**{**s, "token_count": entry["section_tokens"].get(s["name"], s["token_count"])})
                        for s in sections_out.get(doc.path, [])]
            chunks = [Chunk.from_dict(c) for c in entry["chunks"]]
            missing = [c.chunk_id for c in chunks if c.chunk_id not in staged]
            if missing:
                raise ValueError(f"{len(missing)} chunks of {doc.path} have no staged vector; rematerialize embeddings")
            vectors = (np.stack([staged[c.chunk_id] for c in chunks]) if chunks
                       else np.zeros((0, cfg.dimensions), dtype=np.float32))
            self.pipeline.publish(Prepared(doc, sections, chunks), vectors)
            published.append(doc.path)
            rows += len(chunks)
        # Records that vanished from a multi-document file (JSONL) are deleted, not left orphaned.
        previous = self.store.load_stage(t.collection, t.rel, VECTORS) or {}
        for gone in set(previous.get("documents", [])) - set(published):
            self.store.delete_document(t.collection, gone)
        self._save(t, VECTORS, {"status": "ok", "file_hash": raw["file_hash"], "documents": published}, raw["file_hash"])
        return StageOutcome(t.key, "ok", {"documents": len(published), "rows": rows, "space": self.pipeline.provider.space})

    # ---- housekeeping ------------------------------------------------------------------

    def ensure_space(self) -> None:
        cfg = self.pipeline.settings.embedding
        self.store.ensure_space(self.pipeline.provider.space, cfg.model, cfg.dimensions, self.pipeline.provider.name)

    def forget(self, t: FileTarget) -> list[str]:
        """Delete a (deleted) file's documents and stage rows."""
        raw = self.store.load_stage(t.collection, t.rel, RAW) or {}
        doc_paths = [d["path"] for d in raw.get("documents", [])]
        return self.store.forget_file(t.collection, t.rel, doc_paths)


@dataclass
class ReconcilePlan:
    """Files that need a run: never processed, failed somewhere, or stale (content or settings)."""

    missing: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    @property
    def keys(self) -> list[str]:
        return sorted(set(self.missing) | set(self.failed) | set(self.stale))


def plan_reconcile(store, targets: list[FileTarget], fingerprint: str) -> ReconcilePlan:
    """Compare the files on disk with the stored stage outputs."""
    raw = store.stage_index(RAW)
    published = store.stage_index(VECTORS)
    broken = {k for stage in STAGES for k, (_, status, _) in store.stage_index(stage).items()
              if status in ("failed", "upstream_failed")}
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
        if digest != _file_hash(t):
            plan.stale.append(t.key)
        elif status == "skipped":
            continue
        elif ident not in published:
            plan.missing.append(t.key)
        elif published[ident][2] != fingerprint:
            plan.stale.append(t.key)
    return plan


def _raise(exc: BaseException):
    raise exc

