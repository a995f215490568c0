"""Backends that are down or stop answering: the gateway serves without its draft tier, fails
requests to a frozen verifier within a bounded time, and its health (gRPC and HTTP) says what it
can serve; a verifier killed mid-stream gets the client UNAVAILABLE quickly, never a hang, and
once it is back on its port the gateway serves again without a restart of its own. Real
services on loopback; the verifier a process of its own, to be SIGSTOPped or killed."""

from __future__ import annotations

import json
import signal
import time
import urllib.error
import urllib.request

import grpc
import pytest

from gateway.api.app import HttpApiServer
from gateway.api.server import start_gateway
from gateway.launch.baseline import PlainDecoder
from speculant.health import health_status
from speculant.ports import free_port, free_ports
from speculant.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.assets import STORIES_MODEL
from tests.processes import start_verifier_process

# A frozen verifier fails the requests waiting on it within this bound (the keepalive of
# speculant.grpc_server: a ping every 5 s, unanswered for 5 s), and a new request at once.
FROZEN_VERIFIER_BOUND_S = 20.0
HEALTH_FOLLOWS_WITHIN_S = 6.0  # the gateway's watcher checks every 1 s with a 2 s deadline
PROMPT = "Once upon a time"


def wait_for_health(address: str, status: str, within_s: float) -> float:
    """Seconds until the service at address reports `status` (fails after within_s)."""
    started = time.monotonic()
    while health_status(address) != status:
        assert time.monotonic() - started < within_s, f"{address} did not become {status}"
        time.sleep(0.1)
    return time.monotonic() - started


def http_health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture(scope="module")
def verifier_process():
    (port,) = free_ports(1)
    process = start_verifier_process(port)
    yield f"127.0.0.1:{port}", process
    process.send_signal(signal.SIGCONT)
    process.kill()
    process.wait(10)


def greedy_reference(prompt: str, max_tokens: int) -> list[int]:
    from speculant.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(STORIES_MODEL))
    plain = PlainDecoder.load(str(STORIES_MODEL), [tokenizer.eos_token_id])
    return plain.generate(tokenizer(prompt).input_ids, max_tokens).token_ids


def test_a_gateway_started_with_its_draft_tier_down_serves_exact_output(
    verifier_process, tinystories_graph
):
    from draft_service.server import start_server as start_draft

    verifier_address, _ = verifier_process
    (draft_port,) = free_ports(1)
    gateway, _ = start_gateway([f"127.0.0.1:{draft_port}"], verifier_address, port=0)
    draft = None
    try:
        assert health_status(gateway.address) == "SERVING"  # drafts are an optimisation
        fixed = common_pb2.DraftOptions(draft_size="fixed")  # every draft is verified
        request = gateway_pb2.GenerateRequest(
            prompt=PROMPT, max_tokens=48, temperature=0.0, draft=fixed
        )
        expected = greedy_reference(PROMPT, 48)
        with grpc.insecure_channel(gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            alone = stub.Generate(request, timeout=30)
            assert list(alone.token_ids) == expected
            assert alone.stats.draft_tokens == 0
            assert alone.stats.rounds == len(expected)  # one token per forward

            draft = start_draft(tinystories_graph, "127.0.0.1", draft_port)
            deadline = time.monotonic() + 10  # the gateway asks every second
            while True:
                drafted = stub.Generate(request, timeout=30)
                assert list(drafted.token_ids) == expected
                if drafted.stats.draft_tokens > 0:
                    break
                assert time.monotonic() < deadline, "the gateway never drafted"
                time.sleep(0.2)
            assert drafted.stats.rounds < len(expected)
    finally:
        gateway.stop(0)
        if draft is not None:
            draft.stop(0)


def test_a_frozen_verifier_fails_requests_in_bounded_time_and_health_says_so(
    verifier_process, tinystories_graph
):
    from draft_service.server import start_server as start_draft

    verifier_address, process = verifier_process
    draft = start_draft(tinystories_graph, port=0)
    gateway, servicer = start_gateway([draft.address], verifier_address, port=0)
    http = HttpApiServer(servicer).start()
    channel = grpc.insecure_channel(gateway.address)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    long_request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=480, temperature=0.0)
    try:
        assert http_health(http.url) == 200
        # No deadline of its own would do (the bound is the gateway's); 60 s keeps the test
        # bounded where the gateway has none.
        stream = stub.GenerateStream(long_request, timeout=60)
        next(stream)
        process.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            for _ in stream:
                pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - frozen_at < FROZEN_VERIFIER_BOUND_S
        wait_for_health(gateway.address, "NOT_SERVING", HEALTH_FOLLOWS_WITHIN_S)
        assert http_health(http.url) == 503
        body = json.dumps({"prompt": PROMPT, "max_tokens": 8}).encode()
        post = urllib.request.Request(f"{http.url}/generate", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as http_info:
            urllib.request.urlopen(post, timeout=FROZEN_VERIFIER_BOUND_S)
        assert http_info.value.code == 503
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:  # a new request
            stub.Generate(gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=8), timeout=60)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < FROZEN_VERIFIER_BOUND_S

        process.send_signal(signal.SIGCONT)
        wait_for_health(gateway.address, "SERVING", HEALTH_FOLLOWS_WITHIN_S)
        assert http_health(http.url) == 200
        response = stub.Generate(gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=8))
        assert len(response.token_ids) == 8
    finally:
        process.send_signal(signal.SIGCONT)
        channel.close()
        http.stop()
        gateway.stop(0)
        draft.stop(0)


