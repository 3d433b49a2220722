"""Deployment on Kubernetes (deploy/): the user-code image, the official Dagster chart's values, the
step-per-pod variant. No cluster runs here, so what can be checked for real is: the Kubernetes Job
that dagster-k8s's own K8sRunLauncher submits for our ingest job (sent over HTTP to a stand-in API
server on 127.0.0.1, then read back into the `kubernetes` client's V1Job), the run queue's tag
limits against the tags our runs carry, the values against the chart's published schema (when a
copy of the chart is provided), and the Dockerfile's entry point against the code."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
VALUES = DEPLOY / "helm" / "values.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
RAG_ENV = DEPLOY / "rag.env"
CHART_VERSION = "1.13.27"  # = our dagster pin; the chart is versioned with Dagster
RELEASE, NAMESPACE = "rag", "rag"
# A copy of the chart folder (the dagster repository's helm/dagster at tag CHART_VERSION, holding
# values.yaml, values.schema.json and charts/dagster-user-deployments/): only the steering team may
# place fetched files under shared/, so the schema test runs where such a copy exists.
CHART_DIRS = [Path(p) for p in filter(None, [os.environ.get("DAGSTER_HELM_SCHEMA_DIR")])] + [
    REPO.parent / "shared" / "helm" / f"dagster-{CHART_VERSION}",
    Path("/work/shared/helm") / f"dagster-{CHART_VERSION}",
]


def load_values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


def user_deployment(values: dict[str, Any]) -> dict[str, Any]:
    (deployment,) = values["dagster-user-deployments"]["deployments"]
    return deployment


def image_name(image: dict[str, Any]) -> str:
    return f"{image['repository']}:{image['tag']}"


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as `kubectl create configmap --from-env-file` reads them (values literal)."""
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value
    return pairs


# ---- what the chart renders into the Dagster instance (helm/dagster/templates/helpers/instance) --

def chart_fullname(release: str = RELEASE) -> str:
    return release if "dagster" in release else f"{release}-dagster"


def instance_run_launcher(values: dict[str, Any], release: str = RELEASE) -> dict[str, Any]:
    """The `run_launcher` block of the chart's instance ConfigMap for a K8sRunLauncher."""
    cfg = values["runLauncher"]["config"]["k8sRunLauncher"]
    out: dict[str, Any] = {
        "load_incluster_config": cfg["loadInclusterConfig"],
        "job_namespace": cfg.get("jobNamespace") or NAMESPACE,
        "image_pull_policy": cfg["imagePullPolicy"],
        "service_account_name": chart_fullname(release),
        "dagster_home": "/opt/dagster/dagster_home",
        "instance_config_map": f"{chart_fullname(release)}-instance",
        "postgres_password_secret": values["global"]["postgresqlSecretName"],
    }
    for key, name in (("envConfigMaps", "env_config_maps"), ("envSecrets", "env_secrets")):
        if cfg.get(key):
            out[name] = [ref["name"] for ref in cfg[key] if "name" in ref]
    for key, name in (("envVars", "env_vars"), ("volumeMounts", "volume_mounts"), ("volumes", "volumes"),
                      ("labels", "labels"), ("resources", "resources"), ("securityContext", "security_context")):
        if cfg.get(key):
            out[name] = cfg[key]
    if cfg.get("failPodOnRunFailure"):
        out["fail_pod_on_run_failure"] = True
    if cfg.get("runK8sConfig"):
        keys = {"containerConfig": "container_config", "podSpecConfig": "pod_spec_config",
                "podTemplateSpecMetadata": "pod_template_spec_metadata", "jobSpecConfig": "job_spec_config",
                "jobMetadata": "job_metadata"}
        out["run_k8s_config"] = {keys[k]: v for k, v in cfg["runK8sConfig"].items() if v}
    return {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": out}


def instance_run_coordinator(values: dict[str, Any]) -> dict[str, Any]:
    """The `run_coordinator` block of the chart's instance ConfigMap for the QueuedRunCoordinator."""
    cfg = values["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]
    config: dict[str, Any] = {"max_concurrent_runs": cfg.get("maxConcurrentRuns", -1)}
    if cfg.get("tagConcurrencyLimits"):
        config["tag_concurrency_limits"] = cfg["tagConcurrencyLimits"]
    return {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator", "config": config}


def instance_storage(values: dict[str, Any]) -> dict[str, Any]:
    """The `postgres_db` block the chart gives run, event-log and schedule storage."""
    pg = values["postgresql"]
    block = {"username": pg["postgresqlUsername"], "password": {"env": "DAGSTER_PG_PASSWORD"},
             "hostname": pg["postgresqlHost"], "db_name": pg["postgresqlDatabase"],
             "port": pg.get("service", {}).get("port", 5432), "params": pg.get("postgresqlParams", {})}
    if pg.get("postgresqlScheme"):
        block["scheme"] = pg["postgresqlScheme"]
    return block


# ---- a stand-in for the Kubernetes API server: records what the launcher submits -----------------

class _KubeApi(BaseHTTPRequestHandler):
    submitted: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).submitted.append((self.path, body))
        answer = json.dumps({**body, "status": {}}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def kube_api(tmp_path: Path):
    """(kubeconfig file, submitted requests) of a local HTTP server answering Job creation."""
    _KubeApi.submitted = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _KubeApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "test", "user": {"token": "test"}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": NAMESPACE}}],
    }))
    try:
        yield kubeconfig, _KubeApi.submitted
    finally:
        server.shutdown()
        server.server_close()


