"""The deployment files the deploy tests (tests/deploy/test_deploy*.py) read:
docker-compose.yml, deploy/Dockerfile, the Kubernetes manifests in deploy/k8s
and the example Secret, parsed (each once); the one object of a kind (of a
Deployment or Service: of a component), the ConfigMap's settings, the compose
file, and what the image runs (ENTRYPOINT + CMD, or + a given command)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
SECRET = ROOT / "deploy" / "secret.example.yaml"


@cache  # parsed once: callers must not change what they get
def load_all(path: Path) -> list[dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert docs, f"{path} has no YAML document"
    return docs


def k8s_objects() -> list[dict[str, Any]]:
    return [doc for path in [*K8S, SECRET] for doc in load_all(path)]


def one(kind: str, component: str = "worker") -> dict[str, Any]:
    """The one object of ``kind`` (of a Deployment or Service: of ``component``)."""
    found = [doc for doc in k8s_objects() if doc["kind"] == kind]
    if kind in ("Deployment", "Service"):
        found = [doc for doc in found
                 if doc["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def configmap_env() -> dict[str, str]:
    return one("ConfigMap")["data"]


def compose() -> dict[str, Any]:
    (doc,) = load_all(COMPOSE)
    return doc


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines
            if ln and not ln.startswith("#")]


def dockerfile_exec(name: str) -> list[str]:
    """The JSON (exec) form of the last ENTRYPOINT or CMD."""
    value = [arg for instr, arg in dockerfile_instructions() if instr == name][-1]
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"{name} must use the exec form (signals reach processor)"
    return parsed


def image_argv(command: list[str] | None = None) -> list[str]:
    """What the image runs (ENTRYPOINT + CMD, or + the given command), without the program."""
    entrypoint = dockerfile_exec("ENTRYPOINT")
    assert entrypoint == ["processor"]
    return command if command is not None else dockerfile_exec("CMD")
