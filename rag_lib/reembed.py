"""Re-embed without downtime: fill a new space (model:dims) beside the active one from the cache or
the provider while search keeps serving the old space; when coverage is 100%, every vector has the
space's size and (optionally) retrieval quality holds, build its HNSW index and switch the active
space in one transaction. Rollback switches back to the previous space; drop-old frees retired ones.

Documents published while a re-embed runs get vectors only in the active space; the fill loop
catches them up, and the switch itself re-checks coverage under a lock that holds publishing for
its few milliseconds, so the new space is complete at the instant it becomes active; a publish reads
the active space in its own transaction under the lock the switch waits for, so it either commits
before the switch (whose check then counts it) or is refused after it. After a switch
(and a rollback) the documents are carried over to the new space (`carry_over`): settings naming it
find them current, so nothing is republished and the old space keeps its vectors for a rollback."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from rag_lib.chunking import CHUNKER_VERSION
from rag_lib.config import Settings
from rag_lib.embedding import EmbeddingProvider, provider_for_space
from rag_lib.embedding.spaces import PinnedStore
from rag_lib.ingest.stages import Embedder, error_text
from rag_lib.errors import ConfigError, EmbeddingError, NotFoundError, ReembedRunningError, ValidationError
from rag_lib.log import get_logger
from rag_lib.store import Store
from rag_lib.versions import fingerprint, stage_versions

log = get_logger(__name__)

ProgressFn = Callable[[int, int], None]  # (vectors in the new space, live chunks)
# Scores one space on the configured eval set: (store, provider of that space, space row, eval set) → nDCG@10
QualityScorer = Callable[[Store, EmbeddingProvider, dict[str, Any], Path], float]
SWITCH_ATTEMPTS = 5  # catch-up rounds when documents change between the last fill and the switch


@dataclass
class Gate:
    name: str
    passed: bool
    detail: str


@dataclass
class ReembedReport:
    space: str
    previous: str | None
    run_id: str
    # Chunks and texts are counted apart: chunks with the same text (a file copied, a repeated
    # disclaimer) share one vector, embedded once.
    chunks: int = 0  # live chunks given a vector in the space
    chunks_from_cache: int = 0  # of those, the ones whose text's vector was in the embedding cache
    texts_embedded: int = 0  # distinct chunk texts the provider embedded for the others (what it bills)
    gates: list[Gate] = field(default_factory=list)
    switched: bool = False
    index: dict[str, Any] = field(default_factory=dict)
    # after a switch: what `carry_over` marked as made in the new space, or `skipped`: why nothing
    carried: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def eval_ndcg_at_10(store: Store, provider: EmbeddingProvider, space: dict[str, Any], eval_set: Path) -> float:
    """nDCG@10 (section units, semantic mode) of a BEIR folder (`queries.jsonl`, `qrels.tsv` or
    `qrels/test.tsv`) searched in `space`, with the query embedded by that space's provider; scored by
    the same code as the `retrieval_quality` check (`rag_lib.eval.score_eval_set`)."""
    from rag_lib.eval import score_eval_set
    from rag_lib.search import search as run_search
    from rag_lib.search.retrieval import SearchCaches

    qrels_path = eval_set / "qrels.tsv" if (eval_set / "qrels.tsv").is_file() else eval_set / "qrels" / "test.tsv"
    # the live chunks, the same count for every space: both spaces of a gate are ranked the same way
    exact = store.get_space(space["space"])["chunks"] <= store.settings.search.exact_max_rows
    pinned = ExactPinnedStore(store, space) if exact else PinnedStore(store, space)
    caches = SearchCaches()  # one eval set, one database: routing looks the tickers up once

    def run(text: str):
        return run_search(pinned, provider, text, mode="semantic", top_k=100, caches=caches).hits

    scores = score_eval_set(run, eval_set / "queries.jsonl", qrels_path, unit="section", mode="semantic")
    return scores["all"]["ndcg@10"] if "all" in scores else 0.0


class ExactPinnedStore(PinnedStore):
    """A `PinnedStore` whose semantic searches rank every vector exactly: the quality gate scores
    the new space and the active one on equal terms (an HNSW walk's misses depend on how each
    index was built; the new space may have none yet) and the same data always gets the same figure."""

    def semantic_search(self, *args: Any, **kwargs: Any) -> Any:
        return self._store.semantic_search(*args, **{**kwargs, "exact": True})


def default_quality_scorer() -> QualityScorer | None:
    """The eval-set scorer above (None if the eval module is missing from this install)."""
    try:
        import rag_lib.eval  # noqa: F401
    except ImportError:
        return None
    return eval_ndcg_at_10


class Reembedder:
    """Fills `target`'s space and switches to it; see the module docstring."""

    def __init__(self, settings: Settings, store: Store, target: EmbeddingProvider,
                 scorer: QualityScorer | None = None, progress: ProgressFn | None = None,
                 active_provider: EmbeddingProvider | None = None):
        self.settings = settings
        self.store = store
        self.target = target
        self.scorer = scorer
        self.progress = progress
        self.active_provider = active_provider
        self.run_id = f"reembed-{uuid.uuid4().hex[:12]}"

    @property
    def space(self) -> str:
        return self.target.space

    def start(self) -> str:
        self._note_active_chunker()
        return self.store.begin_building(self.space, self.target.key, self.target.dimensions, self.target.name,
                                         self.target.chunker())

    def _note_active_chunker(self) -> None:
        """Record the active space's chunker from its provider when no ingest has recorded it (one
        by an older version): the switch compares it with the target's (`carry_over`)."""
        active = self.store.active_space()
        if active is None or self.store.get_space(active["space"])["chunker"]:
            return
        try:
            provider = self.active_provider or provider_for_space(self.settings, active["space"])
            self.store.note_space_chunker(active["space"], provider.chunker())
        except ConfigError as exc:  # its documents are republished after the switch, as before
            log.info("the chunker of %s is not known (%s); its documents will not be carried over", active["space"], exc)

    def fill(self, report: ReembedReport) -> None:
        """Vectors for every live chunk missing from the space, batch by batch (each batch is one
        transaction; a failed batch writes nothing and the next run resumes where this one stopped)."""
        batch = max(1, self.settings.embedding.reembed.batch_size)
        embedder = Embedder(self.settings, self.store, self.target, model=self.target.key,
                            dimensions=self.target.dimensions, kind="reembed")
        embedder.begin_run("reembed", self.run_id)
        while rows := self.store.missing_chunks(self.space, batch):
            got = embedder.vectors({h: text for _, h, text in rows})
            written = self.store.write_space_vectors(self.space, self.target.dimensions,
                                                     [(cid, got.vectors[h]) for cid, h, _ in rows])
            fresh = set(got.fresh)
            report.chunks += written
            report.chunks_from_cache += sum(1 for _, h, _ in rows if h not in fresh)
            report.texts_embedded += len(fresh)
            if self.progress:
                info = self.store.get_space(self.space)
                self.progress(info["vectors"], info["chunks"])

    def build_profiles(self) -> dict[str, int]:
        """The new space's ticker profiles (entity linking) for every collection that has them in the
        active space: its searches link tickers as the active space's do, in the quality gate and
        from the switch on. Only profiles whose text or documents changed are embedded again.
        Returns the profiles per collection."""
        from rag_lib.graph.profiles import build_profiles

        active = self.store.active_space()
        if not self.settings.search.entity_linking or active is None or active["space"] == self.space:
            return {}
        pinned = PinnedStore(self.store, self.store.get_space(self.space))  # profiles are built in the "active" space
        return {c: build_profiles(pinned, self.target, c).profiles for c in self.store.profile_collections(active["space"])}

    def gates(self, quality: bool = True) -> list[Gate]:
        """Coverage and dimension consistency always; retrieval quality when an eval set is configured."""
        info = self.store.get_space(self.space)
        if info is None:
            raise NotFoundError(f"no embedding space {self.space}")
        gates = [
            Gate("coverage", info["vectors"] == info["chunks"],
                 f"{info['vectors']}/{info['chunks']} live chunks have a vector ({info['coverage']:.2%})"),
            Gate("dimensions", info["wrong_dims"] == 0 and self.target.dimensions == info["dimensions"],
                 f"{info['wrong_dims']} vectors differ from {info['dimensions']} dimensions"),
        ]
        cfg = self.settings.embedding.reembed
        if cfg.eval_set and quality:
            gates.append(self._quality_gate(Path(cfg.eval_set), cfg.ndcg_tolerance, info))
        return gates

    def _quality_gate(self, eval_set: Path, tolerance: float, info: dict[str, Any]) -> Gate:
        scorer = self.scorer or default_quality_scorer()
        if scorer is None:
            return Gate("quality", False, f"an eval set is configured ({eval_set}) but no nDCG@10 scorer is "
                        "available (rag_lib.eval); pass --skip-quality to switch without it")
        active = self.store.active_space()
        if active is None:
            return Gate("quality", True, "no active space to compare with")
        active_provider = self.active_provider or provider_for_space(self.settings, active["space"])
        new_score = scorer(self.store, self.target, info, eval_set)
        old_score = scorer(self.store, active_provider, active, eval_set)
        return Gate("quality", new_score >= old_score - tolerance,
                    f"nDCG@10 {new_score:.4f} in {self.space} vs {old_score:.4f} in {active['space']} "
                    f"(tolerance {tolerance})")

    def run(self, switch: bool = True, skip_quality: bool = False) -> ReembedReport:
        """Fill, check, index and (when `switch`) make the space active; idempotent and resumable.
        `ReembedRunningError` when another process is re-embedding into the same space."""
        with self.store.reembed_lock(self.space) as mine:
            if not mine:  # it would pay the provider for the same chunks and race it to the index and switch
                raise ReembedRunningError(
                    f"a re-embed to {self.space} is already running in another process; wait for it to finish "
                    f"(`rag reembed --status` shows its coverage), then run `rag reembed --to {self.space}` "
                    "again if it did not switch")
            return self._run(switch, skip_quality)

    def _run(self, switch: bool, skip_quality: bool) -> ReembedReport:
        started = time.perf_counter()
        active = self.store.active_space()
        report = ReembedReport(self.space, active["space"] if active else None, self.run_id)
        before = self.start()
        try:
            return self._fill_check_switch(report, switch, skip_quality, started)
        finally:
            # a retired space (what a rollback returns to) that was not switched to stays retired: left
            # "building", it was no longer a rollback target and `--abort` would have dropped its vectors
            if before == "retired" and not report.switched:
                self.store.retire_again(self.space)

    def _fill_check_switch(self, report: ReembedReport, switch: bool, skip_quality: bool,
                           started: float) -> ReembedReport:
        try:
            self.fill(report)
        except Exception:
            # failed before one vector was stored (a wrong setting, a provider down): nothing to
            # resume, and a space left "building" would refuse every other re-embed until --abort
            if not self.store.get_space(self.space)["vectors"]:
                self.store.drop_space(self.space)
            raise
        self.build_profiles()
        if not switch:
            report.gates = self.gates(quality=not skip_quality)
            report.seconds = time.perf_counter() - started
            return report
        report.index = self.store.ensure_hnsw_index(self.space, self.target.dimensions)  # before the switch
        for attempt in range(SWITCH_ATTEMPTS):
            self.fill(report)  # catch up documents published meanwhile
            self.build_profiles()
            gates = self.gates(quality=not skip_quality)
            report.gates = gates
            failed = [g for g in gates if not g.passed]
            if any(g.name != "coverage" for g in failed):
                break
            if failed:
                continue
            try:
                self.store.switch_active(self.space)
            except ValidationError:  # a document changed after the last check: fill again
                if attempt == SWITCH_ATTEMPTS - 1:
                    raise
                continue
            report.switched = True
            report.carried = carry_over(self.settings, self.store, report.previous, self.space)
            break
        report.seconds = time.perf_counter() - started
        return report