def test_gateway_health_is_not_serving_while_its_verifier_is_down(tinystories_graph):
    from draft_service.server import start_server as start_draft

    draft = start_draft(tinystories_graph, port=0)
    (verifier_port,) = free_ports(1)
    gateway, servicer = start_gateway([draft.address], f"127.0.0.1:{verifier_port}", port=0)
    http = HttpApiServer(servicer).start()
    verifier = None
    try:
        assert health_status(gateway.address) == "NOT_SERVING"
        assert health_status(gateway.address, "liveness") == "SERVING"  # no restart would help
        assert http_health(http.url) == 503
        with grpc.insecure_channel(gateway.address) as channel:
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                gateway_pb2_grpc.GatewayServiceStub(channel).Generate(
                    gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=4), timeout=30
                )
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert time.monotonic() - started < 1.0  # refused at once
        verifier = start_verifier_process(verifier_port)
        wait_for_health(gateway.address, "SERVING", HEALTH_FOLLOWS_WITHIN_S)
        assert (
            json.loads(urllib.request.urlopen(f"{http.url}/health", timeout=5).read())["status"]
            == "ok"
        )
        verifier.kill()
        verifier.wait(10)
        wait_for_health(gateway.address, "NOT_SERVING", HEALTH_FOLLOWS_WITHIN_S)
    finally:
        http.stop()
        gateway.stop(0)
        draft.stop(0)
        if verifier is not None and verifier.poll() is None:
            verifier.kill()
            verifier.wait(10)


# -- a verifier killed mid-stream --------------------------------------------------------------


@pytest.fixture
def draft_address(tinystories_graph):
    from draft_service.server import start_server

    server = start_server(tinystories_graph, port=0)
    yield server.address
    server.stop(0)


def test_verifier_killed_mid_stream_then_back(draft_address):
    port = free_port()
    verifier = start_verifier_process(port)
    gateway, _ = start_gateway([draft_address], f"127.0.0.1:{port}", port=0)
    channel = grpc.insecure_channel(gateway.address)
    stub = gateway_pb2_grpc.GatewayServiceStub(channel)
    long_request = gateway_pb2.GenerateRequest(
        prompt="Once upon a time", max_tokens=480, temperature=0.0
    )
    try:
        stream = stub.GenerateStream(long_request, timeout=60)
        next(stream)
        verifier.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            for _ in stream:
                pass
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - killed_at < 2.0
        verifier.wait(10)

        verifier = start_verifier_process(port)
        request = gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=8)
        deadline = time.monotonic() + 15
        while True:
            try:
                response = stub.Generate(request, timeout=30)
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE
                assert time.monotonic() < deadline, "the gateway did not recover"
                time.sleep(0.1)
        assert len(response.token_ids) == 8
    finally:
        channel.close()
        gateway.stop(0)
        if verifier.poll() is None:
            verifier.kill()
            verifier.wait(10)