def grpc_args(values: dict[str, Any]) -> dict[str, str]:
    """-m/-a/-d of the user deployment's dagsterApiGrpcArgs."""
    args = user_deployment(values)["dagsterApiGrpcArgs"]
    return dict(zip(args[::2], args[1::2]))


@pytest.mark.slow  # a Dagster instance and dagster_k8s's launcher (30 s on a busy machine)
def test_run_pod_job_is_what_dagster_k8s_submits_for_our_ingest_job(kube_api):
    """The K8sRunLauncher configured as the chart configures it from our values launches a run of
    `ingest_files`; the Job it POSTs reads back into the kubernetes client's V1Job unchanged and
    carries our image, `dagster api execute_run`, env from our Secret/ConfigMap, the Dagster storage
    password, resource requests, the corpus volume and the non-root security context."""
    from dagster._core.code_pointer import ModuleCodePointer
    from dagster._core.launcher import LaunchRunContext
    from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
    from dagster._core.test_utils import create_run_for_test, instance_for_test
    from dagster._grpc.types import ExecuteRunArgs
    from dagster._serdes import deserialize_value
    from dagster_k8s import K8sRunLauncher
    from kubernetes.client import ApiClient, V1Job

    from pipelines.jobs import INGEST_JOB

    kubeconfig, submitted = kube_api
    values = load_values()
    launcher = instance_run_launcher(values)
    assert launcher["config"]["load_incluster_config"] is True  # in the cluster: its service account
    launcher["config"].update(load_incluster_config=False, kubeconfig_file=str(kubeconfig))
    deployment = user_deployment(values)
    image = image_name(deployment["image"])
    grpc = grpc_args(values)
    # What the code server reports for its jobs: the module it serves, inside the image it runs.
    python = "/usr/local/bin/python"  # the interpreter of the python:3.11-slim base image
    repo_origin = RepositoryPythonOrigin(
        executable_path=python,
        code_pointer=ModuleCodePointer(grpc["-m"], grpc["-a"], working_directory=grpc["-d"]),
        container_image=image,
        entry_point=[python, "-m", "dagster"],  # what `dagster api grpc` reports for itself
    )
    tags = {"rag/trigger": "corpus_sensor", "dagster/asset_partition_range_start": "default/a.yaml",
            "dagster/asset_partition_range_end": "default/z.yaml"}
    with instance_for_test(overrides={"run_launcher": launcher}) as instance:
        assert isinstance(instance.run_launcher, K8sRunLauncher)
        run = create_run_for_test(instance, job_name=INGEST_JOB, tags=tags,
                                  job_code_origin=JobPythonOrigin(INGEST_JOB, repo_origin))
        instance.run_launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
        assert instance.get_run_by_id(run.run_id).tags["dagster/image"] == image

    ((path, body),) = submitted
    assert path == f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
    job: V1Job = ApiClient()._ApiClient__deserialize(body, "V1Job")
    assert isinstance(job, V1Job)
    # nothing the launcher sent is unknown to the Kubernetes models (unknown keys would be dropped)
    assert ApiClient().sanitize_for_serialization(job) == body
    assert (job.api_version, job.kind) == ("batch/v1", "Job")
    assert job.metadata.name == f"dagster-run-{run.run_id}"
    assert job.spec.backoff_limit == 0 and job.spec.ttl_seconds_after_finished == 86400

    pod = job.spec.template.spec
    (container,) = pod.containers
    assert container.image == image
    assert container.args[:5] == [python, "-m", "dagster", "api", "execute_run"]
    execute = deserialize_value(container.args[5], ExecuteRunArgs)
    assert execute.run_id == run.run_id and execute.job_origin.job_name == INGEST_JOB
    assert execute.job_origin.repository_origin.code_pointer.module == "pipelines.definitions"
    assert execute.set_exit_code_on_failure is True  # failPodOnRunFailure

    env = {e.name: e for e in container.env}
    assert env["DAGSTER_HOME"].value == "/opt/dagster/dagster_home"
    assert env["DAGSTER_RUN_JOB_NAME"].value == INGEST_JOB
    password = env["DAGSTER_PG_PASSWORD"].value_from.secret_key_ref
    assert (password.name, password.key) == ("dagster-postgresql-secret", "postgresql-password")
    sources = {(s.config_map_ref.name if s.config_map_ref else None, s.secret_ref.name if s.secret_ref else None)
               for s in container.env_from}
    assert ("rag-config", None) in sources and (None, "rag-secrets") in sources

    assert container.resources.requests == {"cpu": "2", "memory": "2Gi"}
    assert container.resources.limits == {"memory": "3Gi"}
    (mount,) = container.volume_mounts
    (volume,) = pod.volumes
    assert (mount.name, mount.mount_path, mount.read_only) == ("corpus", "/data/corpus", True)
    assert volume.name == "corpus" and volume.persistent_volume_claim.claim_name == "rag-corpus"
    # the corpus root the settings name (deploy/rag.env) is the mounted folder
    roots = json.loads(env_file(RAG_ENV)["RAG_PIPELINE__ROOTS"])
    assert [r["path"] for r in roots] == [mount.mount_path]

    assert container.security_context.run_as_user == 10001 and container.security_context.run_as_non_root
    assert container.security_context.allow_privilege_escalation is False
    assert pod.security_context.fs_group == 10001
    assert pod.restart_policy == "Never"
    assert pod.service_account_name == chart_fullname()
    labels = job.spec.template.metadata.labels
    assert labels["dagster/job"] == INGEST_JOB and labels["app.kubernetes.io/part-of"] == "rag-kb"
    assert labels["app.kubernetes.io/component"] == "run_worker"


