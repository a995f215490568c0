"""deploy/ (Dockerfile, docker compose, Kubernetes) agrees with the code: flags parse, ports,
probes, addresses, volumes and environment variable names match (checks in deploy_checks.py).

Nothing is built or deployed here (no registry or cluster in CI); each check is shown to fail on
a mutated copy of the parsed manifests, and the compose health check one-liner is run against a
real gRPC health service.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from speculant.grpc_server import ServiceServer
from speculant.ports import free_port
from tests.deploy_checks import check_bundle, speculant_containers
from tests.deploy_rules import (
    EXTERNAL_ENV,
    REPO,
    Bundle,
    Container,
    env_problems,
    load_bundle,
    missing_ports,
)


@pytest.fixture(scope="module")
def bundle() -> Bundle:
    return load_bundle()


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


def k8s(bundle: Bundle, kind: str, name: str) -> dict[str, Any]:
    return next(d for _, d in bundle.k8s if d["kind"] == kind and d["metadata"]["name"] == name)


def k8s_container(bundle: Bundle, deployment: str, kind: str = "Deployment") -> dict[str, Any]:
    return k8s(bundle, kind, deployment)["spec"]["template"]["spec"]["containers"][0]


def set_arg(args: list[str], flag: str, value: str) -> None:
    args[args.index(flag) + 1] = value


def draft(b: Bundle) -> dict[str, Any]:
    return k8s_container(b, "speculant-draft")


def gateway(b: Bundle) -> dict[str, Any]:
    return k8s_container(b, "speculant-gateway")


def verifier(b: Bundle) -> dict[str, Any]:
    return k8s_container(b, "speculant-verifier")


def compose(b: Bundle, service: str) -> dict[str, Any]:
    return b.compose["services"][service]


def _drop_gpu(b: Bundle) -> None:
    del verifier(b)["resources"]["limits"]["nvidia.com/gpu"]
    del verifier(b)["resources"]["requests"]["nvidia.com/gpu"]


def _init_waits_elsewhere(b: Bundle) -> None:
    pod = k8s(b, "Deployment", "speculant-gateway")["spec"]["template"]["spec"]
    command = pod["initContainers"][0]["command"]
    command[-1] = command[-1].replace("dns:speculant-draft:50051", "dns:speculant-draft:1")


def _graph_writable(b: Bundle) -> None:
    for mount in draft(b)["volumeMounts"]:
        mount["readOnly"] = False
    pod = k8s(b, "Deployment", "speculant-draft")["spec"]["template"]["spec"]
    pod["volumes"][0]["persistentVolumeClaim"]["readOnly"] = False


MUTATIONS: dict[str, tuple[Callable[[Bundle], None], str]] = {
    # k8s: flags parse with speculant's own parser
    "unknown flag": (lambda b: draft(b)["args"].append("--no-such-flag"), "unrecognized"),
    "bad flag value": (lambda b: set_arg(draft(b)["args"], "--port", "http"), "invalid int"),
    "bad choice": (lambda b: set_arg(verifier(b)["args"], "--device", "tpu"), "invalid choice"),
    # k8s: ports and probes
    "containerPort": (
        lambda b: draft(b)["ports"][0].update(containerPort=50061),
        "--port 50051 is not a declared container port",
    ),
    "--port moved": (lambda b: set_arg(gateway(b)["args"], "--port", "50060"), "gRPC probe"),
    "readiness probe port": (
        lambda b: draft(b)["readinessProbe"]["grpc"].update(port=50052),
        "readinessProbe",
    ),
    "http probe": (
        lambda b: verifier(b).update(livenessProbe={"tcpSocket": {"port": 50052}}),
        "livenessProbe",
    ),
    "no liveness probe": (lambda b: verifier(b).pop("livenessProbe"), "no livenessProbe"),
    "listens on loopback": (
        lambda b: set_arg(verifier(b)["args"], "--host", "127.0.0.1"),
        "must listen on 0.0.0.0",
    ),
    "service targetPort": (
        lambda b: k8s(b, "Service", "speculant-verifier")["spec"]["ports"][0].update(
            targetPort="no-such-port"
        ),
        "targetPort",
    ),
    "service port": (
        lambda b: k8s(b, "Service", "speculant-verifier")["spec"]["ports"][0].update(port=80),
        "--verifier speculant-verifier:50052: Service/speculant-verifier port 50052",
    ),
    # k8s: the draft tier
    "not headless": (
        lambda b: k8s(b, "Service", "speculant-draft")["spec"].pop("clusterIP"),
        "is not dns:<headless Service>:PORT",
    ),
    "headless selector": (
        lambda b: k8s(b, "Service", "speculant-draft")["spec"]["selector"].update(
            {"app.kubernetes.io/component": "drafts"}
        ),
        "selects no speculant Deployment",
    ),
    "headless port mapping": (
        lambda b: k8s(b, "Service", "speculant-draft")["spec"]["ports"][0].update(port=80),
        "headless port 80",
    ),
    "gateway --draft name": (
        lambda b: set_arg(gateway(b)["args"], "--draft", "dns:speculant-drafts:50051"),
        "no Service named speculant-drafts",
    ),
    "gateway --draft not dns": (
        lambda b: set_arg(gateway(b)["args"], "--draft", "speculant-draft:50051"),
        "is not dns:",
    ),
    "gateway --draft port": (
        lambda b: set_arg(gateway(b)["args"], "--draft", "dns:speculant-draft:50052"),
        "does not reach serve-draft",
    ),
    "gateway --verifier": (
        lambda b: set_arg(gateway(b)["args"], "--verifier", "speculant-draft:50051"),
        "does not reach serve-verifier",
    ),
    "gateway --draft second address": (
        lambda b: set_arg(gateway(b)["args"], "--draft", "dns:speculant-draft:50051,h:1"),
        "no Service named h",
    ),
    "gateway init waits elsewhere": (_init_waits_elsewhere, "waits for dns:speculant-draft:1"),
    "HPA target": (
        lambda b: k8s(b, "HorizontalPodAutoscaler", "speculant-draft")["spec"][
            "scaleTargetRef"
        ].update(name="speculant-gateway"),
        "HorizontalPodAutoscalers scale Deployment/speculant-draft",
    ),
    "HPA api": (
        lambda b: k8s(b, "HorizontalPodAutoscaler", "speculant-draft").update(
            apiVersion="autoscaling/v1"
        ),
        "want autoscaling/v2",
    ),
    "HPA without cpu request": (
        lambda b: draft(b)["resources"]["requests"].pop("cpu"),
        "CPU HPA needs requests.cpu",
    ),
    "replicas under HPA": (
        lambda b: k8s(b, "Deployment", "speculant-draft")["spec"].update(replicas=3),
        "fights its HPA",
    ),
    "pod labels": (
        lambda b: k8s(b, "Deployment", "speculant-draft")["spec"]["template"]["metadata"][
            "labels"
        ].update({"app.kubernetes.io/component": "x"}),
        "misses the pod labels",
    ),
    # k8s: GPU, graph volume, env, namespace, kustomization
    "no GPU": (_drop_gpu, "no nvidia.com/gpu"),
    "verifier on cpu": (lambda b: set_arg(verifier(b)["args"], "--device", "cpu"), "--device cpu"),
    "job writes elsewhere": (
        lambda b: set_arg(
            k8s_container(b, "speculant-build-graph", "Job")["args"], "--out", "/graphs/other"
        ),
        "no Job builds --out /graphs/current",
    ),
    "draft mounts graph writable": (_graph_writable, "not mounted readOnly"),
    "init waits for another graph": (
        lambda b: set_arg(draft(b)["args"], "--graph", "/graphs/other"),
        "does not wait for /graphs/other",
    ),
    "unknown setting": (
        lambda b: verifier(b)["env"].append(
            {"name": "SPECULANT_VERIFIER__MAX_SESION", "value": "1"}
        ),
        "has no field 'max_sesion'",
    ),
    "bad setting value": (
        lambda b: verifier(b)["env"][2].update(value="0"),
        "SPECULANT_VERIFIER__MAX_SESSIONS='0'",
    ),
    "unread env": (
        lambda b: gateway(b)["env"].append({"name": "HF_HUB_CACHE_DIR", "value": "/x"}),
        "read by nothing",
    ),
    "required secret": (
        lambda b: gateway(b)["env"][0]["valueFrom"]["secretKeyRef"].pop("optional"),
        "must be optional",
    ),
    "envFrom": (
        lambda b: gateway(b).update(envFrom=[{"secretRef": {"name": "s"}}]),
        "envFrom hides",
    ),
    "namespace": (
        lambda b: k8s(b, "Service", "speculant-gateway")["metadata"].update(namespace="prod"),
        "namespace-free",
    ),
    "kustomization": (
        lambda b: b.kustomization["resources"].remove("graph.yaml"),
        "kustomization.yaml",
    ),
    # compose
    "compose expose": (
        lambda b: compose(b, "draft").update(expose=["50061"]),
        "--port 50051 is not a declared container port",
    ),
    "compose published port": (
        lambda b: compose(b, "gateway").update(ports=["50050:8080"]),
        "--port 50050 is not a declared container port",
    ),
    "compose healthcheck port": (
        lambda b: compose(b, "verifier")["healthcheck"]["test"].__setitem__(
            3, compose(b, "verifier")["healthcheck"]["test"][3].replace("50052", "50051")
        ),
        "healthcheck checks ['127.0.0.1:50051']",
    ),
    "compose unknown flag": (
        lambda b: compose(b, "build-graph")["command"].append("--orders"),
        "unrecognized",
    ),
    "compose depends_on": (
        lambda b: compose(b, "draft")["depends_on"]["build-graph"].update(
            condition="service_started"
        ),
        "want service_completed_successfully",
    ),
    "compose gateway draft": (
        lambda b: set_arg(compose(b, "gateway")["command"], "--draft", "draft:50051"),
        "want dns:draft:50051",
    ),
    "compose gateway verifier": (
        lambda b: set_arg(compose(b, "gateway")["command"], "--verifier", "verifier:50051"),
        "want verifier:50052",
    ),
    "compose graph path": (
        lambda b: set_arg(compose(b, "build-graph")["command"], "--out", "/graphs/other"),
        "!= draft --graph",
    ),
    "compose env": (
        lambda b: compose(b, "gateway")["environment"].update(SPECULANT_GATEWAY__PORT="1"),
        "SPECULANT_<SECTION>__<FIELD>",
    ),
    "compose gpu device": (
        lambda b: b.compose_gpu["services"]["verifier"].pop("deploy"),
        "reserves no NVIDIA GPU",
    ),
    "compose gpu command": (
        lambda b: set_arg(b.compose_gpu["services"]["verifier"]["command"], "--port", "1"),
        "compose+gpu service verifier: --port 1",
    ),
    # Dockerfile
    "entrypoint": (
        lambda b: setattr(b, "dockerfile", b.dockerfile.replace('["speculant"]', '["python"]')),
        "ENTRYPOINT",
    ),
    "no constraints": (
        lambda b: setattr(b, "dockerfile", b.dockerfile.replace("-c constraints.txt", "--upgrade")),
        "-c constraints.txt",
    ),
    "base image": (
        lambda b: setattr(b, "dockerfile", b.dockerfile.replace("3.11-slim", "3.12")),
        "python:3.11-slim",
    ),
    "expose": (
        lambda b: setattr(b, "dockerfile", b.dockerfile.replace(" 50052", "")),
        "misses [50052]",
    ),
    "torch index": (
        lambda b: setattr(b, "dockerfile", b.dockerfile.replace("ARG TORCH_INDEX_URL", "ARG T")),
        "TORCH_INDEX_URL",
    ),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_check_can_fail(bundle: Bundle, name: str) -> None:
    mutate, expected = MUTATIONS[name]
    mutated = copy.deepcopy(bundle)
    mutate(mutated)
    problems = check_bundle(mutated)
    assert any(expected in p for p in problems), problems


# ---- the compose health check, run ------------------------------------------------------------


def test_compose_healthcheck_reports_serving_only(bundle: Bundle) -> None:
    """The compose health check command exits 0 for SERVING, non-zero otherwise."""
    test = bundle.compose["services"]["draft"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    port = free_port()
    argv = [sys.executable, "-c", test[3].replace("127.0.0.1:50051", f"127.0.0.1:{port}")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def run() -> int:
        return subprocess.run(argv, env=env, timeout=60, capture_output=True).returncode

    assert run() != 0  # nothing listening
    server = ServiceServer("127.0.0.1", port, ["speculant.v1.DraftService"])
    server.start()
    try:
        assert run() != 0  # NOT_SERVING
        server.set_serving()
        assert run() == 0
    finally:
        server.stop(0)


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


# ---- the compose commands, run as local processes ---------------------------------------------


def _localized(text: str, ports: dict[str, str], graphs: str) -> str:
    """A compose string with the image's paths, the service names and the ports of this host."""
    text = text.replace("/opt/speculant/demo", str(REPO / "demo")).replace("/graphs", graphs)
    text = text.replace("dns:draft:", "dns:127.0.0.1:").replace("verifier:", "127.0.0.1:")
    for old, new in ports.items():
        text = text.replace(old, new)
    return text


