"""What the deploy checks share: deploy/ parsed into a bundle, its containers, and the rules every
container that runs speculant must follow (flags that parse, declared ports, addresses, env)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from launcher.cli import build_parser
from speculant.auth import TOKEN_ENV
from speculant.config import SpeculantSettings
from speculant.graph_catalog import parse_graph_specs

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yml"
COMPOSE_GPU = DEPLOY / "docker-compose.gpu.yml"
KUSTOMIZATION = K8S / "kustomization.yaml"

# Environment variables other than SPECULANT_* settings that the manifests may set: name ->
# where it is read (repository files, or modules of a dependency). A test asserts that each name
# appears in each of them, so the list cannot name a variable nothing reads.
EXTERNAL_ENV: dict[str, tuple[str, ...]] = {
    "HF_TOKEN": ("speculant/tokenizer.py", "verifier_service/model_loading.py"),
    "HF_HUB_OFFLINE": ("speculant/hub.py", "huggingface_hub.constants"),
    "HF_HOME": ("huggingface_hub.constants",),
    "NUMBA_CACHE_DIR": ("numba.core.config",),
}
SERVE_COMMANDS = ("serve-draft", "serve-verifier", "serve-gateway")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")
GPU = "nvidia.com/gpu"
_ADDRESS = re.compile(r"(?:dns:)?[A-Za-z0-9.-]+:\d+")


@dataclass
class Bundle:
    """deploy/, parsed: k8s objects with their file name, the compose files, the Dockerfile."""

    k8s: list[tuple[str, dict[str, Any]]]
    kustomization: dict[str, Any]
    k8s_files: list[str]
    compose: dict[str, Any]
    compose_gpu: dict[str, Any]
    dockerfile: str


@dataclass
class Container:
    """One container (k8s) or compose service, reduced to what the checks compare."""

    where: str
    spec: dict[str, Any]
    argv: list[str] | None  # speculant's arguments; None when it runs something else
    args: argparse.Namespace | None = None  # argv parsed by build_parser(); None if it failed
    ports: dict[str, int] = field(default_factory=dict)  # declared ports: name -> number
    env: dict[str, str | None] = field(default_factory=dict)  # None: from a secret or the host

    @property
    def command(self) -> str | None:
        return None if self.args is None else self.args.command


def load_bundle() -> Bundle:
    files = sorted(p.name for p in K8S.glob("*.yaml") if p != KUSTOMIZATION)
    k8s = [
        (name, doc)
        for name in files
        for doc in yaml.safe_load_all((K8S / name).read_text(encoding="utf-8"))
        if doc is not None
    ]
    return Bundle(
        k8s=k8s,
        kustomization=yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8")),
        k8s_files=files,
        compose=yaml.safe_load(COMPOSE.read_text(encoding="utf-8")),
        compose_gpu=yaml.safe_load(COMPOSE_GPU.read_text(encoding="utf-8")),
        dockerfile=DOCKERFILE.read_text(encoding="utf-8"),
    )


def parse_speculant(argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    """(namespace, None), or (None, argparse's error line) for arguments speculant refuses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv), None
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return None, lines[-1] if lines else "exited while parsing"


def default_graph(args: argparse.Namespace) -> str:
    """The folder of a serve-draft's default graph (its --graph flags and --default-graph)."""
    specs, default = parse_graph_specs(args.graph, args.default_graph)
    return str(next(spec.path for spec in specs if spec.name == default))


def port_flags(args: argparse.Namespace) -> dict[str, int]:
    """Every port flag given or defaulted: ``--port``, and any ``--*-port`` (metrics, http...)."""
    return {
        "--" + name.replace("_", "-"): value
        for name, value in vars(args).items()
        if (name == "port" or name.endswith("_port")) and isinstance(value, int)
    }


def missing_ports(container: Container) -> list[str]:
    """Port flags whose value the container does not declare (containerPort / expose)."""
    if container.args is None:
        return []
    declared = set(container.ports.values())
    return [
        f"{container.where}: {flag} {value} is not a declared container port "
        f"({sorted(declared) or 'none'})"
        for flag, value in port_flags(container.args).items()
        if value not in declared
    ]


def env_problems(name: str, value: str | None, where: str) -> list[str]:
    """A name must be SPECULANT_AUTH_TOKEN, a SpeculantSettings field (SPECULANT_SECTION__FIELD,
    its literal value valid for the field) or one of EXTERNAL_ENV."""
    if name == TOKEN_ENV or name in EXTERNAL_ENV:
        return []
    if not name.startswith("SPECULANT_"):
        return [f"{where}: env {name} is read by nothing (not a setting nor in EXTERNAL_ENV)"]
    section, sep, field_name = name.removeprefix("SPECULANT_").partition("__")
    sections = SpeculantSettings.model_fields
    if name != name.upper() or not sep or section.lower() not in sections:
        return [f"{where}: env {name} is not SPECULANT_<SECTION>__<FIELD> ({', '.join(sections)})"]
    model = sections[section.lower()].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel)
    if field_name.lower() not in model.model_fields:
        return [f"{where}: env {name}: {model.__name__} has no field {field_name.lower()!r}"]
    if value is not None:
        try:
            model.model_validate({field_name.lower(): value})
        except ValidationError as exc:
            return [f"{where}: env {name}={value!r}: {exc.errors()[0]['msg']}"]
    return []


def addresses_in(text: str) -> list[str]:
    return _ADDRESS.findall(text)


def split_address(address: str) -> tuple[str, int, bool]:
    """(first DNS label of the host, port, whether it had the dns: prefix)."""
    is_dns = address.startswith("dns:")
    host, _, port = address.removeprefix("dns:").rpartition(":")
    return host.split(".")[0], int(port) if port.isdigit() else -1, is_dns


def parsed(container: Container) -> list[str]:
    """Parse container.argv into container.args; the parse error as a problem."""
    if container.argv is None:
        return []
    container.args, error = parse_speculant(container.argv)
    return [] if error is None else [f"{container.where}: speculant {container.argv}: {error}"]


def listen_problems(container: Container) -> list[str]:
    if container.command in SERVE_COMMANDS and container.args.host != "0.0.0.0":
        return [
            f"{container.where}: --host {container.args.host} (a container must listen on 0.0.0.0)"
        ]
    return []
