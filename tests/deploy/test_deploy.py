"""docker-compose.yml, deploy/Dockerfile and the Kubernetes manifests in
deploy/: they parse, the worker command in each is accepted by the CLI's own
parser and option validation, the core Kubernetes objects validate offline
against the API schemas, the KEDA objects have what KEDA requires, and the
pieces agree with each other (ConfigMap, Secret, probes, shards, groups).
Also ``processor init``, which the Job and the compose init service run.
``processor serve``'s Deployment, Service and compose service are
tests/deploy/test_deploy_serve.py's."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import redis
from support.deploy_files import (
    COMPOSE,
    DOCKERFILE,
    K8S,
    ROOT,
    SECRET,
    compose,
    configmap_env,
    dockerfile_instructions,
    image_argv,
    k8s_objects,
    load_all,
    one,
)

from processor.cli.main import build_parser
from processor.host import config
from processor.redis_io.options import RedisOptions
from processor.wire.keys import Namespace

# Kubernetes versions the manifests must be valid for: an old supported one and the newest
# schema kubernetes-validate ships.
K8S_VERSIONS = ("1.28.0", kubernetes_validate.latest_version())
# A drain applies and acks one batch: a read, an apply and a finalise call, each bounded
# by the Redis socket timeout. Termination grace must exceed it.
DRAIN_BOUND_S = 3 * RedisOptions("redis://x").socket_timeout


def secret_keys() -> set[str]:
    return set(one("Secret")["stringData"])


def accepted(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Parse argv with the CLI's parser and validate it with the environment, exactly
    as ``processor`` does at start; returns the resolved option values."""
    args = build_parser().parse_args(argv)
    assert args.command in ("run", "init"), argv
    values, problems = config.resolve(args, env)
    assert problems == [], f"{argv} with {env}: {problems}"
    return values


# --------------------------------------------------------------------------- Dockerfile


