"""The resource that carries settings, the database and the stage runner to assets and checks."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from dagster import AssetCheckKey, AssetKey, ConfigurableResource, InitResourceContext
from pydantic import PrivateAttr

from pipelines.gc_policy import freeze_if_one_shot
from pipelines.partitions import PartitionMap
from rag_lib.ingest.state import StageRunner
from rag_lib.api import KnowledgeBase
from rag_lib.config import Settings
from rag_lib.embedding import EmbeddingProvider, get_provider
from rag_lib.graph.extract import forget_corpus_indexes
from rag_lib.log import get_logger
from rag_lib.quality import preload_great_expectations
from rag_lib.shutdown import skip_final_collections

log = get_logger(__name__)

T = TypeVar("T")

class StagesStopped(Exception):
    """The run ended before its stages did (a step failed, or the run was stopped)."""


class StagesAhead:
    """A run's per-file stages running on a thread of the run (pipelines.assets.pipelined_stages),
    and what each stage step waits for: its stage's outcome for every file of the run, not the
    end of the others, so the steps of the stages done first write their files' events while the
    encoder works on (seconds of one core after the stages otherwise; docs/scale.md, issue 32
    item 2)."""

    def __init__(self, stages: list[str], keys: list[str], found: dict[str, dict[str, Any]]):
        self.stages = set(stages)
        self.keys = keys
        self.found = found  # stage → partition key → outcome, filled by the stages' threads
        self.stop = threading.Event()  # set when the run ends early: no stage starts on a later round
        self._changed = threading.Condition()
        self._ended = False
        self._error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def progressed(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def ended(self, error: BaseException | None) -> None:
        with self._changed:
            self._ended, self._error = True, error
            self._changed.notify_all()

    def complete(self, stage: str) -> bool:
        return stage in self.stages and all(k in self.found.get(stage, {}) for k in self.keys)

    def wait_for(self, stage: str) -> None:
        """Until `stage` has every file's outcome, or (a stage not run ahead) the stages ended; an
        error that stopped the stages is raised when the stage was left incomplete."""
        with self._changed:
            self._changed.wait_for(lambda: self._ended or self.complete(stage))
            if not self.complete(stage) and self._error is not None:
                raise self._error

    def wait_ended(self) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self._ended)

    def error(self) -> BaseException | None:
        return self._error


# Loading a model costs seconds: one provider per embedding configuration per process.
_PROVIDERS: dict[str, EmbeddingProvider] = {}


def _provider_key(settings: Settings) -> str:
    return settings.embedding.model_dump_json()


def preload_provider(settings: Settings, provider: EmbeddingProvider) -> None:
    """Use an already loaded provider for this embedding configuration (tests, benchmarks)."""
    _PROVIDERS[_provider_key(settings)] = provider


def provider_for(settings: Settings) -> EmbeddingProvider:
    key = _provider_key(settings)
    if key not in _PROVIDERS:
        _PROVIDERS[key] = get_provider(settings)
    return _PROVIDERS[key]


def stage_runner(kb: KnowledgeBase, force: bool = False) -> StageRunner:
    """The library's per-file stage runner over this knowledge base's store and ingest engine."""
    return StageRunner(kb.settings, kb.store, lambda: kb.engine, force=force, recording=kb.recording_metrics)


class RagResource(ConfigurableResource):
    """Settings come from `rag.yaml`/`RAG_*` (as for the CLI); fields here override them per run.
    Corpus roots are not config: they come from the registry (`rag roots`)."""

    config_file: str | None = None  # a rag.yaml other than $RAG_CONFIG / ./rag.yaml
    database_url: str | None = None  # overrides RAG_DATABASE_URL
    home: str | None = None  # overrides RAG_HOME (embedded server location)
    force: bool = False  # redo stages even for files that are already current
    embed_version: str | None = None  # re-embed under a new embed_version

    _kb: KnowledgeBase | None = PrivateAttr(default=None)
    _preparing: threading.Thread | None = PrivateAttr(default=None)
    _runner: StageRunner | None = PrivateAttr(default=None)
    _ahead: dict[str, dict[str, Any]] = PrivateAttr(default_factory=dict)
    _after: dict[str, Future] = PrivateAttr(default_factory=dict)
    _after_lanes: dict[str, ThreadPoolExecutor] = PrivateAttr(default_factory=dict)
    _stages_ahead: StagesAhead | None = PrivateAttr(default=None)

    def settings(self) -> Settings:
        if self.config_file:
            os.environ["RAG_CONFIG"] = self.config_file
        overrides: dict[str, Any] = {}
        if self.database_url:
            overrides["database_url"] = self.database_url
        if self.home:
            overrides["home"] = Path(self.home)
        settings = Settings(**overrides)
        if self.embed_version:
            settings.embedding.embed_version = self.embed_version
        return settings

    def kb(self) -> KnowledgeBase:
        if self._kb is None:
            settings = self.settings()
            self._kb = KnowledgeBase(settings, provider=provider_for(settings))
        return self._kb

    def partition_map(self) -> PartitionMap:
        """Partition keys ↔ files for the registered corpus roots (the registry, merged with
        rag.yaml's pipeline.roots): read per run/tick, so UI-launched runs need no run config."""
        return PartitionMap(self.kb().roots())

    def runner(self) -> StageRunner:
        """The run's stage runner: one per run, so a file parsed by raw_documents is not parsed again
        by flattened_sections, and an output stored by one step is not read back by the next."""
        if self._runner is None:
            self._runner = stage_runner(self.kb(), self.force)
        return self._runner

    @property
    def ahead(self) -> dict[str, dict[str, Any]]:
        """stage → partition key → outcome: what this run's first stage step did for the later
        stages' steps (pipelines.assets.pipelined_stages)."""
        return self._ahead

    @property
    def stages_ahead(self) -> StagesAhead | None:
        """The run's stages running ahead on a thread of the run, once its first stage step started
        them (pipelines.assets.pipelined_stages)."""
        return self._stages_ahead

    def run_stages_ahead(self, ahead: StagesAhead, work: Callable[[], None]) -> None:
        """Run the stages (`work`) on a thread of the run; `ahead` says how far they are."""
        def run() -> None:
            error: BaseException | None = None
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - raised in the steps that wait for it
                error = exc
            finally:
                ahead.ended(error)

        self._stages_ahead = ahead
        ahead.thread = threading.Thread(target=run, name="rag-stages", daemon=True)
        ahead.thread.start()

    def start_after(self, name: str, work: Callable[[], Any], lane: str) -> None:
        """Start `work` now on the run's thread for `lane` (a lane's work runs in the order given),
        for the step that needs its result to take it (`after`): the index build and the checks'
        queries run in Postgres and the validation process while this thread writes the earlier
        steps' events (pipelines.assets.after_stages)."""
        pool = self._after_lanes.get(lane)
        if pool is None:
            pool = self._after_lanes[lane] = ThreadPoolExecutor(1, thread_name_prefix=f"rag-after-{lane}")
        self._after[name] = pool.submit(work)

    def after(self, name: str, work: Callable[[], T]) -> T:
        """The result of `name` started ahead (its exception raised here), else `work()` now. While
        the stages run ahead, their end is waited for: a check or a step after the stages looks at
        their final data."""
        if self._stages_ahead is not None:
            self._stages_ahead.wait_ended()
        future = self._after.pop(name, None)
        return future.result() if future is not None else work()

    def setup_for_execution(self, context: InitResourceContext) -> None:
        from pipelines.instance import tune_event_writes

        if context.instance is not None:  # the run worker's instance: pooled connections
            tune_event_writes(context.instance)
        if context.run is None:  # a sensor tick or schedule: no stages, no checks
            return
        skip_final_collections()  # a run worker's exit is part of the run's wall time
        freeze_if_one_shot()  # what is alive as the run starts: out of its collections
        # A run may share its process with earlier runs (`rag materialize` runs it in its own):
        # it scans the roots for tickers and link targets afresh, as a run worker's first run does.
        forget_corpus_indexes()
        # Importing Great Expectations takes seconds of one core: a process does it beside the first
        # stages, whose Python work (and the model load's, on a thread) holds this process to one
        # core; started later it would slow the embedding, which uses both (chunk_sizes runs last).
        # A run whose first step encodes beside chunking (pipelines.assets.pipelined_stages) starts
        # it at idle priority when it encodes new chunks (below), else after that step (a frame
        # not validated before), beside the index, graph and other checks' steps.
        if _selects(context.run, "chunks") and not _chunks_beside_encoding(context.run):
            preload_great_expectations()
        elif (_chunks_beside_encoding(context.run) and self._embeds_uncached(context.run)
              and _selects_check(context.run, "chunks", "chunk_sizes")):
            # A run that encodes new chunks validates them: the process starts now at idle
            # priority, importing on the CPU the encoding leaves, and is put back to normal priority
            # for the validation (rag_lib.quality). Started after the stages, the check waited
            # for its import (1.9-3.5 s of a cold run of the shared corpus at load 2-6).
            preload_great_expectations(idle=True)
        # The model takes seconds to load: a run that will embed loads it on a thread while its
        # first stages run. A forced re-run mostly finds its vectors cached: it loads on demand.
        if self._embeds_uncached(context.run) and not _selects(context.run, "raw_documents"):
            self.prepare_embedding_in_background()  # a re-embed: it certainly embeds
        # else raw_documents decides: only files with new content need the model

    def prepare_after_raw_documents(self, run, new_content: bool) -> None:
        """Files with new content will need the model: load it while the next stages run."""
        if new_content and self._embeds_uncached(run):
            self.prepare_embedding_in_background()

    def _embeds_uncached(self, run) -> bool:
        """The run embeds, and not as a forced re-run (whose vectors are mostly cached)."""
        return not self.force and _selects(run, "embeddings")

    def prepare_embedding_in_background(self) -> None:
        """Load the embedding model on a thread (once per run)."""
        if self._preparing is None:
            self._preparing = threading.Thread(target=_prepare, args=(self.kb(),), name="rag-prepare", daemon=True)
            self._preparing.start()

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        if self._preparing is not None:  # never close the knowledge base under a loading model
            self._preparing.join()
            self._preparing = None
        ahead, self._stages_ahead = self._stages_ahead, None
        if ahead is not None and ahead.thread is not None:  # a run that ended before its stages did
            ahead.stop.set()  # the rounds being worked on finish, no later one starts
            ahead.thread.join()
            if ahead.error() is not None and not isinstance(ahead.error(), StagesStopped):
                log.warning("the run's stages, running ahead of its steps, failed", exc_info=ahead.error())
        for pool in self._after_lanes.values():  # a failed run's unused work: what runs ends, the rest never starts
            pool.shutdown(wait=True, cancel_futures=True)
        for name, future in self._after.items():  # started ahead for a step that did not run
            if not future.cancelled() and future.exception() is not None:
                log.warning("%s, started ahead for a step the run did not reach, failed", name,
                            exc_info=future.exception())
        self._after_lanes, self._after = {}, {}
        self._runner = None
        self._ahead = {}
        if self._kb is not None:
            self._kb.close()
            self._kb = None


def _prepare(kb: KnowledgeBase) -> None:
    try:
        kb.provider.prepare()  # load the model now
    except Exception:  # noqa: BLE001 - the embeddings stage loads it again and records the failure per file
        log.warning("loading the embedding model ahead of the embeddings stage failed", exc_info=True)


# The k8s variants run each step in its own pod (pipelines/k8s.py): no step can do another's work there.
STEP_PER_POD_TAG = ("rag/executor", "k8s")


def steps_share_process(run) -> bool:
    """Whether the run's steps run in one process, where a stage step can do later stages' work
    ahead (pipelines.assets.pipelined_stages); not in the k8s variants."""
    return run.tags.get(STEP_PER_POD_TAG[0]) != STEP_PER_POD_TAG[1]


def _chunks_beside_encoding(run) -> bool:
    """The run's chunks and embeddings stages run together in one step (pipelines.assets)."""
    return steps_share_process(run) and _selects(run, "chunks") and _selects(run, "embeddings")


def _selects_check(run, asset: str, check: str) -> bool:
    """True when the run executes the check `check` on `asset`: its check selection (UI launches),
    else its steps, else whether it materializes the asset (a job's checks come with its assets)."""
    if run.asset_check_selection is not None:
        return AssetCheckKey(AssetKey(asset), check) in run.asset_check_selection
    if run.step_keys_to_execute is not None:
        return f"{asset}_{check}" in run.step_keys_to_execute
    return _selects(run, asset)


def _selects(run, asset: str) -> bool:
    """True when the run materializes `asset`: its asset selection (UI launches), else its steps,
    else its job's selection (runs of a whole job from sensors and schedules)."""
    if run.asset_selection:  # empty for runs of a whole job
        return AssetKey(asset) in run.asset_selection
    if run.step_keys_to_execute is not None:
        return asset in run.step_keys_to_execute
    from pipelines.assets import ASSETS  # both import this module
    from pipelines.jobs import ingest_job, reembed_job

    job = {j.name: j for j in (ingest_job, reembed_job)}.get(run.job_name)
    return job is not None and AssetKey(asset) in job.selection.resolve(ASSETS)
