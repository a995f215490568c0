"""Checks of the Kubernetes manifests in deploy/k8s/ against the code and each other."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from tests.deploy_rules import (
    GPU,
    PROBES,
    SERVE_COMMANDS,
    Bundle,
    Container,
    addresses_in,
    default_graph,
    env_problems,
    listen_problems,
    missing_ports,
    parsed,
    split_address,
)

# ---- Kubernetes --------------------------------------------------------------------------------


def check_kustomization(bundle: Bundle) -> list[str]:
    listed = set(bundle.kustomization.get("resources", []))
    if listed != set(bundle.k8s_files):
        return [
            f"kustomization.yaml: resources {sorted(listed)} != files {sorted(bundle.k8s_files)}"
        ]
    return []


def _name(doc: dict[str, Any]) -> str:
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    if doc.get("kind") in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
        return doc["spec"]["template"]["spec"]
    return None


def _pod_labels(doc: dict[str, Any]) -> dict[str, str]:
    return doc["spec"]["template"].get("metadata", {}).get("labels", {})


def _k8s_container(where: str, spec: dict[str, Any]) -> Container:
    command = spec.get("command")
    if command is None:
        argv = list(spec.get("args", []))  # the image's entry point: speculant
    elif command == ["speculant"]:
        argv = list(spec.get("args", []))
    else:
        argv = None
    container = Container(where=f"{where} container {spec.get('name')}", spec=spec, argv=argv)
    for port in spec.get("ports", []):
        container.ports[port.get("name", str(port["containerPort"]))] = port["containerPort"]
    for var in spec.get("env", []):
        container.env[var["name"]] = var.get("value")
    return container


def k8s_pods(docs: list[tuple[str, dict[str, Any]]]) -> Iterator[tuple[str, dict, list]]:
    """(file, workload, its containers and init containers) for every pod template."""
    for file, doc in docs:
        pod = _pod_spec(doc)
        if pod is None:
            continue
        where = f"{file} {_name(doc)}"
        specs = [*pod.get("initContainers", []), *pod.get("containers", [])]
        yield file, doc, [_k8s_container(where, spec) for spec in specs]


def _k8s_container_problems(container: Container) -> list[str]:
    problems = parsed(container)
    spec = container.spec
    if "envFrom" in spec:
        problems.append(f"{container.where}: envFrom hides variable names; use env")
    for var in spec.get("env", []):
        problems += env_problems(var["name"], var.get("value"), container.where)
        secret = var.get("valueFrom", {}).get("secretKeyRef")
        if secret is not None and secret.get("optional") is not True:
            problems.append(f"{container.where}: secret for {var['name']} must be optional: true")
    if container.args is None:
        return problems
    problems += missing_ports(container) + listen_problems(container)
    if container.command in SERVE_COMMANDS:
        for kind in PROBES:
            probe = spec.get(kind)
            if probe is None:
                if kind != "startupProbe":
                    problems.append(f"{container.where}: no {kind}")
            elif probe.get("grpc", {}).get("port") != container.args.port:
                problems.append(
                    f"{container.where}: {kind} {probe} is not a gRPC probe of --port "
                    f"{container.args.port}"
                )
    if container.command == "serve-verifier":
        limits = spec.get("resources", {}).get("limits", {})
        requests = spec.get("resources", {}).get("requests", {})
        if int(limits.get(GPU, 0)) < 1:
            problems.append(f"{container.where}: no {GPU} in resources.limits")
        if GPU in requests and requests[GPU] != limits.get(GPU):
            problems.append(f"{container.where}: {GPU} requests != limits")
        if container.args.device == "cpu":
            problems.append(f"{container.where}: --device cpu on a GPU pod")
    return problems


def _mount_claim(pod: dict[str, Any], spec: dict[str, Any], path: str) -> tuple[str, bool] | None:
    """(claim name, read-only) of the volume mounted where path is, or None."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in spec.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(root):
            claim = volumes.get(mount["name"], {}).get("persistentVolumeClaim")
            if claim is None:
                return None
            read_only = bool(mount.get("readOnly") or claim.get("readOnly"))
            return claim["claimName"], read_only
    return None


