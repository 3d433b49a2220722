"""Step-per-pod execution on Kubernetes (optional). The code location of `pipelines.definitions`
plus two job variants, `ingest_files_k8s` and `reembed_k8s`, run by dagster-k8s's `k8s_job_executor`:
every stage of a run is its own Kubernetes Job, so only the encoding step gets the model's CPU and
memory and a crash stays in one stage. Stages keep their outputs in PostgreSQL, so nothing but the
database passes between pods.

Serve `-m pipelines.k8s -a defs` instead of `-m pipelines.definitions -a defs` (Helm values:
dagsterApiGrpcArgs). Needs dagster-k8s (`pip install 'rag-kb[k8s]'`, in the image already); nothing
else in `pipelines/` imports this module, so the base install does not."""

from __future__ import annotations

from typing import Any

from dagster import Definitions, ExecutorDefinition, define_asset_job

from rag_lib.errors import ConfigError

from pipelines.definitions import defs as base_defs
from pipelines.jobs import INGEST_JOB, REEMBED_JOB, ingest_job, reembed_job
from pipelines.resources import STEP_PER_POD_TAG

SUFFIX = "_k8s"
# Run tag of the variants: the run queue's tag limit `rag/executor: k8s` (deploy/helm/values.yaml)
# (the stage steps see it: none does a later stage's work ahead, as they do sharing one process)
EXECUTOR_TAG = dict([STEP_PER_POD_TAG])
# The asset whose step loads the model and encodes (pipelines/assets.py); every other step only
# parses, chunks and talks to the database.
ENCODER_STEP = "embeddings"
# Sized as the run pods in deploy/helm/values.yaml (docs/deploy.md, "Resource requests").
ENCODER_RESOURCES: dict[str, Any] = {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "3Gi"}}
STAGE_RESOURCES: dict[str, Any] = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}


def step_executor(max_concurrent: int = 2) -> ExecutorDefinition:
    """dagster-k8s's `k8s_job_executor`, configured: small pods for stages, a large one for encoding."""
    try:
        from dagster_k8s import k8s_job_executor
    except ImportError as exc:  # the base install has no dagster-k8s
        raise ConfigError("pipelines.k8s needs dagster-k8s: install the `k8s` extra "
                          "(pip install 'rag-kb[k8s]') or serve pipelines.definitions") from exc
    return k8s_job_executor.configured(
        {
            "max_concurrent": max_concurrent,
            "step_k8s_config": {"container_config": {"resources": STAGE_RESOURCES}},
            "per_step_k8s_config": {ENCODER_STEP: {"container_config": {"resources": ENCODER_RESOURCES}}},
        },
        name="k8s_step_per_pod",
    )


def step_per_pod_jobs(executor: ExecutorDefinition | None = None) -> list:
    """The ingest and re-embed jobs' asset selections again, one pod per step."""
    executor = executor or step_executor()
    return [
        define_asset_job(f"{name}{SUFFIX}", selection=job.selection, executor_def=executor, tags=EXECUTOR_TAG,
                         description=f"{job.description} One Kubernetes pod per step.")
        for name, job in ((INGEST_JOB, ingest_job), (REEMBED_JOB, reembed_job))
    ]


defs = Definitions.merge(base_defs, Definitions(jobs=step_per_pod_jobs()))
