"""Measure the figures of the reliability table in docs/benchmarks.md (loopback, bounded).

    .venv/bin/python scripts/measure_reliability.py --graph GRAPH --model MODEL [--json OUT]

Each scenario is the one its test checks (tests/test_capacity.py, test_backend_faults.py,
test_input_bounds.py, test_damaged_graphs.py), run with timings: health-check latencies under
open streams, after a burst and with generations in flight; the time a frozen (SIGSTOPped)
verifier takes to fail a request and to turn the gateway NOT_SERVING; how soon a gateway started
without its draft tier drafts once it is up; how long oversize inputs take to be refused; and
the draft service's answers around a truncation of its graph file. Prints one line per figure.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.server import start_gateway  # noqa: E402
from speculant.config import VerifierConfig  # noqa: E402
from speculant.health import health_status, wait_until_serving  # noqa: E402
from speculant.ports import free_port  # noqa: E402
from speculant.v1 import (  # noqa: E402
    common_pb2,
    draft_pb2,
    draft_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)

CONTEXT = [1, 403, 407, 261, 378, 432]
PROMPT = "Once upon a time"


def health_ms(address: str, checks: int = 10) -> float:
    """The slowest of `checks` health checks (1 s deadline; inf when one is unanswered), ms."""
    worst = 0.0
    for _ in range(checks):
        started = time.perf_counter()
        if health_status(address, timeout_s=1.0) == "UNREACHABLE":
            return float("inf")
        worst = max(worst, (time.perf_counter() - started) * 1e3)
        time.sleep(0.05)
    return worst


class SlowDrafter:
    def __init__(self, drafter, delay_s: float) -> None:
        self.drafter, self.delay_s = drafter, delay_s

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)

    def propose(self, *args, **kwargs):
        time.sleep(self.delay_s)
        return self.drafter.propose(*args, **kwargs)


def unread_streams(figures: dict, graph: str) -> None:
    from draft_service.server import start_server

    draft = start_server(graph, port=0)
    with grpc.insecure_channel(draft.address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        calls = []
        for _ in range(40):
            requests: queue.SimpleQueue = queue.SimpleQueue()
            requests.put(draft_pb2.ProposeRequest(context_token_ids=CONTEXT, k=4))
            calls.append(stub.ProposeStream(iter(requests.get, None)))
        time.sleep(0.5)
        figures["draft health with 40 unread streams, slowest of 10 (ms)"] = health_ms(
            draft.address
        )
        figures["streams refused at once of 40"] = sum(c.done() for c in calls)
        for call in calls:
            call.cancel()
    draft.stop(0)


def burst_and_load(figures: dict, graph: str, model: str) -> None:
    from draft_service.server import start_server as start_draft
    from verifier_service.server import start_server as start_verifier

    draft = start_draft(graph, port=0)
    verifier_server, verifier = start_verifier(VerifierConfig(model_name=model, device="cpu"))
    draft.servicer.drafter = SlowDrafter(draft.servicer.drafter, 0.02)
    first, _ = start_gateway([draft.address], verifier_server.address, port=0)
    codes: Counter = Counter()
    with grpc.insecure_channel(first.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)

        def one() -> None:
            try:
                stub.Generate(
                    gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=24), timeout=120
                )
                codes["OK"] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1

        threads = [threading.Thread(target=one) for _ in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    figures["burst of 100 Generate: codes"] = dict(codes)
    for name, address in (
        ("draft", draft.address),
        ("verifier", verifier_server.address),
        ("gateway", first.address),
    ):
        figures[f"{name} health after the burst, slowest of 10 (ms)"] = health_ms(address)
    second, _ = start_gateway([draft.address], verifier_server.address, port=0)
    with grpc.insecure_channel(second.address) as channel:
        response = gateway_pb2_grpc.GatewayServiceStub(channel).Generate(
            gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=24, temperature=0), timeout=30
        )
    figures["second gateway after the burst: draft tokens"] = response.stats.draft_tokens
    second.stop(0)
    first.stop(0)
    draft.servicer.drafter = draft.servicer.drafter.drafter

    # 64 generations in flight (the gateway's limit), health of the verifier meanwhile
    gateway, _ = start_gateway([draft.address], verifier_server.address, port=0)
    channel = grpc.insecure_channel(gateway.address)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    started = threading.Semaphore(0)
    streams = []

    def generate() -> None:
        stream = stub.GenerateStream(
            gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=2000), timeout=120
        )
        streams.append(stream)
        try:
            for i, _ in enumerate(stream):
                if i == 0:
                    started.release()
        except grpc.RpcError:
            pass

    threads = [threading.Thread(target=generate, daemon=True) for _ in range(64)]
    for thread in threads:
        thread.start()
    for _ in range(64):
        started.acquire(timeout=60)
    with grpc.insecure_channel(verifier_server.address) as vchannel:
        live = verifier_pb2_grpc.VerifierServiceStub(vchannel).GetStats(
            verifier_pb2.GetStatsRequest(), timeout=5
        )
    figures["generations in flight (verifier live sessions)"] = live.live_sessions
    figures["verifier health with 64 in flight, slowest of 10 (ms)"] = health_ms(
        verifier_server.address
    )
    figures["gateway health with 64 in flight, slowest of 10 (ms)"] = health_ms(gateway.address)
    for stream in list(streams):
        stream.cancel()
    for thread in threads:
        thread.join(10)
    channel.close()
    gateway.stop(0)
    verifier_server.stop(0)
    verifier.close()
    draft.stop(0)


def verifier_process(model: str, port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "speculant.cli", "serve-verifier", "--model", model),
            *("--port", str(port), "--torch-threads", "1", "--device", "cpu"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert wait_until_serving(f"127.0.0.1:{port}", timeout_s=120)
    return process


def frozen_verifier(figures: dict, graph: str, model: str, runs: int) -> None:
    from draft_service.server import start_server as start_draft

    port = free_port()
    process = verifier_process(model, port)
    draft = start_draft(graph, port=0)
    gateway, _ = start_gateway([draft.address], f"127.0.0.1:{port}", port=0)
    failed_after, not_serving_after = [], []
    with grpc.insecure_channel(gateway.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        for _ in range(runs):
            stream = stub.GenerateStream(
                gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=480), timeout=120
            )
            next(stream)
            process.send_signal(signal.SIGSTOP)
            frozen = time.monotonic()
            marked = None
            done = threading.Event()

            def watch(frozen: float = frozen, done: threading.Event = done) -> None:
                nonlocal marked
                while not done.is_set():
                    if health_status(gateway.address) == "NOT_SERVING":
                        marked = time.monotonic() - frozen
                        return
                    time.sleep(0.1)

            watcher = threading.Thread(target=watch)
            watcher.start()
            code = "OK"
            try:
                for _ in stream:
                    pass
            except grpc.RpcError as exc:
                code = exc.code().name
            failed_after.append((time.monotonic() - frozen, code))
            watcher.join(10)
            done.set()
            not_serving_after.append(marked)
            process.send_signal(signal.SIGCONT)
            assert wait_until_serving(gateway.address, timeout_s=30)
    figures["frozen verifier: stream failed after (s, code), per run"] = [
        (round(s, 2), c) for s, c in failed_after
    ]
    figures["frozen verifier: gateway NOT_SERVING after (s), per run"] = [
        None if s is None else round(s, 2) for s in not_serving_after
    ]
    gateway.stop(0)
    draft.stop(0)

    # a gateway started with its draft tier down, then the draft service starts
    draft_port = free_port()
    gateway, _ = start_gateway([f"127.0.0.1:{draft_port}"], f"127.0.0.1:{port}", port=0)
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
    process.kill()
    process.wait(10)


def oversize(figures: dict, graph: str, model: str) -> None:
    from draft_service.server import start_server as start_draft
    from verifier_service.server import start_server as start_verifier

    draft = start_draft(graph, port=0)
    verifier_server, verifier = start_verifier(VerifierConfig(model_name=model, device="cpu"))
    gateway, _ = start_gateway([draft.address], verifier_server.address, port=0)

    def refusal(call) -> tuple[str, float]:
        started = time.perf_counter()
        try:
            call()
            return "OK", time.perf_counter() - started
        except grpc.RpcError as exc:
            return exc.code().name, round((time.perf_counter() - started) * 1e3, 1)

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
        huge = draft_pb2.ProposeRequest(context_token_ids=[1, 403] * 1_000_000, overlay_weight=1)
        dstub = draft_pb2_grpc.DraftServiceStub(dc)
        figures["2,000,000-token Propose context (code, ms)"] = refusal(lambda: dstub.Propose(huge))
        prompt = gateway_pb2.GenerateRequest(prompt=PROMPT * 900_000, max_tokens=4)
        gstub = gateway_pb2_grpc.GatewayServiceStub(gc)
        figures["15 MB prompt (code, ms)"] = refusal(lambda: gstub.Generate(prompt))
    gateway.stop(0)
    verifier_server.stop(0)
    verifier.close()
    draft.stop(0)


def truncated_graph(figures: dict, graph: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="reliability-"))
    served = work / "graph"
    shutil.copytree(graph, served)
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "speculant.cli", "serve-draft", "--graph", str(served)),
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
                try:
                    stub.Propose(request, timeout=5)
                    codes["OK"] += 1
                except grpc.RpcError as exc:
                    codes[exc.code().name] += 1

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--freeze-runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    figures: dict = {}
    for step in (
        lambda: unread_streams(figures, args.graph),
        lambda: burst_and_load(figures, args.graph, args.model),
        lambda: frozen_verifier(figures, args.graph, args.model, args.freeze_runs),
        lambda: oversize(figures, args.graph, args.model),
        lambda: truncated_graph(figures, args.graph),
    ):
        step()
    for name, value in figures.items():
        print(f"{name}: {value}")
    frozen = [s for s, _ in figures["frozen verifier: stream failed after (s, code), per run"]]
    print(f"frozen verifier: median {statistics.median(frozen):.1f} s, max {max(frozen):.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