def check_k8s(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    problems: list[str] = []
    for file, doc in docs:
        if "namespace" in doc.get("metadata", {}):
            problems.append(f"{file} {_name(doc)}: sets a namespace (manifests are namespace-free)")
    by_role: dict[str, list[tuple[dict, Container]]] = {}
    builds: list[tuple[dict, Container]] = []
    for file, doc, containers in k8s_pods(docs):
        selector = doc["spec"].get("selector", {}).get("matchLabels")
        if selector is not None and not selector.items() <= _pod_labels(doc).items():
            problems.append(f"{file} {_name(doc)}: selector {selector} misses the pod labels")
        for container in containers:
            problems += _k8s_container_problems(container)
            if container.command in SERVE_COMMANDS and doc["kind"] == "Deployment":
                by_role.setdefault(container.command, []).append((doc, container))
            elif container.command == "build":
                builds.append((doc, container))
    counts = {role: len(by_role.get(role, [])) for role in SERVE_COMMANDS}
    if any(count != 1 for count in counts.values()):
        # the cross-object checks below need one of each
        return [*problems, f"k8s: Deployments running each service: {counts}, want 1 each"]
    services = [doc for _, doc in docs if doc.get("kind") == "Service"]
    problems += _service_problems(services, by_role)
    draft_doc, draft = by_role["serve-draft"][0]
    problems += _gateway_problems(services, by_role)
    problems += _hpa_problems(
        [d for _, d in docs if d.get("kind") == "HorizontalPodAutoscaler"], draft_doc
    )
    problems += _graph_volume_problems(draft_doc, draft, builds)
    return problems


def _selected(service: dict, by_role: dict) -> list[tuple[str, dict, Container]]:
    selector = service["spec"].get("selector", {})
    return [
        (role, doc, container)
        for role, items in by_role.items()
        for doc, container in items
        if selector and selector.items() <= _pod_labels(doc).items()
    ]


def _target(port: dict, container: Container) -> int | None:
    target = port.get("targetPort", port["port"])
    if isinstance(target, int):
        return target if target in container.ports.values() else None
    return container.ports.get(target)


def _service_problems(services: list[dict], by_role: dict) -> list[str]:
    problems = []
    for service in services:
        where = f"Service/{service['metadata']['name']}"
        selected = _selected(service, by_role)
        if not selected:
            problems.append(f"{where}: selects no speculant Deployment's pods")
        for role, _, container in selected:
            ports = service["spec"].get("ports", [])
            targets = [_target(port, container) for port in ports]
            for port, target in zip(ports, targets, strict=True):
                if target is None:
                    problems.append(f"{where}: targetPort of {port} is no port of {role}")
                elif service["spec"].get("clusterIP") == "None" and port["port"] != target:
                    problems.append(f"{where}: headless port {port['port']} != target {target}")
            if container.args.port not in targets:
                problems.append(f"{where}: no port reaches {role} --port {container.args.port}")
    return problems


def _service_port(services: list[dict], address: str, role: str, by_role: dict) -> str | None:
    """Why address (HOST:PORT) does not reach the role's --port through a Service, or None."""
    host, port, _ = split_address(address)
    for service in services:
        if service["metadata"]["name"] != host:
            continue
        for selected_role, _, container in _selected(service, by_role):
            for service_port in service["spec"].get("ports", []):
                if (
                    selected_role == role
                    and service_port["port"] == port
                    and _target(service_port, container) == container.args.port
                ):
                    return None
        return f"Service/{host} port {port} does not reach {role} --port"
    return f"no Service named {host}"


def _gateway_problems(services: list[dict], by_role: dict) -> list[str]:
    gateway_doc, gateway = by_role["serve-gateway"][0]
    problems = []
    drafts = [a.strip() for a in gateway.args.draft.split(",") if a.strip()]
    headless = {s["metadata"]["name"] for s in services if s["spec"].get("clusterIP") == "None"}
    for address in drafts:
        host, _, is_dns = split_address(address)
        if not is_dns or host not in headless:
            problems.append(
                f"{gateway.where}: --draft {address} is not dns:<headless Service>:PORT"
            )
        why = _service_port(services, address, "serve-draft", by_role)
        if why:
            problems.append(f"{gateway.where}: --draft {address}: {why}")
    why = _service_port(services, gateway.args.verifier, "serve-verifier", by_role)
    if why:
        problems.append(f"{gateway.where}: --verifier {gateway.args.verifier}: {why}")
    for init in _pod_spec(gateway_doc).get("initContainers", []):
        for address in addresses_in(json.dumps(init.get("command", []))):
            if address.startswith("dns:") and address not in drafts:
                problems.append(f"init container {init['name']} waits for {address}, not --draft")
    return problems


def _hpa_problems(hpas: list[dict], draft_doc: dict) -> list[str]:
    name = draft_doc["metadata"]["name"]
    targeting = [h for h in hpas if h["spec"]["scaleTargetRef"].get("name") == name]
    problems = []
    for hpa in hpas:
        ref = hpa["spec"]["scaleTargetRef"]
        if hpa.get("apiVersion") != "autoscaling/v2":
            problems.append(
                f"{_name(hpa)}: apiVersion {hpa.get('apiVersion')}, want autoscaling/v2"
            )
        if ref.get("kind") != "Deployment" or ref.get("name") != name:
            problems.append(f"{_name(hpa)}: scales {ref}, not Deployment/{name}")
    if len(targeting) != 1:
        return [*problems, f"{len(targeting)} HorizontalPodAutoscalers scale Deployment/{name}"]
    if "replicas" in draft_doc["spec"]:
        problems.append(f"Deployment/{name}: sets replicas, which fights its HPA")
    cpu_metric = any(
        m.get("type") == "Resource" and m["resource"]["name"] == "cpu"
        for m in targeting[0]["spec"].get("metrics", [])
    )
    if cpu_metric:
        for spec in _pod_spec(draft_doc)["containers"]:
            if "cpu" not in spec.get("resources", {}).get("requests", {}):
                problems.append(f"Deployment/{name} {spec['name']}: CPU HPA needs requests.cpu")
    else:
        problems.append(f"{_name(targeting[0])}: no CPU metric")
    return problems


def _graph_volume_problems(draft_doc: dict, draft: Container, builds: list) -> list[str]:
    pod = _pod_spec(draft_doc)
    graph = default_graph(draft.args)
    mount = _mount_claim(pod, draft.spec, graph)
    if mount is None:
        return [f"{draft.where}: --graph {graph} is not on a PersistentVolumeClaim mount"]
    claim, read_only = mount
    problems = [] if read_only else [f"{draft.where}: the graph volume is not mounted readOnly"]
    writers = [
        (doc, c)
        for doc, c in builds
        if c.args.out == graph
        and _mount_claim(_pod_spec(doc), c.spec, c.args.out) == (claim, False)
    ]
    if not writers:
        problems.append(
            f"no Job builds --out {graph} on claim {claim} (writable) for the draft pods"
        )
    for init in pod.get("initContainers", []):
        if graph not in " ".join(init.get("command", [])):
            problems.append(
                f"{draft.where}: init container {init['name']} does not wait for {graph}"
            )
    return problems


# ---- docker compose ----------------------------------------------------------------------------
