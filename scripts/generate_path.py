"""Which files of gateway/ and speculant/ run while a gateway serves one Generate (gRPC) and one
completion (HTTP): the draft and verifier services run as child processes, the gateway in this
one, and every Python call made in the gateway's threads during the request is recorded.

    .venv/bin/python scripts/generate_path.py GRAPH MODEL

Background threads (the backend watcher) count when they run during the request.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from speculant.health import wait_until_serving  # noqa: E402
from speculant.ports import free_ports  # noqa: E402

_state: dict[str, object] = {"on": False, "seen": Counter()}


def _profile(frame: object, event: str, _arg: object) -> None:
    if _state["on"] and event == "call":
        name = Path(frame.f_code.co_filename)  # type: ignore[attr-defined]
        parts = name.relative_to(ROOT).parts if name.is_relative_to(ROOT) else ()
        if parts and parts[0] in ("gateway", "speculant") and "v1" not in parts:
            _state["seen"][str(Path(*parts))] += 1  # type: ignore[index]


def files_run(call: Callable[[], object]) -> list[str]:
    """The project files whose functions ran during call()."""
    _state["seen"] = seen = Counter()
    _state["on"] = True
    call()
    time.sleep(0.5)
    _state["on"] = False
    return sorted(seen)


def main(graph: str, model: str) -> None:
    draft_port, port_v = free_ports(2)
    serve = [sys.executable, "-m", "launcher.cli"]
    children = [
        subprocess.Popen([*serve, "serve-draft", "--graph", graph, "--port", str(draft_port)]),
        subprocess.Popen([*serve, "serve-verifier", "--model", model, "--port", f"{port_v}"]),
    ]
    try:
        for port in (draft_port, port_v):
            assert wait_until_serving(f"127.0.0.1:{port}", timeout_s=120)
        threading.setprofile(_profile)  # before the gateway starts its threads
        import grpc

        from gateway.api.app import HttpApiServer
        from gateway.api.server import start_gateway
        from speculant.v1 import gateway_pb2, gateway_pb2_grpc

        server, engine = start_gateway([f"127.0.0.1:{draft_port}"], f"127.0.0.1:{port_v}", port=0)
        http = HttpApiServer(engine).start()
        stub = gateway_pb2_grpc.GatewayServiceStub(grpc.insecure_channel(server.address))
        request = gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=16)
        stub.Generate(request, timeout=60)  # warm: the backends found, the tokenizer loaded
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 16}).encode()
        post = urllib.request.Request(
            f"{http.url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        for label, call in (
            ("gRPC Generate", lambda: stub.Generate(request, timeout=60)),
            ("HTTP /v1/completions", lambda: urllib.request.urlopen(post, timeout=60).read()),
        ):
            files = files_run(call)
            print(f"{label}: {len(files)} files\n  " + "\n  ".join(files))
        http.stop()
        server.stop(0)
    finally:
        for child in children:
            child.terminate()


if __name__ == "__main__":
    main(*sys.argv[1:3])
