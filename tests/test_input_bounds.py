"""Every input of the services is bounded, and an oversize one is refused before any work:
draft trees wider than the verifier takes, Propose contexts longer than the draft service takes,
prompts longer (in characters) than the model's context can hold. Real services on loopback."""

from __future__ import annotations

import time

import grpc
import pytest

from draft_service.overlay import MAX_CACHED_TOKENS
from speculant.config import DEFAULT_MAX_CONTEXT_TOKENS, DEFAULT_MAX_DRAFT_TOKENS
from speculant.v1 import (
    common_pb2,
    draft_pb2,
    draft_pb2_grpc,
    gateway_pb2,
    verifier_pb2,
)

# Refusals come back well within this (the work they skip took seconds to minutes).
REFUSED_WITHIN_S = 2.0


def refused(call) -> grpc.RpcError:
    """The error a call ends with, checked to come back within REFUSED_WITHIN_S."""
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert time.monotonic() - started < REFUSED_WITHIN_S
    return info.value


def forward_passes(services) -> int:
    stats = services.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10)
    return stats.forward_passes


def test_a_draft_tree_wider_than_the_verifier_takes_is_refused_before_a_forward(services):
    session = services.verifier.Prefill(
        verifier_pb2.PrefillRequest(prompt_token_ids=[1, 403, 407], temperature=0.0), timeout=10
    ).session_id
    try:
        before = forward_passes(services)
        nodes = 12_000
        request = verifier_pb2.VerifyRequest(
            session_id=session,
            draft_token_ids=[5] * nodes,
            draft_parents=[-1] * nodes,  # one level, 12,000 wide
            draft_distributions=[
                common_pb2.SparseDistribution(token_ids=[5], probs=[1.0]) for _ in range(nodes)
            ],
        )
        error = refused(lambda: services.verifier.Verify(request, timeout=60))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "draft_token_ids" in error.details()
        assert str(DEFAULT_MAX_DRAFT_TOKENS) in error.details()
        assert forward_passes(services) == before
        # The session is intact: a draft within the bound is verified.
        ok = services.verifier.Verify(
            verifier_pb2.VerifyRequest(
                session_id=session, draft_token_ids=[5] * DEFAULT_MAX_DRAFT_TOKENS
            ),
            timeout=30,
        )
        assert ok.token_ids
    finally:
        services.verifier.Release(verifier_pb2.ReleaseRequest(session_id=session), timeout=10)


def test_a_propose_context_longer_than_the_draft_service_takes_is_refused_unkept(services):
    overlays = services.draft_server.servicer.drafter._overlays
    with grpc.insecure_channel(services.draft_address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        huge = draft_pb2.ProposeRequest(
            context_token_ids=[1, 403] * 1_000_000, k=4, overlay_weight=1.0
        )
        for call in (
            lambda: stub.Propose(huge, timeout=60),
            lambda: next(stub.ProposeStream(iter([huge]), timeout=60)),
        ):
            error = refused(call)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "context_token_ids" in error.details()
            assert str(DEFAULT_MAX_CONTEXT_TOKENS) in error.details()
        # Within the bound, the overlay's cache of contexts stays bounded too.
        for i in range(4):
            context = [1 + i, 403] * (DEFAULT_MAX_CONTEXT_TOKENS // 2)
            stub.Propose(
                draft_pb2.ProposeRequest(context_token_ids=context, k=4, overlay_weight=1.0),
                timeout=120,
            )
        assert overlays.tokens <= MAX_CACHED_TOKENS


def test_a_prompt_longer_than_the_context_can_hold_is_refused_untokenized(services):
    huge = "Once upon a time " * 900_000  # 15 MB
    error = refused(
        lambda: services.gateway.Generate(
            gateway_pb2.GenerateRequest(prompt=huge, max_tokens=4), timeout=120
        )
    )
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert error.details().startswith("prompt:")
    chat = gateway_pb2.GenerateRequest(max_tokens=4)
    chat.messages.add(role="user", content=huge)
    error = refused(lambda: services.gateway.Generate(chat, timeout=120))
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert error.details().startswith("messages:")
    # A prompt just past the context in tokens is still tokenized and refused exactly.
    long = "Once upon a time " * 400
    error = refused(
        lambda: services.gateway.Generate(
            gateway_pb2.GenerateRequest(prompt=long, max_tokens=4), timeout=120
        )
    )
    assert error.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "tokens" in error.details()


def test_a_stop_string_longer_than_the_bound_is_refused(services):
    request = gateway_pb2.GenerateRequest(prompt="Once", max_tokens=4, stop=["x" * 1001])
    error = refused(lambda: services.gateway.Generate(request, timeout=30))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "stop" in error.details()
