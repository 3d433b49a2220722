"""Run the ingest through Dagster: register every file as a partition, then materialize all six
assets (checks included) for all partitions in as few runs as possible (normally one)."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from rag_lib.errors import RagError
from rag_lib.watch import CorpusRoot, PartitionMap

from pipelines.partitions import CORPUS_FILES, plan_ranges, range_tags


@dataclass
class CheckSummary:
    name: str
    asset: str
    passed: bool
    severity: str
    description: str


@dataclass
class PipelineRunSummary:
    run_ids: list[str] = field(default_factory=list)
    success: bool = True
    partitions: int = 0
    removed: list[str] = field(default_factory=list)
    stages: dict[str, dict[str, int]] = field(default_factory=dict)  # asset → status → partitions
    checks: list[CheckSummary] = field(default_factory=list)
    failed_partitions: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_ids": self.run_ids, "success": self.success, "partitions": self.partitions,
            "removed": self.removed, "stages": self.stages,
            "checks": [c.__dict__ for c in self.checks], "failed_partitions": self.failed_partitions,
            "seconds": round(self.seconds, 3),
        }


def register_partitions(instance, pmap: PartitionMap, runner=None) -> tuple[list[str], list[str], list[str]]:
    """Add partitions for the files under the roots and drop those whose files are gone (their rows
    deleted first). Returns (keys on disk, partition order, removed keys)."""
    keys = list(pmap.walk())
    existing = instance.get_dynamic_partitions(CORPUS_FILES)
    known = set(existing)
    new = [k for k in keys if k not in known]
    if new:
        instance.add_dynamic_partitions(CORPUS_FILES, new)
    on_disk = set(keys)
    removed = []
    for key in existing:
        if key in on_disk:
            continue
        try:
            target = pmap.target(key)
        except RagError:
            continue  # another root's partition: not ours to judge
        if not target.path.exists():
            if runner is not None:
                runner.forget(target)
            instance.delete_dynamic_partition(CORPUS_FILES, key)
            removed.append(key)
    return keys, instance.get_dynamic_partitions(CORPUS_FILES), removed


def materialize_corpus(
    instance,
    roots: list[CorpusRoot],
    *,
    database_url: str | None = None,
    home: str | None = None,
    force: bool = False,
    job_name: str = "ingest_files",
    embed_version: str | None = None,
    log_level: str = "WARNING",
) -> PipelineRunSummary:
    """Materialize every file under `roots` through the job (in this process, recorded on `instance`)."""
    from pipelines.definitions import defs
    from pipelines.resources import RagResource

    started = time.perf_counter()
    specs = [f"{r.collection}={r.path}" for r in roots]
    rag = RagResource(roots=specs, database_url=database_url, home=home, force=force, embed_version=embed_version)
    pmap = rag.partition_map()
    summary = PipelineRunSummary()
    try:
        keys, ordered, summary.removed = register_partitions(instance, pmap, rag.runner())
    finally:
        rag.teardown_after_execution(None)  # type: ignore[arg-type]
    summary.partitions = len(keys)
    config = {k: v for k, v in {"roots": specs, "database_url": database_url, "home": home, "force": force,
                                 "embed_version": embed_version}.items() if v not in (None, False, [])}
    job = defs.resolve_job_def(job_name)
    stages: dict[str, Counter] = defaultdict(Counter)
    for start, end in plan_ranges(keys, ordered):
        result = job.execute_in_process(
            instance=instance, run_config={"resources": {"rag": {"config": config}},
                                             "loggers": {"console": {"config": {"log_level": log_level}}}},
            tags={**range_tags(start, end), "rag/trigger": "rag materialize"}, raise_on_error=False,
        )
        summary.run_ids.append(result.run_id)
        summary.success = summary.success and result.success
        for event in result.get_asset_materialization_events():
            mat = event.step_materialization_data.materialization
            status = mat.metadata.get("status")
            stages[mat.asset_key.to_user_string()][status.value if status is not None else "ok"] += 1
            if status is not None and status.value == "failed" and event.partition not in summary.failed_partitions:
                summary.failed_partitions.append(event.partition)
        for ev in result.get_asset_check_evaluations():
            summary.checks.append(CheckSummary(
                ev.check_name, ev.asset_key.to_user_string(), ev.passed, ev.severity.value,
                ev.description or str(ev.metadata.get("summary").value if ev.metadata.get("summary") else "")))
    summary.stages = {k: dict(v) for k, v in stages.items()}
    summary.seconds = time.perf_counter() - started
    return summary
