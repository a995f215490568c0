"""The scenarios of scripts/measure_reliability.py with a fault: a frozen (SIGSTOPped) verifier,
a gateway started without its draft tier, oversize inputs, and a graph file truncated under
load (tests/test_backend_faults.py, test_input_bounds.py and test_damaged_graphs.py check each).

Imported by scripts/measure_reliability.py, which puts the repository root on sys.path first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
from reliability_common import CONTEXT, PROMPT, draft_and_verifier, rpc_code

from gateway.api.server import start_gateway
from speculant.health import health_status, wait_until_serving
from speculant.ports import free_port
from speculant.v1 import (
    common_pb2,
    draft_pb2,
    draft_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)


def verifier_process(model: str, port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "launcher.cli", "serve-verifier", "--model", model),
            *("--port", str(port), "--torch-threads", "1", "--device", "cpu"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert wait_until_serving(f"127.0.0.1:{port}", timeout_s=120)
    return process


def frozen_verifier(figures: dict, graph: str, model: str, runs: int) -> None:
    """A verifier service in a child process, frozen under a gateway's stream `runs` times;
    then a gateway started before its draft tier."""
    port = free_port()
    process = verifier_process(model, port)
    frozen_runs(figures, graph, process, f"127.0.0.1:{port}", runs)
    draft_tier_down(figures, graph, f"127.0.0.1:{port}")
    process.kill()
    process.wait(10)


def frozen_runs(
    figures: dict, graph: str, process: subprocess.Popen, verifier: str, runs: int
) -> None:
    """Per run: the seconds until a stream fails after its verifier is frozen (and its code),
    and until the gateway reports NOT_SERVING."""
    from draft_service.server import start_server as start_draft

    draft = start_draft(graph, port=0)
    gateway, _ = start_gateway([draft.address], verifier, port=0)
    failed_after, not_serving_after = [], []
    with grpc.insecure_channel(gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        for _ in range(runs):
            failed, code, marked = freeze_once(stub, process, gateway.address)
            failed_after.append((failed, code))
            not_serving_after.append(marked)
    figures["frozen verifier: stream failed after (s, code), per run"] = [
        (round(s, 2), c) for s, c in failed_after
    ]
    figures["frozen verifier: gateway NOT_SERVING after (s), per run"] = [
        None if s is None else round(s, 2) for s in not_serving_after
    ]
    gateway.stop(0)
    draft.stop(0)


def freeze_once(
    stub: Any, process: subprocess.Popen, gateway: str
) -> tuple[float, str, float | None]:
    """Freeze the verifier process once a stream has its first chunk: (seconds until the stream
    ends, its code, seconds until the gateway reports NOT_SERVING or None); then thaw it."""
    stream = stub.GenerateStream(
        gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=480), timeout=120
    )
    next(stream)
    process.send_signal(signal.SIGSTOP)
    frozen = time.monotonic()
    marked = None
    done = threading.Event()

    def watch() -> None:
        nonlocal marked
        while not done.is_set():
            if health_status(gateway) == "NOT_SERVING":
                marked = time.monotonic() - frozen
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    code = rpc_code(lambda: list(stream))
    failed = time.monotonic() - frozen
    watcher.join(10)
    done.set()
    not_serving = marked
    process.send_signal(signal.SIGCONT)
    assert wait_until_serving(gateway, timeout_s=30)
    return failed, code, not_serving


def draft_tier_down(figures: dict, graph: str, verifier: str) -> None:
    """A gateway started with its draft tier down, then the draft service starts: the rounds
    and tokens without drafts, and how soon the gateway drafts once the service is up."""
    from draft_service.server import start_server as start_draft

    draft_port = free_port()
    gateway, _ = start_gateway([f"127.0.0.1:{draft_port}"], verifier, port=0)
    with grpc.insecure_channel(gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=48, temperature=0)
        alone = stub.Generate(request, timeout=30)
        draft = start_draft(graph, "127.0.0.1", draft_port)
        up = time.monotonic()
        while stub.Generate(request, timeout=30).stats.draft_tokens == 0:
            time.sleep(0.05)
        figures["draft tier down at start: verifier-only rounds / tokens"] = (
            alone.stats.rounds,
            len(alone.token_ids),
        )
        figures["draft tier down at start: drafting after it is up (s)"] = round(
            time.monotonic() - up, 2
        )
    gateway.stop(0)
    draft.stop(0)


def refusal(call) -> tuple[str, float]:
    """("OK", seconds) when call() returns, else (its code, milliseconds until refused)."""
    started = time.perf_counter()
    try:
        call()
        return "OK", time.perf_counter() - started
    except grpc.RpcError as exc:
        return exc.code().name, round((time.perf_counter() - started) * 1e3, 1)


def oversize(figures: dict, graph: str, model: str) -> None:
    with draft_and_verifier(graph, model) as (draft, verifier_server):
        gateway, _ = start_gateway([draft.address], verifier_server.address, port=0)
        with (
            grpc.insecure_channel(verifier_server.address) as vc,
            grpc.insecure_channel(draft.address) as dc,
            grpc.insecure_channel(gateway.address) as gc,
        ):
            vstub = verifier_pb2_grpc.VerifierServiceStub(vc)
            session = vstub.Prefill(
                verifier_pb2.PrefillRequest(prompt_token_ids=[1, 403], temperature=0), timeout=10
            ).session_id
            tree = verifier_pb2.VerifyRequest(
                session_id=session,
                draft_token_ids=[5] * 12_000,
                draft_parents=[-1] * 12_000,
                draft_distributions=[
                    common_pb2.SparseDistribution(token_ids=[5], probs=[1.0]) for _ in range(12_000)
                ],
            )
            figures["12,000-node draft tree (code, ms)"] = refusal(lambda: vstub.Verify(tree))
            huge = draft_pb2.ProposeRequest(
                context_token_ids=[1, 403] * 1_000_000, overlay_weight=1
            )
            dstub = draft_pb2_grpc.DraftServiceStub(dc)
            figures["2,000,000-token Propose context (code, ms)"] = refusal(
                lambda: dstub.Propose(huge)
            )
            prompt = gateway_pb2.GenerateRequest(prompt=PROMPT * 900_000, max_tokens=4)
            gstub = gateway_pb2_grpc.GatewayServiceStub(gc)
            figures["15 MB prompt (code, ms)"] = refusal(lambda: gstub.Generate(prompt))
        gateway.stop(0)


def truncated_graph(figures: dict, graph: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="reliability-"))
    served = work / "graph"
    shutil.copytree(graph, served)
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "launcher.cli", "serve-draft", "--graph", str(served)),
            *("--port", str(port), "--reload-interval", "0.2"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    address = f"127.0.0.1:{port}"
    assert wait_until_serving(address, timeout_s=60)
    codes: Counter = Counter()
    stop = threading.Event()

    def hammer(offset: int) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            i = offset
            while not stop.is_set():
                i += 1
                request = draft_pb2.ProposeRequest(
                    context_token_ids=[*CONTEXT[:-2], 300 + i % 200, 400 - i % 300], k=8
                )
                codes[rpc_code(lambda request=request: stub.Propose(request, timeout=5))] += 1

    threads = [threading.Thread(target=hammer, args=(n * 1000,)) for n in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    before = dict(codes)
    os.truncate(served / "data.mdb", 8192)
    truncated = time.monotonic()
    while health_status(address) != "NOT_SERVING" and time.monotonic() - truncated < 10:
        time.sleep(0.01)
    figures["truncated under load: NOT_SERVING after (s)"] = round(time.monotonic() - truncated, 3)
    time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join()
    after = {k: v - before.get(k, 0) for k, v in codes.items()}
    figures["truncated under load: answers before / after"] = (before, after)
    figures["truncated under load: draft service alive"] = process.poll() is None
    process.kill()
    process.wait(10)
    shutil.rmtree(work, ignore_errors=True)
