"""Cancellation, deadlines and overload at the gateway, over real services on localhost."""

from __future__ import annotations

import time

import grpc
import pytest

from gateway.api.server import start_gateway
from speculant.v1 import gateway_pb2, gateway_pb2_grpc, verifier_pb2

LONG = gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=480, temperature=0.0)


def verifier_stats(services) -> verifier_pb2.GetStatsResponse:
    return services.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10)


def wait_for_no_sessions(services, within_s: float) -> float:
    """Seconds until the verifier has no live session (fails after within_s)."""
    started = time.monotonic()
    while verifier_stats(services).live_sessions:
        assert time.monotonic() - started < within_s, "the verifier session was not released"
        time.sleep(0.01)
    return time.monotonic() - started


def test_cancelled_stream_stops_rounds_and_releases_the_session(services):
    stream = services.gateway.GenerateStream(LONG, timeout=60)
    next(stream)
    assert verifier_stats(services).live_sessions == 1
    stream.cancel()
    wait_for_no_sessions(services, within_s=1.0)
    forwards = verifier_stats(services).forward_passes
    time.sleep(0.2)
    assert verifier_stats(services).forward_passes == forwards  # no more rounds


def test_deadline_is_propagated_and_the_session_released(services):
    with pytest.raises(grpc.RpcError) as info:
        services.gateway.Generate(LONG, timeout=0.05)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for_no_sessions(services, within_s=1.0)


def test_over_the_limit_is_resource_exhausted_while_admitted_requests_finish(services):
    gateway, _ = start_gateway(
        [services.draft_address], services.verifier_address, port=0, max_concurrent=1
    )
    try:
        with grpc.insecure_channel(gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            admitted = stub.GenerateStream(LONG, timeout=60)
            next(admitted)  # running now
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(gateway_pb2.GenerateRequest(prompt="Hi", max_tokens=4), timeout=30)
            refused_after = time.monotonic() - started
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert refused_after < 1.0  # refused at once, not after the running request
            final = list(admitted)[-1]
            assert final.finish_reason != gateway_pb2.FINISH_REASON_UNSPECIFIED
            # The slot is free again.
            stub.Generate(gateway_pb2.GenerateRequest(prompt="Hi", max_tokens=4), timeout=30)
    finally:
        gateway.stop(0)
