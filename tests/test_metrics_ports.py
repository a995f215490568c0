"""The metrics port flags: `speculant serve-draft --metrics-port` serves Prometheus metrics (and
logs JSON with --log-format json), a taken metrics port is a clean error, and `speculant up`
gives each service its own port from --metrics-port-base."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from speculant.health import wait_until_serving
from speculant.ports import free_port
from tests.assets import ROOT
from tests.metric_samples import calls, scrape


def _speculant(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "launcher.cli", *args],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_serve_draft_metrics_port_and_json_logs(tinystories_graph):
    grpc_port, metrics_port = free_port(), free_port()
    process = _speculant(
        "serve-draft",
        "--graph",
        str(tinystories_graph),
        "--port",
        str(grpc_port),
        "--metrics-port",
        str(metrics_port),
        "--log-format",
        "json",
    )
    try:
        assert wait_until_serving(f"127.0.0.1:{grpc_port}", timeout_s=60)
        samples = scrape(metrics_port)
        assert calls(samples, "grpc.health.v1.Health", "Check", "OK") >= 1
        assert ("speculant_draft_graph_readers", ()) in samples
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    records = [json.loads(line) for line in stderr.splitlines()]
    messages = [r["message"] for r in records]
    assert any(m.startswith("metrics at http://127.0.0.1:") for m in messages), messages
    assert any(m.startswith("draft service serving") for m in messages), messages


def test_serve_draft_metrics_port_in_use(tinystories_graph):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = _speculant(
            "serve-draft", "--graph", str(tinystories_graph), "--port", "0",
            "--metrics-port", str(port),
        )  # fmt: skip
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "speculant serve-draft: error: cannot serve metrics on 127.0.0.1:" in stderr
    assert "Traceback" not in stderr


def test_up_gives_each_service_its_metrics_port():
    from gateway.launch.up_plan import plan_up, service_parser
    from launcher.cli import build_parser

    def observability(*extra: str) -> dict[str, tuple[str, int | None]]:
        """Each child's --log-format and --metrics-port, as its own service parses them."""
        args = build_parser().parse_args(["up", "--graph", "g", "--model", "m", *extra])
        children = {c.name: service_parser().parse_args(c.argv) for c in plan_up(args).children}
        return {name: (a.log_format, a.metrics_port) for name, a in children.items()}

    assert observability("--metrics-port-base", "9100", "--log-format", "json") == {
        "gateway": ("json", 9100),
        "draft": ("json", 9101),
        "verifier": ("json", 9102),
    }
    assert observability() == {name: ("text", None) for name in ("gateway", "draft", "verifier")}