def reembed(settings: Settings, store: Store, spec: str, *, switch: bool = True, skip_quality: bool = False,
            target: EmbeddingProvider | None = None, scorer: QualityScorer | None = None,
            progress: ProgressFn | None = None) -> ReembedReport:
    """`rag reembed --to MODEL[:DIMS]`: the provider comes from `embedding.providers` (or a known OpenAI model)."""
    target = target or provider_for_space(settings, spec)
    return Reembedder(settings, store, target, scorer, progress).run(switch, skip_quality)


def status(store: Store) -> dict[str, Any]:
    """Every space with status, coverage and index; which one a rollback would return to."""
    spaces = store.list_spaces()
    return {
        "active": next((s["space"] for s in spaces if s["status"] == "active"), None),
        "building": next((s["space"] for s in spaces if s["status"] == "building"), None),
        "rollback_to": store.previous_space(),
        "spaces": spaces,
    }


def rollback(settings: Settings, store: Store, target: EmbeddingProvider | None = None,
             progress: ProgressFn | None = None) -> ReembedReport:
    """Switch back to the most recently retired space, catching up chunks that changed since
    (from the cache, or its provider), with its HNSW index in place first."""
    started = time.perf_counter()
    previous = store.previous_space()
    if previous is None:
        raise NotFoundError("no retired embedding space to roll back to; see `rag reembed --status`")
    info = store.get_space(previous)
    if target is None:
        target = _RollbackTarget(settings, previous, info) if info["vectors"] < info["chunks"] else _Stub(info)
    worker = Reembedder(settings, store, target, progress=progress)
    active = store.active_space()
    report = ReembedReport(previous, active["space"] if active else None, worker.run_id)
    for _ in range(SWITCH_ATTEMPTS):
        worker.fill(report)
        report.index = store.ensure_hnsw_index(previous, info["dimensions"])
        report.gates = worker.gates(quality=False)
        try:
            store.switch_active(previous)
        except ValidationError:
            continue
        report.switched = True
        report.carried = carry_over(settings, store, report.previous, previous)
        break
    report.seconds = time.perf_counter() - started  # `rag reembed --rollback` said "in 0.0s" however long it took
    return report