def test_values_queue_storage_and_secrets_say_what_the_chart_docs_say(monkeypatch):
    """Run launcher, queued coordinator, tag limits (valid instance config, matching the tags our
    runs carry, and holding back the right runs), external dagster-postgres storage, secrets."""
    import inspect

    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test, instance_for_test
    from dagster._utils.tags import TagConcurrencyLimitsCounter
    from dagster_postgres.utils import get_conn_string

    import pipelines.schedules
    import pipelines.sensors
    from pipelines.definitions import defs
    from rag_lib.config import Settings

    values = load_values()
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert coordinator["enabled"] is True and coordinator["type"] == "QueuedRunCoordinator"
    limits = coordinator["config"]["queuedRunCoordinator"]["tagConcurrencyLimits"]
    by_value = {(lim["key"], lim.get("value")): lim["limit"] for lim in limits}

    # every limited tag is one our runs carry: rag/trigger values set by the sensor and schedules,
    # dagster/schedule_name values of real schedules, and the k8s variant's job tag
    sources = inspect.getsource(pipelines.sensors) + inspect.getsource(pipelines.schedules)
    schedules = {s.name for s in defs.schedules}
    for key, value in by_value:
        if key == "rag/trigger":
            assert re.search(rf'(["\']rag/trigger["\']:\s*|trigger=)["\']{re.escape(value)}["\']', sources), value
        elif key == "dagster/schedule_name":
            assert value in schedules
        else:
            assert (key, value) == ("rag/executor", "k8s")
    assert by_value[("rag/trigger", "reembed_schedule")] == 1
    assert by_value[("dagster/schedule_name", "index_maintenance_schedule")] == 1
    ingest_limit = by_value[("rag/trigger", "corpus_sensor")]
    assert ingest_limit == by_value[("rag/trigger", "nightly_reconcile")] > 1

    # the coordinator block is valid Dagster instance config, and holds back what it should
    with instance_for_test(overrides={"run_coordinator": instance_run_coordinator(values)}) as instance:
        assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
        config = instance.run_coordinator.inst_data.config_dict
        assert config["max_concurrent_runs"] >= ingest_limit + 2  # ingest + re-embed + maintenance

        def run(**tags):
            return create_run_for_test(instance, job_name="ingest_files", tags=tags, status=DagsterRunStatus.STARTED)

        in_progress = [run(**{"rag/trigger": "corpus_sensor"}) for _ in range(ingest_limit)]
        in_progress += [run(**{"rag/trigger": "reembed_schedule"}),
                        run(**{"dagster/schedule_name": "index_maintenance_schedule"})]
        counter = TagConcurrencyLimitsCounter(config["tag_concurrency_limits"], in_progress)
        assert counter.is_blocked(run(**{"rag/trigger": "corpus_sensor"}))
        assert not counter.is_blocked(run(**{"rag/trigger": "nightly_reconcile"}))
        assert counter.is_blocked(run(**{"rag/trigger": "reembed_schedule"}))
        assert counter.is_blocked(run(**{"dagster/schedule_name": "index_maintenance_schedule"}))

    # Dagster's storage: the managed server, our secret, the psycopg2 driver SQLAlchemy 2.1 needs
    assert values["postgresql"]["enabled"] is False and values["postgresql"]["postgresqlHost"]
    assert values["generatePostgresqlPasswordSecret"] is False
    block = instance_storage(values)
    url = get_conn_string(block["username"], "secret", block["hostname"], block["db_name"], str(block["port"]),
                          block["params"], block.get("scheme", "postgresql"))
    assert url.startswith("postgresql+psycopg2://dagster:secret@") and "sslmode=require" in url

    # secrets by reference only; the code server and the runs read the same Secret and ConfigMap
    text = VALUES.read_text()
    assert not re.search(r"(?i)(api_key|password)\s*:\s*['\"]?[^'\"\s{]+", text.replace('postgresqlPassword: ""', ""))
    deployment = user_deployment(values)
    run_cfg = values["runLauncher"]["config"]["k8sRunLauncher"]
    for cfg in (deployment, run_cfg):
        assert {"name": "rag-secrets"} in cfg["envSecrets"] and {"name": "rag-config"} in cfg["envConfigMaps"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is False  # runs sized by runLauncher
    # the ConfigMap's settings are ones rag_lib reads
    env = env_file(RAG_ENV)
    assert env and all(k.startswith(("RAG_", "HF_", "TRANSFORMERS_")) for k in env)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert [str(r.path) for r in settings.pipeline.roots] == ["/data/corpus"]
    assert settings.pool_max_size == int(env["RAG_POOL_MAX_SIZE"])
    # the secret's keys are the names the settings read (docs/deploy.md creates them)
    assert settings.embedding.api_key_env == "OPENAI_API_KEY" and settings.server.api_keys_env == "RAG_API_KEYS"


def helm_merge(defaults: Any, override: Any) -> Any:
    """Helm's coalescing of user values over chart defaults: maps merge, null deletes, else replace."""
    if isinstance(defaults, dict) and isinstance(override, dict):
        merged = copy.deepcopy(defaults)
        for key, value in override.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = helm_merge(merged.get(key), value)
        return merged
    return copy.deepcopy(override)


def offline_validator(schema: dict[str, Any]):
    """A Draft 7 validator (Helm's JSON-schema dialect: a `$ref` replaces its siblings) for a chart
    schema with its Kubernetes `$ref`s (kubernetesjsonschema.dev) dropped, so nothing is fetched:
    the chart's own structure, required keys and types are checked, Kubernetes objects only as
    objects/arrays."""
    import jsonschema

    def local(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            return {k: local(v) for k, v in node.items() if not (k == "$ref" and not ref.startswith("#"))}
        if isinstance(node, list):
            return [local(v) for v in node]
        return node

    return jsonschema.Draft7Validator(local(schema))


def test_values_validate_against_the_charts_published_schema():
    """Our values merged over the chart's defaults validate against values.schema.json (and the
    user-deployments subchart's), as `helm install` checks them."""
    chart = next((d for d in CHART_DIRS if (d / "values.schema.json").is_file()), None)
    if chart is None:
        pytest.skip("no copy of the Dagster chart " + CHART_VERSION + " (values.yaml + values.schema.json): set "
                    "DAGSTER_HELM_SCHEMA_DIR to the dagster repository's helm/dagster at that tag; fetched "
                    "files may not be committed, only steering may place them under shared/")
    values = load_values()
    merged = helm_merge(yaml.safe_load((chart / "values.yaml").read_text()), values)
    errors = sorted(offline_validator(json.loads((chart / "values.schema.json").read_text())).iter_errors(merged),
                    key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors[:10])
    sub = chart / "charts" / "dagster-user-deployments"
    if (sub / "values.schema.json").is_file():
        # the subchart sees its section of our values plus the parent's `global`
        sub_merged = helm_merge(yaml.safe_load((sub / "values.yaml").read_text()),
                                {**values["dagster-user-deployments"], "global": merged.get("global", {})})
        sub_errors = list(offline_validator(json.loads((sub / "values.schema.json").read_text())).iter_errors(sub_merged))
        assert not sub_errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in sub_errors[:10])


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile: comment lines dropped first (also inside a
    continued instruction, as Docker does), then continuation lines joined."""
    kept = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    text = re.sub(r"\\\n", " ", "\n".join(kept))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "") for ln in lines]


def test_dockerfile_serves_the_code_location_the_values_name():
    """The image's CMD is `dagster api grpc` on pipelines.definitions:defs (options the real CLI
    accepts, a module that imports and holds our jobs), the same module, attribute and folder the
    chart's dagsterApiGrpcArgs name; non-root user; CPU torch at pyproject's pin; model offline."""
    import tomllib

    from dagster import Definitions
    from dagster._cli.api import grpc_command

    instructions = dockerfile_instructions()
    (cmd,) = [json.loads(args) for op, args in instructions if op == "CMD"]
    assert cmd[:3] == ["dagster", "api", "grpc"]
    ctx = grpc_command.make_context("grpc", cmd[3:])  # the installed CLI parses every option
    assert (ctx.params["module_name"], ctx.params["attribute"]) == ("pipelines.definitions", "defs")
    (workdir,) = [args for op, args in instructions if op == "WORKDIR"]
    assert ctx.params["working_directory"] == workdir == "/opt/rag"
    module = __import__(ctx.params["module_name"], fromlist=[ctx.params["attribute"]])
    defs = getattr(module, ctx.params["attribute"])
    assert isinstance(defs, Definitions)
    assert {"ingest_files", "reembed", "index_maintenance"} <= {j.name for j in defs.jobs}

    grpc = grpc_args(load_values())
    assert (grpc["-m"], grpc["-a"], grpc["-d"]) == ("pipelines.definitions", "defs", workdir)

    copied = [args.split()[0] for op, args in instructions if op == "COPY"]
    for name in ("rag_lib", "pipelines", "sql", "pyproject.toml"):  # sql/: migrations read from the tree
        assert name in copied and (REPO / name).exists()
    (user,) = [args for op, args in instructions if op == "USER"]
    uid = int(user.split(":")[0])
    assert uid != 0 and uid == user_deployment(load_values())["podSecurityContext"]["runAsUser"]

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (torch_pin,) = [d for d in pyproject["project"]["dependencies"] if d.startswith("torch==")]
    runs = " ".join(args for op, args in instructions if op == "RUN")
    assert f'"{torch_pin}"' in runs and "--index-url https://download.pytorch.org/whl/cpu" in runs
    extra = re.search(r'pip install -e "\.\[(\w+)\]"', runs).group(1)
    assert any(d.startswith("dagster-k8s==") for d in pyproject["project"]["optional-dependencies"][extra])
    env = shlex.split(" ".join(args for op, args in instructions if op == "ENV"))
    assert "HF_HUB_OFFLINE=1" in env and "TRANSFORMERS_OFFLINE=1" in env


def test_step_per_pod_variant_uses_the_k8s_job_executor():
    """pipelines.k8s serves the same code location plus ingest/re-embed variants run by
    k8s_job_executor, tagged for their queue limit, with the large pod for the encoding step."""
    from dagster import Definitions

    from pipelines import k8s
    from pipelines.jobs import ingest_job

    Definitions.validate_loadable(k8s.defs)
    repo = k8s.defs.get_repository_def()
    for name in ("ingest_files_k8s", "reembed_k8s"):
        job = repo.get_job(name)
        assert job.executor_def.name == "k8s_step_per_pod"
        assert job.tags["rag/executor"] == "k8s"
        assert k8s.ENCODER_STEP in {node.name for node in job.graph.nodes}
    assert set(repo.get_job("ingest_files_k8s").graph.node_dict) == set(repo.get_job(ingest_job.name).graph.node_dict)
    assert repo.get_job(ingest_job.name).executor_def.name == "in_process"  # the default stays in-process
    # every other job runs in one process too: the code location's default, the UI's asset job included
    others = {j.name: j.executor_def.name for j in repo.get_all_jobs() if not j.name.endswith(k8s.SUFFIX)}
    assert set(others.values()) == {"in_process"} and "__ASSET_JOB" in others, others