def test_dockerfile_is_slim_non_root_and_runs_the_worker() -> None:
    instructions = dockerfile_instructions()
    froms = [arg for instr, arg in instructions if instr == "FROM"]
    assert froms[-1] == "python:3.11-slim"
    user = [arg for instr, arg in instructions if instr == "USER"][-1]
    assert user not in ("0", "root") and not user.startswith("0:")
    assert any(instr == "RUN" and "pip install" in arg for instr, arg in instructions)
    assert image_argv() == ["run"]
    accepted(image_argv(), {"REDIS_URL": "redis://redis:6379"})
    # Everything copied from the build context exists and is let through by the
    # Dockerfile's own ignore file (which excludes everything else).
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().splitlines()
    assert "*" in ignore
    let_in = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    for instr, arg in instructions:
        if instr == "COPY" and not arg.startswith("--from"):
            for source in shlex.split(arg)[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: no such file"
                assert source.rstrip("/") in let_in, f"COPY {source}: excluded from the context"


def test_the_installed_package_carries_every_data_file() -> None:
    """The image installs a built wheel, not the source tree: every non-Python
    file the package reads (Lua scripts and the includes they pull in) must be
    package data, as setuptools globs it."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["processor"]
    package = ROOT / "processor"
    shipped = {path for pattern in patterns for path in package.glob(pattern)}
    data = {path for path in package.rglob("*")
            if path.is_file() and path.suffix not in (".py", ".pyc")}
    missing = sorted(str(path.relative_to(package)) for path in data - shipped)
    assert not missing, f"not in the wheel: {missing}"


# --------------------------------------------------------------------------- compose


def test_compose_redis_is_7_with_aof_and_a_healthcheck() -> None:
    redis_service = compose()["services"]["redis"]
    assert re.match(r"redis:7(\.|-|$)", redis_service["image"])
    command = redis_service["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert redis_service["healthcheck"]["test"][:2] == ["CMD", "redis-cli"]
    assert any(str(v).endswith(":/data") for v in redis_service["volumes"])


def test_compose_worker_is_built_from_the_dockerfile_and_scalable() -> None:
    services = compose()["services"]
    worker = services["worker"]
    assert Path(worker["build"]["context"], worker["build"]["dockerfile"]) == Path(
        "deploy/Dockerfile")
    # --scale worker=4 needs: no fixed container name or hostname, no host port.
    assert not {"container_name", "hostname", "ports"} & set(worker)
    assert "profiles" not in worker
    assert worker["depends_on"]["redis"]["condition"] == "service_healthy"
    assert worker["depends_on"]["init"]["condition"] == "service_completed_successfully"
    grace = int(worker["stop_grace_period"].rstrip("s"))
    assert grace > DRAIN_BOUND_S


def test_compose_runs_no_more_workers_than_shards() -> None:
    """More workers than shards share every shard and lose throughput
    (deploy/README.md): the stack's replicas and the count its header
    suggests stay at or below the namespace's shard count."""
    services = compose()["services"]
    shards = int(services["worker"]["environment"]["PROCESSOR_SHARDS"])
    assert 1 <= services["worker"]["deploy"]["replicas"] <= shards
    suggested = [int(n) for n in re.findall(r"--scale worker=(\d+)", COMPOSE.read_text())]
    assert all(n <= shards for n in suggested), suggested


@pytest.mark.parametrize("service", ["worker", "init"])
def test_compose_commands_are_accepted_by_the_cli(service: str) -> None:
    spec = compose()["services"][service]
    env = {k: str(v) for k, v in spec["environment"].items()}
    values = accepted(image_argv(spec["command"]), env)
    assert values["redis_url"] == "redis://redis:6379/0"
    assert values["shards"] >= 1
    if service == "worker":
        assert values["metrics_port"] == 9090


def test_compose_demo_producer_is_under_a_profile() -> None:
    producer = compose()["services"]["producer"]
    assert producer["profiles"] == ["demo"]
    assert producer["entrypoint"][1] == "/opt/processor/demo_producer.py"
    copied = [arg for instr, arg in dockerfile_instructions() if instr == "COPY"]
    assert "deploy/demo_producer.py /opt/processor/demo_producer.py" in copied
    sys.path.insert(0, str(ROOT / "deploy"))
    try:
        import demo_producer  # its own parser accepts the compose command
    finally:
        sys.path.remove(str(ROOT / "deploy"))
    args = demo_producer.parse_args(["--redis-url", "redis://redis:6379", *producer["command"]])
    assert args.turns == 0 and args.interval > 0


# --------------------------------------------------------------------------- Kubernetes


def test_every_manifest_parses_into_objects() -> None:
    for path in [*K8S, SECRET]:
        for doc in load_all(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_core_objects_validate_against_the_kubernetes_schemas(version: str) -> None:
    checked = set()
    for doc in k8s_objects():
        if doc["apiVersion"].startswith("keda.sh/"):
            continue  # KEDA's CRDs are not in kubernetes-validate's schemas: see below
        kubernetes_validate.validate(doc, version, strict=True)
        checked.add(doc["kind"])
    assert checked == {"ConfigMap", "Deployment", "PodDisruptionBudget", "Job", "Secret",
                       "Service"}


def pod_spec(kind: str) -> dict[str, Any]:
    return one(kind)["spec"]["template"]["spec"]


def container(kind: str) -> dict[str, Any]:
    (only,) = pod_spec(kind)["containers"]
    return only


def container_env(kind: str) -> dict[str, str]:
    """The container's environment: the ConfigMap it loads, and placeholders for secrets."""
    spec = container(kind)
    env: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        assert source["configMapRef"]["name"] == one("ConfigMap")["metadata"]["name"]
        env.update(configmap_env())
    for var in spec.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
            continue
        ref = var["valueFrom"]["secretKeyRef"]
        assert ref["name"] == one("Secret")["metadata"]["name"]
        assert ref["key"] in secret_keys(), f"{var['name']}: no key {ref['key']} in the Secret"
        env[var["name"]] = one("Secret")["stringData"][ref["key"]]
    return env


@pytest.mark.parametrize(("kind", "command"), [("Deployment", "run"), ("Job", "init")])
def test_container_commands_are_accepted_by_the_cli(kind: str, command: str) -> None:
    spec = container(kind)
    assert "command" not in spec  # the image's ENTRYPOINT (processor) stays
    assert spec["args"][0] == command
    values = accepted(image_argv(spec["args"]), container_env(kind))
    assert values["redis_url"].startswith("redis://processor:")  # the ACL user
    assert pod_spec(kind)["securityContext"]["runAsNonRoot"] is True


def test_configmap_holds_only_known_settings() -> None:
    known = {opt.env for opt in config.OPTIONS}
    for name in configmap_env():
        assert name in known or name == "REDIS_ADDRESS", f"unknown setting {name}"


def test_deployment_probes_resources_and_grace() -> None:
    spec = container("Deployment")
    port = int(configmap_env()["PROCESSOR_METRICS_PORT"])
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    assert ports["metrics"] == port
    assert spec["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert spec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert {"cpu", "memory"} <= set(spec["resources"]["requests"])
    assert "memory" in spec["resources"]["limits"]
    assert pod_spec("Deployment")["terminationGracePeriodSeconds"] > DRAIN_BOUND_S


def test_pdb_selects_the_worker_pods() -> None:
    labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    selector = one("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert one("Deployment")["spec"]["selector"]["matchLabels"] == selector


# --------------------------------------------------------------------------- KEDA


def test_scaled_object_has_a_lag_trigger_per_shard_stream() -> None:
    scaled, auth = one("ScaledObject"), one("TriggerAuthentication")
    assert scaled["apiVersion"] == auth["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    deployment = one("Deployment")
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert spec["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    settings = configmap_env()
    ns = Namespace(settings["PROCESSOR_NAMESPACE"], int(settings["PROCESSOR_SHARDS"]))
    group = settings["PROCESSOR_GROUP"]
    triggers = spec["triggers"]
    names = [t["name"] for t in triggers]
    assert len(set(names)) == len(names), "KEDA rejects duplicate trigger names"
    by_stream: dict[str, set[str]] = {}
    for trigger in triggers:
        meta = trigger["metadata"]
        assert trigger["type"] == "redis-streams"
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
        assert meta["consumerGroup"] == group
        assert meta["addressFromEnv"] in container_env("Deployment")
        assert all(isinstance(v, str) for v in meta.values()), "KEDA metadata values are strings"
        measures = {"lagCount", "pendingEntriesCount", "streamLength"} & set(meta)
        assert len(measures) == 1, f"{trigger['name']}: one measure per trigger"
        (measure,) = measures
        assert int(meta[measure]) > 0
        by_stream.setdefault(meta["stream"], set()).add(measure)
    # Lag only: held turns' entries are pending on purpose (the default), so
    # a pending trigger would scale on turns in flight (keda.yaml says why).
    assert by_stream == {s.updates: {"lagCount"} for s in ns.all()}
    # No more workers than shards (deploy/README.md, keda.yaml say why).
    assert spec["maxReplicaCount"] == ns.shards
    hold = settings.get("PROCESSOR_HOLD_TURNS", "1").lower()
    assert hold not in ("0", "false", "no", "off"), "scaling on lag assumes held turns"


def test_trigger_authentication_reads_the_keda_user_from_the_secret() -> None:
    refs = one("TriggerAuthentication")["spec"]["secretTargetRef"]
    assert {r["parameter"] for r in refs} == {"username", "password"}
    for ref in refs:
        assert ref["name"] == one("Secret")["metadata"]["name"]
        assert ref["key"] in secret_keys()
    username = next(r for r in refs if r["parameter"] == "username")
    assert one("Secret")["stringData"][username["key"]] == "keda"  # the read-only ACL user


# --------------------------------------------------------------------------- processor init


def _init(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "processor.cli", "init", *args],
                          capture_output=True, text=True, timeout=60, check=False, env=env)


def test_init_creates_every_shard_group_idempotently(
    redis_url: str, namespace: str, redis_client: redis.Redis
) -> None:
    ns = Namespace(namespace, 3)
    for _ in range(2):  # the second run finds everything in place
        proc = _init("--redis-url", redis_url, "--namespace", namespace, "--shards", "3",
                     "--group", "g1")
        assert proc.returncode == 0, proc.stderr
        assert all(s.updates in proc.stdout for s in ns.all())
    record = redis_client.hgetall(ns.meta)
    assert (record[b"shards"], record[b"group"]) == (b"3", b"g1")
    for shard in ns.all():
        groups = redis_client.xinfo_groups(shard.updates)
        assert [g["name"] for g in groups] == [b"g1"]
    assert not redis_client.exists(Namespace(namespace, 4).shard(3).updates)


def test_init_reads_the_environment_like_run(redis_url: str, namespace: str,
                                             redis_client: redis.Redis) -> None:
    env = {"REDIS_URL": redis_url, "PROCESSOR_NAMESPACE": namespace, "PROCESSOR_SHARDS": "2",
           "PATH": "/usr/bin:/bin"}
    proc = _init(env=env)
    assert proc.returncode == 0, proc.stderr
    assert redis_client.xinfo_groups(Namespace(namespace, 2).shard(1).updates)


def test_init_without_a_url_or_with_a_bad_setting_exits_2() -> None:
    proc = _init(env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "REDIS_URL" in proc.stderr
    proc = _init("--redis-url", "redis://localhost:1", "--shards", "zero",
                 env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert "--shards" in proc.stderr
