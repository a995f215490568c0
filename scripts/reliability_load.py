"""The scenarios of scripts/measure_reliability.py under load: health-check latencies of a draft
service with unread streams, of every service after a burst of requests, and of the verifier
and gateway with generations in flight (tests/test_capacity.py checks each).

Imported by scripts/measure_reliability.py, which puts the repository root on sys.path first.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from typing import Any

import grpc
from reliability_common import CONTEXT, PROMPT, draft_and_verifier, health_ms, rpc_code

from bench.load import verifier_sessions
from gateway.api.server import start_gateway
from speculant.v1 import draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc


class SlowDrafter:
    """A drafter that sleeps delay_s before each proposal (the rest: the drafter's own)."""

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
    """A burst of requests, then generations in flight, on one draft and verifier service."""
    with draft_and_verifier(graph, model) as (draft, verifier_server):
        burst(figures, draft, verifier_server.address)
        in_flight(figures, draft.address, verifier_server.address)


def burst(figures: dict, draft: Any, verifier: str) -> None:
    """100 Generate calls at once through a gateway whose drafts take 20 ms: their codes, every
    service's health after them, and whether a second gateway then drafts."""
    draft.servicer.drafter = SlowDrafter(draft.servicer.drafter, 0.02)
    first, _ = start_gateway([draft.address], verifier, port=0)
    codes: Counter = Counter()
    with grpc.insecure_channel(first.address) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=24)

        def one() -> None:
            codes[rpc_code(lambda: stub.Generate(request, timeout=120))] += 1

        threads = [threading.Thread(target=one) for _ in range(100)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    figures["burst of 100 Generate: codes"] = dict(codes)
    for name, address in (
        ("draft", draft.address),
        ("verifier", verifier),
        ("gateway", first.address),
    ):
        figures[f"{name} health after the burst, slowest of 10 (ms)"] = health_ms(address)
    second, _ = start_gateway([draft.address], verifier, port=0)
    with grpc.insecure_channel(second.address) as channel:
        response = gateway_pb2_grpc.GatewayServiceStub(channel).Generate(
            gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=24, temperature=0), timeout=30
        )
    figures["second gateway after the burst: draft tokens"] = response.stats.draft_tokens
    second.stop(0)
    first.stop(0)
    draft.servicer.drafter = draft.servicer.drafter.drafter


def in_flight(figures: dict, draft: str, verifier: str) -> None:
    """64 generations in flight (the gateway's limit): the verifier's live sessions, and the
    verifier's and the gateway's health meanwhile."""
    gateway, _ = start_gateway([draft], verifier, port=0)
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
    live = verifier_sessions(verifier)["live"]
    figures["generations in flight (verifier live sessions)"] = live
    figures["verifier health with 64 in flight, slowest of 10 (ms)"] = health_ms(verifier)
    figures["gateway health with 64 in flight, slowest of 10 (ms)"] = health_ms(gateway.address)
    for stream in list(streams):
        stream.cancel()
    for thread in threads:
        thread.join(10)
    channel.close()
    gateway.stop(0)
