"""Checks of the compose files and the Dockerfile in deploy/ against the code."""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from tests.deploy_rules import (
    SERVE_COMMANDS,
    Container,
    addresses_in,
    default_graph,
    env_problems,
    listen_problems,
    missing_ports,
    parse_speculant,
    parsed,
    split_address,
)


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
        problems += parsed(container)
        if container.args is None:
            continue
        problems += missing_ports(container) + listen_problems(container)
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
    graph = default_graph(draft.args)
    graph_volume = _volume_of(draft.spec, graph)
    build_volume = _volume_of(build.spec, build.args.out)
    if build.args.out != graph or graph_volume is None or build_volume is None:
        problems.append(f"{file}: build --out {build.args.out} != draft --graph {graph}")
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