def carry_over(settings: Settings, store: Store, old: str | None, new: str) -> dict[str, Any]:
    """After a switch from space `old` to `new`: when both spaces' providers cut the same chunks, the
    documents and stage outputs made in `old` under `settings` are marked as made in `new` under
    the same settings naming `new` (`Store.carry_over` says where that holds), so an ingest with
    settings naming `new` finds them current: no republish, and `old` keeps its vectors for a
    rollback. Returns the counts, or `skipped`: why nothing was carried over (then that ingest
    re-chunks and republishes every document, as after any other change of model)."""
    spaces = {s["space"]: s for s in store.list_spaces()}
    if old is None or old not in spaces:
        return {"skipped": "no space was active before"}
    before, after = spaces[old]["chunker"], spaces[new]["chunker"]
    if not before or not after:
        return {"skipped": f"the chunker of {old if not before else new} is not known"}
    if before != after:
        return {"skipped": f"{new}'s tokenizer cuts other chunks than {old}'s"}
    (fa, va), (fb, vb) = (_labels(settings, spaces[old]), _labels(settings, spaces[new]))
    try:
        return store.carry_over(old, new, (fa, fb), {stage: (va[stage], vb[stage]) for stage in va})
    except psycopg.Error as exc:  # the switch stands; only the next ingest's work grows
        log.warning("documents not carried over from %s to %s", old, new, exc_info=True)
        return {"skipped": f"carrying the documents over failed ({error_text(exc)})"}


