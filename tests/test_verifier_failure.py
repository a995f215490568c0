"""A verifier killed mid-stream: the client gets UNAVAILABLE quickly, never hangs; once the
verifier is back on its port the gateway serves again without a restart of its own."""

from __future__ import annotations

import signal
import time

import grpc
import pytest

from gateway.api.server import start_gateway
from speculant.ports import free_port
from speculant.v1 import gateway_pb2, gateway_pb2_grpc
from tests.processes import start_verifier_process


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
