"""Bearer-token authentication on the gateway, and oversize messages on every service.

A gateway started with an auth token refuses calls without ``authorization: Bearer <token>``
(UNAUTHENTICATED, whatever the call shape) and serves those with it; health checks stay open.
A message over the services' size limit is refused with RESOURCE_EXHAUSTED and the service
keeps serving.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from launcher.cli import main
from speculant.auth import TOKEN_ENV, bearer_metadata, load_token
from speculant.errors import InvalidArgumentError
from speculant.grpc_server import MAX_MESSAGE_BYTES
from speculant.health import health_status
from speculant.v1 import (
    draft_pb2,
    draft_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    verifier_pb2,
    verifier_pb2_grpc,
)

TOKEN = "s3cret-token"
REQUEST = gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=8, temperature=0)


@pytest.fixture(scope="module")
def protected_gateway(services) -> Iterator[str]:
    """A gateway that requires TOKEN, on the shared draft and verifier services."""
    from gateway.api.server import start_gateway

    server, _ = start_gateway(
        [services.draft_address], services.verifier_address, port=0, auth_token=TOKEN
    )
    try:
        yield server.address
    finally:
        server.stop(0)


@pytest.fixture
def stub(protected_gateway) -> Iterator[gateway_pb2_grpc.GatewayServiceStub]:
    with grpc.insecure_channel(protected_gateway) as channel:
        yield gateway_pb2_grpc.GatewayServiceStub(channel)


@pytest.mark.parametrize(
    "metadata",
    [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)],
    ids=["missing", "wrong", "no-bearer-prefix"],
)
def test_calls_without_the_token_are_unauthenticated(stub, metadata):
    with pytest.raises(grpc.RpcError) as unary:
        stub.Generate(REQUEST, timeout=10, metadata=metadata)
    assert unary.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as streaming:
        list(stub.GenerateStream(REQUEST, timeout=10, metadata=metadata))
    assert streaming.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_calls_with_the_token_are_served_and_health_is_open(stub, protected_gateway):
    response = stub.Generate(REQUEST, timeout=30, metadata=bearer_metadata(TOKEN))
    assert len(response.token_ids) == 8
    chunks = list(stub.GenerateStream(REQUEST, timeout=30, metadata=bearer_metadata(TOKEN)))
    assert "".join(c.text_delta for c in chunks) == response.text
    assert health_status(protected_gateway) == "SERVING"


def test_generate_cli_sends_the_token_from_a_file_or_the_environment(
    protected_gateway, tmp_path, monkeypatch, capsys
):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    args = ["generate", "--gateway", protected_gateway, "--prompt", "Once upon a time"]
    args += ["--max-tokens", "4", "--temperature", "0"]
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(args) == 1
    assert "missing or bad bearer token" in capsys.readouterr().err
    assert main([*args, "--auth-token-file", str(token_file)]) == 0
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert main(args) == 0


def test_load_token(tmp_path):
    assert load_token(None, env={}) is None
    assert load_token(None, env={TOKEN_ENV: " abc "}) == "abc"
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(InvalidArgumentError, match="--auth-token-file"):
        load_token(str(empty), env={})
    with pytest.raises(InvalidArgumentError, match="cannot read"):
        load_token(str(tmp_path / "missing"), env={})


def _oversize_calls(services):
    """(address, a call sending one message over MAX_MESSAGE_BYTES) per service."""
    too_many = MAX_MESSAGE_BYTES // 2 + 1_000  # id 300 takes 2 bytes (varint): over the limit
    return [
        (
            services.gateway_address,
            lambda ch: gateway_pb2_grpc.GatewayServiceStub(ch).Generate(
                gateway_pb2.GenerateRequest(prompt="x" * (MAX_MESSAGE_BYTES + 1)), timeout=30
            ),
        ),
        (
            services.draft_address,
            lambda ch: draft_pb2_grpc.DraftServiceStub(ch).Propose(
                draft_pb2.ProposeRequest(context_token_ids=[300] * too_many), timeout=30
            ),
        ),
        (
            services.verifier_address,
            lambda ch: verifier_pb2_grpc.VerifierServiceStub(ch).Prefill(
                verifier_pb2.PrefillRequest(prompt_token_ids=[300] * too_many), timeout=30
            ),
        ),
    ]


def test_oversize_messages_are_resource_exhausted_and_services_stay_up(services):
    for address, call in _oversize_calls(services):
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                call(channel)
            assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, address
        assert health_status(address) == "SERVING", address
    response = services.gateway.Generate(REQUEST, timeout=30)
    assert len(response.token_ids) == 8
