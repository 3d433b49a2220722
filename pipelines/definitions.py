"""The code location: `dagster dev -w workspace.yaml` (or `rag dev`) loads `defs`."""

from dagster import Definitions, in_process_executor

from pipelines.assets import ASSETS
from pipelines.checks import CHECKS
from pipelines.graph_assets import GRAPH_ASSETS
from pipelines.graph_checks import GRAPH_CHECKS
from pipelines.instance import tune_event_writes
from pipelines.jobs import index_maintenance_job, ingest_job, reembed_job
from pipelines.resources import RagResource
from pipelines.schedules import index_maintenance_schedule, nightly_reconcile, reembed_schedule
from pipelines.sensors import corpus_sensor, record_run_failures

tune_event_writes()  # the code server's run workers inherit the setting

defs = Definitions(
    assets=ASSETS + GRAPH_ASSETS,
    asset_checks=CHECKS + GRAPH_CHECKS,
    jobs=[ingest_job, reembed_job, index_maintenance_job],
    sensors=[corpus_sensor, record_run_failures],
    schedules=[nightly_reconcile, reembed_schedule, index_maintenance_schedule],
    resources={"rag": RagResource()},
    # Every job runs in one process, the UI's "Materialize" (the implicit asset job) included:
    # Dagster's default starts a process per step (2-8 s each; one file took 80 s, not 10).
    executor=in_process_executor,
)
