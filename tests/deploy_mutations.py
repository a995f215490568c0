"""Mutations of a parsed deploy/ bundle, one per check of tests.deploy_checks: MUTATIONS maps a
name to (a function that breaks a deep copy of the bundle, a piece of the problem line the
checks must then report)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.deploy_rules import Bundle


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
