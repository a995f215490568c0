"""Checks of deploy/ (Dockerfile, compose files, Kubernetes manifests) against the code.

A *bundle* is everything in deploy/, parsed (YAML with ``yaml.safe_load_all``, the Dockerfile as
text). :func:`check_bundle` returns a list of *problems*, one line each, naming the file and
object; an empty list means the manifests agree with the code. Every container that runs
``speculant`` has its arguments parsed by :func:`speculant.cli.build_parser`, so an unknown flag
or a bad value is a problem, and the ports, probes, addresses, paths and environment variable
names are compared across files. Tests mutate a loaded bundle to show each check can fail.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from speculant.auth import TOKEN_ENV
from speculant.cli import build_parser
from speculant.config import SpeculantSettings

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


def check_bundle(bundle: Bundle) -> list[str]:
    """Every problem found in the bundle (empty: all consistent with the code)."""
    problems = check_kustomization(bundle)
    problems += check_k8s(bundle.k8s)
    problems += check_compose(bundle.compose, "docker-compose.yml")
    problems += check_compose(merge_compose(bundle.compose, bundle.compose_gpu), "compose+gpu")
    problems += check_compose_gpu(bundle.compose, bundle.compose_gpu)
    serve_ports = {c.args.port for c in speculant_containers(bundle) if c.command in SERVE_COMMANDS}
    problems += check_dockerfile(bundle.dockerfile, serve_ports)
    return problems


def speculant_containers(bundle: Bundle) -> list[Container]:
    """Every container of the bundle that runs speculant (k8s and both compose views)."""
    containers = [c for _, _, pod_containers in k8s_pods(bundle.k8s) for c in pod_containers]
    containers += compose_containers(bundle.compose, "docker-compose.yml")
    containers += compose_containers(
        merge_compose(bundle.compose, bundle.compose_gpu), "compose+gpu"
    )
    containers = [c for c in containers if c.argv is not None]
    for container in containers:
        _parsed(container)
    return containers


# ---- shared rules ----------------------------------------------------------------------------


def parse_speculant(argv: list[str]) -> tuple[argparse.Namespace | None, str | None]:
    """(namespace, None), or (None, argparse's error line) for arguments speculant refuses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return build_parser().parse_args(argv), None
    except SystemExit:
        lines = err.getvalue().strip().splitlines()
        return None, lines[-1] if lines else "exited while parsing"


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


def _parsed(container: Container) -> list[str]:
    """Parse container.argv into container.args; the parse error as a problem."""
    if container.argv is None:
        return []
    container.args, error = parse_speculant(container.argv)
    return [] if error is None else [f"{container.where}: speculant {container.argv}: {error}"]


def _listen_problems(container: Container) -> list[str]:
    if container.command in SERVE_COMMANDS and container.args.host != "0.0.0.0":
        return [
            f"{container.where}: --host {container.args.host} (a container must listen on 0.0.0.0)"
        ]
    return []


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
    problems = _parsed(container)
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
    problems += missing_ports(container) + _listen_problems(container)
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
    graph = draft.args.graph
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


def merge_compose(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """The override's services merged over the base's (keys replaced, as for command)."""
    merged = {**base, "services": {k: dict(v) for k, v in base["services"].items()}}
    for name, service in override.get("services", {}).items():
        merged["services"].setdefault(name, {}).update(service)
    return merged


def _compose_env(service: dict[str, Any]) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = [item.partition("=") for item in env]
        return {name: value if sep else None for name, sep, value in pairs}
    return {name: None if value is None else str(value) for name, value in env.items()}


def _compose_ports(service: dict[str, Any]) -> dict[str, int]:
    ports: dict[str, int] = {}
    for item in [*service.get("expose", []), *service.get("ports", [])]:
        if isinstance(item, dict):
            target = int(item["target"])
        else:
            target = int(str(item).rsplit(":", 1)[-1].split("/")[0])
        ports[str(target)] = target
    return ports


def compose_containers(compose: dict[str, Any], file: str) -> list[Container]:
    containers = []
    for name, service in compose["services"].items():
        command = service.get("command", [])
        if isinstance(command, str):
            command = shlex.split(command)
        argv = None if "entrypoint" in service else [str(a) for a in command]
        containers.append(
            Container(
                where=f"{file} service {name}",
                spec=service,
                argv=argv,
                ports=_compose_ports(service),
                env=_compose_env(service),
            )
        )
    return containers


def _healthcheck_problems(container: Container) -> list[str]:
    test = container.spec.get("healthcheck", {}).get("test")
    if not isinstance(test, list) or test[:1] != ["CMD"]:
        return [f"{container.where}: healthcheck.test must be a CMD list"]
    addresses = addresses_in(" ".join(test[1:]))
    want = f"127.0.0.1:{container.args.port}"
    if addresses != [want]:
        return [f"{container.where}: healthcheck checks {addresses}, want [{want!r}]"]
    return []


def _volume_of(service: dict[str, Any], path: str) -> tuple[str, bool] | None:
    """(named volume, read-only) mounted where path is, or None."""
    for item in service.get("volumes", []):
        source, target, *mode = str(item).split(":")
        if path.startswith(target.rstrip("/") + "/"):
            return source, mode == ["ro"]
    return None


def check_compose(compose: dict[str, Any], file: str) -> list[str]:
    problems = []
    containers = compose_containers(compose, file)
    by_name = {c.where.rsplit(" ", 1)[-1]: c for c in containers}
    for container in containers:
        for name, value in container.env.items():
            problems += env_problems(name, value, container.where)
        problems += _parsed(container)
        if container.args is None:
            continue
        problems += missing_ports(container) + _listen_problems(container)
        if container.command in SERVE_COMMANDS:
            problems += _healthcheck_problems(container)
    roles = {c.command: name for name, c in by_name.items() if c.args is not None}
    missing = [role for role in (*SERVE_COMMANDS, "build") if role not in roles]
    if missing:
        return [*problems, f"{file}: no service runs {', '.join(missing)}"]
    draft, verifier, gateway = (by_name[roles[r]] for r in SERVE_COMMANDS)
    build = by_name[roles["build"]]
    wants = {
        (roles["serve-draft"], roles["build"]): "service_completed_successfully",
        (roles["serve-gateway"], roles["serve-draft"]): "service_healthy",
        (roles["serve-gateway"], roles["serve-verifier"]): "service_healthy",
    }
    for (service, dependency), condition in wants.items():
        got = by_name[service].spec.get("depends_on", {}).get(dependency, {}).get("condition")
        if got != condition:
            problems.append(f"{file}: {service} depends_on {dependency}: {got}, want {condition}")
    drafts = [a.strip() for a in gateway.args.draft.split(",") if a.strip()]
    for address in drafts:
        host, port, is_dns = split_address(address)
        if not is_dns or host != roles["serve-draft"] or port != draft.args.port:
            problems.append(
                f"{gateway.where}: --draft {address}, want dns:{roles['serve-draft']}:"
                f"{draft.args.port}"
            )
    host, port, _ = split_address(gateway.args.verifier)
    if host != roles["serve-verifier"] or port != verifier.args.port:
        problems.append(
            f"{gateway.where}: --verifier {gateway.args.verifier}, want "
            f"{roles['serve-verifier']}:{verifier.args.port}"
        )
    graph_volume = _volume_of(draft.spec, draft.args.graph)
    build_volume = _volume_of(build.spec, build.args.out)
    if build.args.out != draft.args.graph or graph_volume is None or build_volume is None:
        problems.append(f"{file}: build --out {build.args.out} != draft --graph {draft.args.graph}")
    elif graph_volume[0] != build_volume[0] or build_volume[1]:
        problems.append(f"{file}: build and draft do not share the writable volume of the graph")
    elif not graph_volume[1]:
        problems.append(f"{draft.where}: the graph volume is not mounted :ro")
    return problems


def check_compose_gpu(base: dict[str, Any], override: dict[str, Any]) -> list[str]:
    """The GPU override gives the verifier service an NVIDIA device and a CUDA-torch image."""
    services = override.get("services", {})
    verifiers = [
        c
        for c in compose_containers(merge_compose(base, override), "compose+gpu")
        if c.argv is not None
        and parse_speculant(c.argv)[0] is not None
        and parse_speculant(c.argv)[0].command == "serve-verifier"
    ]
    problems = [
        f"docker-compose.gpu.yml: service {n} is not in the base file"
        for n in services
        if n not in base["services"]
    ]
    for verifier in verifiers:
        name = verifier.where.rsplit(" ", 1)[-1]
        override_service = services.get(name, {})
        devices = (
            override_service.get("deploy", {})
            .get("resources", {})
            .get("reservations", {})
            .get("devices", [])
        )
        if not any(
            d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices
        ):
            problems.append(f"docker-compose.gpu.yml: {name} reserves no NVIDIA GPU")
        args = override_service.get("build", {}).get("args", {})
        if "TORCH_INDEX_URL" not in args:
            problems.append(f"docker-compose.gpu.yml: {name} does not choose TORCH_INDEX_URL")
        if override_service.get("image") == base["services"][name].get("image"):
            problems.append(f"docker-compose.gpu.yml: {name} reuses the CPU image's name")
    return problems


# ---- Dockerfile --------------------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") or not stripped:
            continue
        pending += " " + stripped.removesuffix("\\").strip()
        if stripped.endswith("\\"):
            continue
        instruction, _, rest = pending.strip().partition(" ")
        out.append((instruction.upper(), rest.strip()))
        pending = ""
    return out


def check_dockerfile(text: str, serve_ports: set[int]) -> list[str]:
    steps = dockerfile_instructions(text)
    problems = []
    first = next((rest for ins, rest in steps if ins == "FROM"), None)
    if first != "python:3.11-slim":
        problems.append(f"Dockerfile: FROM {first}, want python:3.11-slim")
    entry = [rest for ins, rest in steps if ins == "ENTRYPOINT"]
    if [json.loads(e) if e.startswith("[") else e for e in entry] != [["speculant"]]:
        problems.append(f'Dockerfile: ENTRYPOINT {entry}, want ["speculant"]')
    copies = [rest for ins, rest in steps if ins == "COPY"]
    if not any(c.split()[0] == "constraints.txt" for c in copies):
        problems.append("Dockerfile: constraints.txt is not copied in")
    runs = [rest for ins, rest in steps if ins == "RUN"]
    installs = [r for r in runs if "pip install" in r and re.search(r'\s"?\.(\$\{|\s|"|$)', r)]
    if not installs or not all("-c constraints.txt" in r for r in installs):
        problems.append("Dockerfile: the project is not installed with -c constraints.txt")
    args = {rest.split("=")[0] for ins, rest in steps if ins == "ARG"}
    if "TORCH_INDEX_URL" not in args or not any(
        '--index-url "$TORCH_INDEX_URL"' in r for r in runs
    ):
        problems.append("Dockerfile: torch's wheel index is not chosen by ARG TORCH_INDEX_URL")
    exposed = {int(p.split("/")[0]) for ins, rest in steps if ins == "EXPOSE" for p in rest.split()}
    if not serve_ports <= exposed:
        problems.append(
            f"Dockerfile: EXPOSE {sorted(exposed)} misses {sorted(serve_ports - exposed)}"
        )
    for ins, rest in steps:
        if ins == "ENV":
            for name in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=", rest):
                problems += env_problems(name, None, "Dockerfile ENV")
    return problems