def _labels(settings: Settings, space: dict[str, Any]) -> tuple[str, dict[str, str]]:
    """(fingerprint, stage versions) of `settings` with `space`'s embedding model, dimensions and
    chunker (its provider's, which the settings naming it configure)."""
    versions = stage_versions(settings.with_embedding(model=space["model"], dimensions=space["dimensions"]),
                              CHUNKER_VERSION, space["chunker"], model=space["model"])
    return fingerprint(versions), versions


def drop_old(store: Store) -> dict[str, int]:
    """Delete every retired space's vectors and index (the cache stays, so a later re-embed is free)."""
    return {s["space"]: store.drop_space(s["space"]) for s in store.list_spaces() if s["status"] == "retired"}


def abort(store: Store) -> str | None:
    """Drop a half-built space (its vectors; the cache keeps what was paid for). Returns its name."""
    building = status(store)["building"]
    if building:
        store.drop_space(building)
    return building


class _Stub(EmbeddingProvider):
    """A provider stand-in for a space that needs no new vectors (fill finds nothing to embed)."""

    def __init__(self, info: dict[str, Any]):
        self.name, self.model, self.dimensions = info["provider"], info["model"], info["dimensions"]

    def tokenizer(self):  # pragma: no cover - never called when nothing is missing
        raise EmbeddingError("no provider configured for this space")

    def embed(self, texts: list[str]) -> np.ndarray:
        raise EmbeddingError(
            f"{len(texts)} chunk texts changed since {self.model}:{self.dimensions} was retired and are not in the "
            "cache; add its provider to embedding.providers to roll back"
        )


class _RollbackTarget(_Stub):
    """The previous space's provider, built only if the cache cannot cover the changed chunks."""

    def __init__(self, settings: Settings, space: str, info: dict[str, Any]):
        super().__init__(info)
        self._settings, self._space, self._real = settings, space, None

    def embed_counted(self, texts: list[str]):
        if self._real is None:
            self._real = provider_for_space(self._settings, self._space)
        return self._real.embed_counted(texts)
