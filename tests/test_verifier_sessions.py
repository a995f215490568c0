"""Direct verifier clients: a live session is never replaced by a Prefill naming its id, unary
calls never reach a Session stream's session, and unary-Prefill sessions have a cap of their
own, so a direct client filling it leaves the gateway's generations their sessions."""

from __future__ import annotations

import queue

import grpc
import pytest

from speculant.v1 import gateway_pb2, verifier_pb2, verifier_pb2_grpc
from tests.fixtures.e2e import verifier_config

PROMPT = [1, 403, 407, 261]


def prefill(services, session_id: str = "") -> verifier_pb2.PrefillResponse:
    return services.verifier.Prefill(
        verifier_pb2.PrefillRequest(
            session_id=session_id, prompt_token_ids=PROMPT, temperature=0.0
        ),
        timeout=10,
    )


def release(services, session_id: str) -> bool:
    request = verifier_pb2.ReleaseRequest(session_id=session_id)
    return services.verifier.Release(request, timeout=10).released


def test_a_prefill_naming_a_live_session_never_replaces_it(services):
    first = prefill(services, "mine")
    try:
        with pytest.raises(grpc.RpcError) as info:
            prefill(services, "mine")  # another client, the same id
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
        # The first client's session goes on where it was.
        verify = verifier_pb2.VerifyRequest(session_id="mine", draft_token_ids=[first.token_id])
        assert services.verifier.Verify(verify, timeout=10).token_ids
    finally:
        release(services, "mine")


def test_unary_calls_never_reach_a_session_streams_session(services):
    requests: queue.SimpleQueue = queue.SimpleQueue()
    with grpc.insecure_channel(services.verifier_address) as channel:
        stream = verifier_pb2_grpc.VerifierServiceStub(channel).Session(
            iter(requests.get, None), timeout=60
        )
        requests.put(
            verifier_pb2.SessionRequest(
                prefill=verifier_pb2.PrefillRequest(prompt_token_ids=PROMPT, temperature=0.0)
            )
        )
        session_id = next(stream).prefill.session_id
        assert not release(services, session_id)  # not a unary client's to release
        with pytest.raises(grpc.RpcError) as info:
            services.verifier.Verify(
                verifier_pb2.VerifyRequest(session_id=session_id, draft_token_ids=[5]),
                timeout=10,
            )
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        # The stream's own session still works.
        requests.put(verifier_pb2.SessionRequest(verify=verifier_pb2.VerifyRequest()))
        assert next(stream).verify.token_ids
        requests.put(None)
        assert list(stream) == []


def test_a_client_filling_the_unary_sessions_leaves_the_gateway_its_sessions(services):
    held = []
    try:
        for _ in range(200):  # more than any cap: until the verifier refuses
            try:
                held.append(prefill(services).session_id)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                break
        else:
            pytest.fail("the verifier took 200 unary sessions")
        assert len(held) == verifier_config().max_unary_sessions  # the cap, not fewer
        response = services.gateway.Generate(
            gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=8), timeout=30
        )
        assert len(response.token_ids) == 8
    finally:
        for session_id in held:
            release(services, session_id)
