"""Which files of gateway/, speculant/, draft_service/ and verifier_service/ run while one request
is served: one embedded ``generate``, one gRPC Generate across the three services, and one HTTP
completion. The services run in this process (the draft and verifier servers on free ports, the
gateway on both doors), so every Python call made during the request is recorded in all three;
the count is the issue's measure of how many rooms a reader walks through for one request.

    .venv/bin/python scripts/generate_path.py GRAPH MODEL

Background threads (the backend watcher) count when they run during the request.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PACKAGES = ("gateway", "speculant", "draft_service", "verifier_service")
PROMPT = "Once upon a time"

_state: dict[str, object] = {"on": False, "seen": Counter()}


def _profile(frame: object, event: str, _arg: object) -> None:
    if _state["on"] and event == "call":
        name = Path(frame.f_code.co_filename)  # type: ignore[attr-defined]
        parts = name.relative_to(ROOT).parts if name.is_relative_to(ROOT) else ()
        if parts and parts[0] in PACKAGES and "v1" not in parts:
            _state["seen"][str(Path(*parts))] += 1  # type: ignore[index]


def files_run(call: Callable[[], object]) -> list[str]:
    """The project files whose functions ran during call()."""
    _state["seen"] = seen = Counter()
    _state["on"] = True
    call()
    time.sleep(0.5)
    _state["on"] = False
    return sorted(seen)


def show(label: str, files: list[str]) -> None:
    lines = sum(len((ROOT / name).read_text(encoding="utf-8").splitlines()) for name in files)
    print(f"{label}: {len(files)} files, {lines} lines\n  " + "\n  ".join(files), flush=True)


def main(graph: str, model: str) -> None:
    threading.setprofile(_profile)  # before any server starts its threads
    sys.setprofile(_profile)
    import grpc

    from draft_service.server import start_server as start_draft
    from gateway.api.app import HttpApiServer
    from gateway.api.server import start_gateway
    from gateway.embedded import SpeculativeDecoder
    from speculant.config import GenerationConfig, VerifierConfig
    from speculant.v1 import gateway_pb2, gateway_pb2_grpc
    from verifier_service.server import start_server as start_verifier

    config = VerifierConfig(model_name=model, device="cpu")
    decoder = SpeculativeDecoder(graph, config, learn=False)
    generation = GenerationConfig(max_tokens=16, temperature=0)
    embedded = lambda: decoder.generate(PROMPT, generation_config=generation)  # noqa: E731
    embedded()  # warm: the kernels loaded, the tokenizer's caches filled
    show("embedded generate", files_run(embedded))

    draft = start_draft(graph, port=0)
    verifier, _ = start_verifier(config, port=0, verifier=decoder.verifier)
    server, engine = start_gateway([draft.address], verifier.address, port=0)
    http = HttpApiServer(engine).start()
    try:
        stub = gateway_pb2_grpc.GatewayServiceStub(grpc.insecure_channel(server.address))
        request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=16)
        body = json.dumps({"prompt": PROMPT, "max_tokens": 16}).encode()
        post = urllib.request.Request(
            f"{http.url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        for label, call in (
            ("gRPC Generate", lambda: stub.Generate(request, timeout=120)),
            ("HTTP /v1/completions", lambda: urllib.request.urlopen(post, timeout=120).read()),
        ):
            call()  # warm: the backends found, the streams open
            show(label, files_run(call))
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
        http.stop()
        server.stop(0)
        verifier.stop(0)
        draft.stop(0)


if __name__ == "__main__":
    main(*sys.argv[1:3])
