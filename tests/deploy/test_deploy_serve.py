"""``processor serve`` as deployed: the serve Deployment and Service in
deploy/k8s and the compose serve service. The command in each is accepted
by serve's own parser and option validation with no setting it would
ignore; tokens are on (the secret from the Secret, which compose refuses to
start without); it connects as the serve ACL user; its probes and Service
use its HTTP port; compose publishes it on loopback only."""

from __future__ import annotations

import re
from typing import Any

from support.deploy_files import compose, configmap_env, image_argv, one

from processor.cli.main import build_parser

# --------------------------------------------------------------------------- serve


def _serve_env() -> dict[str, str]:
    """processor serve's container environment, the references resolved."""
    (spec,) = one("Deployment", "serve")["spec"]["template"]["spec"]["containers"]
    assert "envFrom" not in spec  # the workers' ConfigMap holds run options serve would warn of
    env: dict[str, str] = {}
    for var in spec["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["configMapKeyRef"]
            assert ref["name"] == one("ConfigMap")["metadata"]["name"]
            env[var["name"]] = configmap_env()[ref["key"]]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == one("Secret")["metadata"]["name"]
            env[var["name"]] = one("Secret")["stringData"][ref["key"]]
    return env


def _serve_accepts(argv: list[str], env: dict[str, str]) -> Any:
    from processor.serve import config as serve_config

    args = build_parser().parse_args(argv)
    assert args.command == "serve", argv
    resolved, problems = serve_config.resolve(args, env)
    assert problems == [] and resolved is not None, problems
    assert serve_config.unknown_env(env) == []  # no setting it would ignore
    return resolved


def test_serve_deployment_runs_with_tokens_as_the_serve_user() -> None:
    deployment = one("Deployment", "serve")
    pod = deployment["spec"]["template"]["spec"]
    (spec,) = pod["containers"]
    assert "command" not in spec and spec["args"] == ["serve"]
    assert "--no-auth" not in spec["args"]
    env = _serve_env()
    assert "PROCESSOR_NO_AUTH" not in env
    resolved = _serve_accepts(image_argv(spec["args"]), env)
    assert resolved.token_secret == env["PROCESSOR_TOKEN_SECRET"]  # auth on, from the Secret
    assert resolved.redis.url.startswith("redis://serve:")  # the serve ACL user
    ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
    assert ports["http"] == resolved.port
    assert spec["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert spec["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["readOnlyRootFilesystem"] is True
    service = one("Service", "serve")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_compose_serve_needs_a_token_secret_and_listens_on_loopback() -> None:
    spec = compose()["services"]["serve"]
    assert spec["command"] == ["serve"]
    env = {k: str(v) for k, v in spec["environment"].items()}
    # docker compose refuses to start without the variable (${VAR:?message}).
    assert re.fullmatch(r"\$\{PROCESSOR_TOKEN_SECRET:\?[^}]+\}", env["PROCESSOR_TOKEN_SECRET"])
    assert "PROCESSOR_NO_AUTH" not in env
    env["PROCESSOR_TOKEN_SECRET"] = "a-secret-from-the-environment"
    resolved = _serve_accepts(image_argv(spec["command"]), env)
    assert resolved.token_secret == "a-secret-from-the-environment"
    assert all(port.startswith("127.0.0.1:") for port in spec["ports"])
    assert spec["ports"] == [f"127.0.0.1:${{SERVE_HOST_PORT:-8080}}:{resolved.port}"]
