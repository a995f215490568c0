"""deploy/ (Dockerfile, docker compose, Kubernetes) agrees with the code: flags parse, ports,
probes, addresses, volumes and environment variable names match (checks in deploy_checks.py).

Nothing is built or deployed here (no registry or cluster in CI); each check is shown to fail on
a mutated copy of the parsed manifests (tests.deploy_mutations). The compose commands are run in
test_deploy_compose_run.py.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import shutil
import subprocess

import pytest
import yaml

from tests.deploy_checks import check_bundle, speculant_containers
from tests.deploy_mutations import MUTATIONS
from tests.deploy_rules import (
    EXTERNAL_ENV,
    REPO,
    Bundle,
    Container,
    env_problems,
    missing_ports,
)


def test_manifests_agree_with_the_code(bundle: Bundle) -> None:
    assert check_bundle(bundle) == []


def test_every_service_command_is_parsed(bundle: Bundle) -> None:
    """The checks saw (and parsed) each speculant command in k8s and in compose."""
    seen = {(c.where.split()[0], c.command) for c in speculant_containers(bundle)}
    commands = {"build", "serve-draft", "serve-verifier", "serve-gateway"}
    assert {command for where, command in seen if where.endswith(".yaml")} == commands
    assert {command for where, command in seen if where == "docker-compose.yml"} == commands
    assert {command for where, command in seen if where == "compose+gpu"} == commands


def test_all_yaml_parses_with_safe_load() -> None:
    files = [*(REPO / "deploy").glob("*.yml"), *(REPO / "deploy" / "k8s").glob("*.yaml")]
    assert len(files) >= 7
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]
        assert docs, path


@pytest.mark.parametrize("name", sorted(EXTERNAL_ENV))
def test_external_env_names_are_read_where_listed(name: str) -> None:
    for place in EXTERNAL_ENV[name]:
        if place.endswith(".py"):
            source = (REPO / place).read_text(encoding="utf-8")
        else:
            spec = importlib.util.find_spec(place)
            assert spec is not None and spec.origin is not None, place
            source = open(spec.origin, encoding="utf-8").read()  # noqa: SIM115
        assert f'"{name}"' in source, f"{name} is not read in {place}"


def test_env_rules() -> None:
    assert env_problems("SPECULANT_DRAFT__K", "8", "x") == []
    assert env_problems("SPECULANT_AUTH_TOKEN", None, "x") == []
    assert env_problems("HF_TOKEN", None, "x") == []
    assert "no field" in env_problems("SPECULANT_DRAFT__KK", "8", "x")[0]
    assert "SECTION" in env_problems("SPECULANT_NOPE__K", "8", "x")[0]
    assert "SECTION" in env_problems("SPECULANT_DRAFT_K", "8", "x")[0]
    assert env_problems("speculant_draft__k", "8", "x")  # upper case only
    assert "read by nothing" in env_problems("OMP_NUM_THREAD", "1", "x")[0]
    assert env_problems("SPECULANT_DRAFT__K", "0", "x")  # k >= 1
    assert env_problems("SPECULANT_VERIFIER__DEVICE", "tpu", "x")


def test_port_rule_covers_future_port_flags() -> None:
    """Any --*-port flag (e.g. a later --metrics-port) must be a declared container port."""
    args = argparse.Namespace(command="serve-draft", port=50051, metrics_port=9100, graph="g")
    container = Container(where="c", spec={}, argv=[], args=args, ports={"grpc": 50051})
    assert missing_ports(container) == [
        "c: --metrics-port 9100 is not a declared container port ([50051])"
    ]
    container.ports["metrics"] = 9100
    assert missing_ports(container) == []


# ---- mutations: each check fails ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_check_can_fail(bundle: Bundle, name: str) -> None:
    mutate, expected = MUTATIONS[name]
    mutated = copy.deepcopy(bundle)
    mutate(mutated)
    problems = check_bundle(mutated)
    assert any(expected in p for p in problems), problems


# ---- kustomize ---------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_renders(bundle: Bundle) -> None:
    """`kubectl kustomize` (no cluster needed) renders exactly the objects of the files."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "deploy" / "k8s")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rendered = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out) if d)
    assert rendered == sorted((d["kind"], d["metadata"]["name"]) for _, d in bundle.k8s)