@pytest.mark.slow
def test_compose_commands_run_the_system(bundle: Bundle, tmp_path) -> None:
    """Each compose service's command and environment, with only paths, host names and ports
    changed, builds the graph, serves, passes its health check, and the gateway generates."""
    services = bundle.compose["services"]
    ports = {p: str(free_port()) for p in ("50050", "50051", "50052")}
    graphs = str(tmp_path / "graphs")

    def command(name: str) -> tuple[list[str], dict[str, str]]:
        argv = [_localized(str(a), ports, graphs) for a in services[name]["command"]]
        if "--host" in argv:  # 0.0.0.0 in a container; loopback on a test machine
            argv[argv.index("--host") + 1] = "127.0.0.1"
        env = {k: str(v) for k, v in (services[name].get("environment") or {}).items() if v}
        return argv, {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}

    def healthy(name: str) -> bool:
        test = [_localized(a, ports, graphs) for a in services[name]["healthcheck"]["test"][1:]]
        _, env = command(name)
        test[0] = sys.executable  # the image's python
        return subprocess.run(test, env=env, timeout=60, capture_output=True).returncode == 0

    argv, env = command("build-graph")
    subprocess.run([sys.executable, "-m", "speculant.cli", *argv], env=env, check=True, timeout=600)
    processes = []
    try:
        for name in ("draft", "verifier", "gateway"):
            argv, env = command(name)
            processes.append(
                subprocess.Popen([sys.executable, "-m", "speculant.cli", *argv], env=env)
            )
            for _ in range(600):  # the compose depends_on: healthy before the next starts
                if healthy(name):
                    break
                assert processes[-1].poll() is None, f"{name} exited"
                time.sleep(0.5)
            else:
                pytest.fail(f"{name} never became healthy")
        generated = subprocess.run(
            [
                sys.executable,
                "-m",
                "speculant.cli",
                "generate",
                "--gateway",
                f"127.0.0.1:{ports['50050']}",
                "--prompt",
                "Once upon a time",
                "--max-tokens",
                "16",
                "--temperature",
                "0",
                "--json",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert json.loads(generated.stdout)["stats"]["generated_tokens"] == 16
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
