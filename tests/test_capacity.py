"""Capacity under bursts: no pool of streams starves a service of its worker threads.

Each open stream (a gateway's ProposeStream to a draft service, a generation's Session stream to
the verifier) holds one worker thread of the service it calls. These tests open more streams
than a service has threads, or run as many generations as the gateway admits, and check that
every service still answers its health check, GetGraphInfo and other clients within 1 s, and
that a second gateway on the same draft tier serves with drafts. Real services on loopback.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.api.server import start_gateway
from speculant.v1 import (
    common_pb2,
    draft_pb2,
    draft_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    verifier_pb2,
)
from tests.fixtures.e2e import verifier_config

ANSWER_WITHIN_S = 1.0
CONTEXT = [1, 403, 407, 261, 378, 432]


def health(address: str) -> str:
    """The health status name of the service at address, asked with a 1 s deadline."""
    with grpc.insecure_channel(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=ANSWER_WITHIN_S
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


class SlowDrafter:
    """Wraps a Drafter: each proposal takes `delay_s` longer (a busy draft host)."""

    def __init__(self, drafter, delay_s: float) -> None:
        self.drafter = drafter
        self.delay_s = delay_s

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)

    def propose(self, *args, **kwargs):
        time.sleep(self.delay_s)
        return self.drafter.propose(*args, **kwargs)


@pytest.fixture
def draft_server(tinystories_graph):
    from draft_service.server import start_server

    server = start_server(tinystories_graph, port=0)  # default workers
    yield server
    server.stop(0)


@pytest.fixture
def verifier_service() -> Iterator[tuple[object, object]]:
    """(the verifier server, the LocalVerifier it serves)."""
    from verifier_service.server import start_server

    server, verifier = start_server(verifier_config(), port=0)  # default threads and caps
    yield server, verifier
    server.stop(0)
    verifier.close()


@pytest.fixture
def verifier_server(verifier_service) -> object:
    return verifier_service[0]


def open_unread_streams(stub: draft_pb2_grpc.DraftServiceStub, count: int) -> list:
    """`count` ProposeStreams that each send one request and are never read."""
    calls = []
    for _ in range(count):
        requests: queue.SimpleQueue = queue.SimpleQueue()
        requests.put(draft_pb2.ProposeRequest(context_token_ids=CONTEXT, k=4))
        calls.append(stub.ProposeStream(iter(requests.get, None)))
    return calls


def test_unread_streams_past_the_workers_leave_the_draft_service_answering(draft_server):
    with grpc.insecure_channel(draft_server.address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        calls = open_unread_streams(stub, 40)  # 5x the default 8 worker threads
        try:
            time.sleep(0.5)  # the server has taken every stream it will take
            assert health(draft_server.address) == "SERVING"
            stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=ANSWER_WITHIN_S)
            proposal = stub.Propose(
                draft_pb2.ProposeRequest(context_token_ids=CONTEXT, k=4), timeout=ANSWER_WITHIN_S
            )
            assert proposal.draft_token_ids
            # streams past the cap are refused at once, not queued for a thread
            refused = [c for c in calls if c.done()]
            assert refused
            assert {c.code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        finally:
            for call in calls:
                call.cancel()


class HeldStarts:
    """Wraps a verifier's `start` (a generation's prefill): each waits until `release()`, so
    the generations a gateway admits stay in flight until the test lets them go."""

    def __init__(self, verifier, wait_s: float) -> None:
        self._start = verifier.start
        self._released = threading.Event()
        self._wait_s = wait_s
        verifier.start = self

    def __call__(self, *args, **kwargs):
        self._released.wait(self._wait_s)
        return self._start(*args, **kwargs)

    def release(self) -> None:
        self._released.set()


def burst(
    stub: gateway_pb2_grpc.GatewayServiceStub,
    count: int,
    max_tokens: int,
    on_refusals: tuple[int, Callable[[], None]],
) -> Counter:
    """`count` concurrent Generate calls; their status codes. on_refusals: (n, call), call() is
    called once n of them have been refused as over capacity."""
    codes: Counter = Counter()
    lock = threading.Lock()
    start = threading.Barrier(count)  # every call sent at once, however slowly threads start
    refusals, call = on_refusals

    def one() -> None:
        request = gateway_pb2.GenerateRequest(
            prompt="Once upon a time", max_tokens=max_tokens, temperature=0.0
        )
        start.wait()
        try:
            stub.Generate(request, timeout=120)
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name
        with lock:
            codes[code] += 1
            if code == "RESOURCE_EXHAUSTED" and codes[code] == refusals:
                call()

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return codes


def test_after_a_burst_past_the_limit_every_service_answers_and_a_second_gateway_serves(
    draft_server, verifier_service
):
    verifier_server, verifier = verifier_service
    # A busy draft host (20 ms a proposal): the gateway's generations wait on drafts at once.
    draft_server.servicer.drafter = SlowDrafter(draft_server.servicer.drafter, 0.02)
    # The gateway admits 64 (its default limit): those wait in their prefill until the other 36
    # have been refused, so none ends (and frees its slot) while calls are still arriving,
    # however slowly a busy machine sends them. (A gateway that admitted more would never
    # refuse 36: the held prefills then go on after 30 s and the counts show it.)
    held = HeldStarts(verifier, wait_s=30)
    first, _ = start_gateway([draft_server.address], verifier_server.address, port=0)
    second = None
    try:
        with grpc.insecure_channel(first.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            codes = burst(stub, 100, max_tokens=24, on_refusals=(36, held.release))
        assert codes == {"OK": 64, "RESOURCE_EXHAUSTED": 36}, codes
        for address in (draft_server.address, verifier_server.address, first.address):
            assert health(address) == "SERVING", address
        with grpc.insecure_channel(draft_server.address) as channel:
            draft_pb2_grpc.DraftServiceStub(channel).GetGraphInfo(
                draft_pb2.GetGraphInfoRequest(), timeout=ANSWER_WITHIN_S
            )
        second, _ = start_gateway([draft_server.address], verifier_server.address, port=0)
        with grpc.insecure_channel(second.address) as channel:
            response = gateway_pb2_grpc.GatewayServiceStub(channel).Generate(
                gateway_pb2.GenerateRequest(
                    prompt="Once upon a time",
                    max_tokens=24,
                    temperature=0.0,
                    # every draft verified: cost-aware sizes may skip drafts this slow
                    draft=common_pb2.DraftOptions(draft_size="fixed"),
                ),
                timeout=30,
            )
        assert response.stats.draft_tokens > 0  # the draft tier serves the second gateway
    finally:
        first.stop(0)
        if second is not None:
            second.stop(0)


def test_with_generations_in_flight_up_to_the_limit_the_verifier_answers(
    draft_server, verifier_server
):
    gateway, _ = start_gateway([draft_server.address], verifier_server.address, port=0)
    admitted = 64  # the gateway's default limit, the verifier's default session cap
    started = threading.Semaphore(0)
    stop = threading.Event()
    channel = grpc.insecure_channel(gateway.address)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    streams = []

    def generate() -> None:
        stream = stub.GenerateStream(
            gateway_pb2.GenerateRequest(
                prompt="Once upon a time", max_tokens=2000, temperature=0.0
            ),
            timeout=120,
        )
        streams.append(stream)
        try:
            for i, _ in enumerate(stream):
                if i == 0:
                    started.release()
                if stop.is_set():
                    break
        except grpc.RpcError:
            pass

    threads = [threading.Thread(target=generate, daemon=True) for _ in range(admitted)]
    try:
        for thread in threads:
            thread.start()
        for _ in range(16):  # as many generations as the verifier used to have threads
            assert started.acquire(timeout=60)
        time.sleep(0.5)
        assert health(verifier_server.address) == "SERVING"
        with grpc.insecure_channel(verifier_server.address) as verifier_channel:
            from speculant.v1 import verifier_pb2_grpc

            verifier = verifier_pb2_grpc.VerifierServiceStub(verifier_channel)
            verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=ANSWER_WITHIN_S)
            for _ in range(admitted - 16):  # every admitted generation runs
                assert started.acquire(timeout=60)
            assert health(verifier_server.address) == "SERVING"
            assert health(gateway.address) == "SERVING"
            stats = verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=ANSWER_WITHIN_S)
            assert stats.live_sessions == admitted
    finally:
        stop.set()
        for stream in list(streams):
            stream.cancel()
        for thread in threads:
            thread.join(10)
        channel.close()
        gateway.stop(0)


class FakeExchange:
    """Stands in for a StreamExchange in the pool's bookkeeping tests."""

    def __init__(self) -> None:
        self.closed = self.cancelled = False
        self.responses = 0

    def close(self, wait_s: float = 0.0) -> None:
        self.closed = True

    def cancel(self) -> None:
        self.cancelled = True


def test_stream_pool_reuses_the_latest_stream_and_closes_idle_ones():
    from gateway.backends import StreamPool

    pool = StreamPool(FakeExchange, idle_s=5.0)
    a, b = pool.checkout(), pool.checkout()
    pool.checkin(a)
    pool.checkin(b)
    assert pool.checkout() is b  # the most recently returned first
    pool.checkin(b)
    assert pool.open_streams == 2
    assert pool.trim(now=time.monotonic() + 6.0) == 2
    assert a.closed and b.closed and pool.open_streams == 0


def test_stream_pool_opens_no_stream_past_a_refusal_until_the_retry_time():
    from gateway.backends import StreamPool

    pool = StreamPool(FakeExchange, refused_retry_s=0.2)
    held = pool.checkout()
    refused = pool.checkout()
    pool.refused(refused)  # the service took one stream from this pool, not two
    assert pool.checkout() is None  # callers use a unary call
    pool.checkin(held)
    assert pool.checkout() is held  # the accepted stream is still used
    time.sleep(0.25)
    assert pool.checkout() is not None  # tries a new stream again
