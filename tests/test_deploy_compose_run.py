"""The compose file's commands, run: its health check one-liner against a real gRPC health
service, and (slow) every service's command as a local process, the system then generating."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import pytest

from speculant.grpc_server import ServiceServer
from speculant.ports import free_port
from tests.deploy_rules import REPO, Bundle


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


# ---- the compose commands, run as local processes ---------------------------------------------


def _localized(text: str, ports: dict[str, str], graphs: str) -> str:
    """A compose string with the image's paths, the service names and the ports of this host."""
    text = text.replace("/opt/speculant/demo", str(REPO / "demo")).replace("/graphs", graphs)
    text = text.replace("dns:draft:", "dns:127.0.0.1:").replace("verifier:", "127.0.0.1:")
    for old, new in ports.items():
        text = text.replace(old, new)
    return text


@dataclass
class LocalCompose:
    """The compose services (name -> service) run on this host: their strings localized with
    these ports (compose port -> free port here) and graphs folder."""

    services: dict[str, Any]
    ports: dict[str, str]
    graphs: str

    def command(self, name: str) -> tuple[list[str], dict[str, str]]:
        """The service's argv (after `speculant`) and environment."""
        service = self.services[name]
        argv = [_localized(str(a), self.ports, self.graphs) for a in service["command"]]
        if "--host" in argv:  # 0.0.0.0 in a container; loopback on a test machine
            argv[argv.index("--host") + 1] = "127.0.0.1"
        env = {k: str(v) for k, v in (service.get("environment") or {}).items() if v}
        return argv, {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **env}

    def healthy(self, name: str) -> bool:
        """Whether the service's health check passes."""
        healthcheck = self.services[name]["healthcheck"]["test"][1:]
        test = [_localized(a, self.ports, self.graphs) for a in healthcheck]
        _, env = self.command(name)
        test[0] = sys.executable  # the image's python
        return subprocess.run(test, env=env, timeout=60, capture_output=True).returncode == 0

    def start(self, name: str) -> subprocess.Popen:
        argv, env = self.command(name)
        return subprocess.Popen([sys.executable, "-m", "launcher.cli", *argv], env=env)

    def wait_healthy(self, name: str, process: subprocess.Popen) -> None:
        """Wait until the service is healthy, as compose's depends_on does before the next."""
        for _ in range(600):
            if self.healthy(name):
                return
            assert process.poll() is None, f"{name} exited"
            time.sleep(0.5)
        pytest.fail(f"{name} never became healthy")


def _generate_json(gateway: str, env: dict[str, str]) -> dict:
    """`speculant generate --json` of 16 greedy tokens on the gateway, parsed."""
    generated = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "generate",
            "--gateway",
            gateway,
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
    return json.loads(generated.stdout)


@pytest.mark.slow
def test_compose_commands_run_the_system(bundle: Bundle, tmp_path) -> None:
    """Each compose service's command and environment, with only paths, host names and ports
    changed, builds the graph, serves, passes its health check, and the gateway generates."""
    ports = {p: str(free_port()) for p in ("50050", "50051", "50052")}
    compose = LocalCompose(bundle.compose["services"], ports, str(tmp_path / "graphs"))
    argv, env = compose.command("build-graph")
    subprocess.run([sys.executable, "-m", "launcher.cli", *argv], env=env, check=True, timeout=600)
    processes = []
    try:
        for name in ("draft", "verifier", "gateway"):
            processes.append(compose.start(name))
            compose.wait_healthy(name, processes[-1])
        _, env = compose.command("gateway")
        generated = _generate_json(f"127.0.0.1:{ports['50050']}", env)
        assert generated["stats"]["generated_tokens"] == 16
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
