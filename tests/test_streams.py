"""The streaming RPCs the gateway uses per round: VerifierService/Session, DraftService/
ProposeStream. A session lives exactly as long as its stream."""

from __future__ import annotations

import logging
import queue
import time

import grpc
import pytest

from speculant.v1 import draft_pb2, draft_pb2_grpc, verifier_pb2
from tests.draft_checks import untimed

PROMPT_IDS = [1, 403, 407, 261, 378]


def live_sessions(services) -> int:
    return services.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10).live_sessions


def wait_for_sessions(services, expected: int, within_s: float = 2.0) -> int:
    deadline = time.monotonic() + within_s
    while (n := live_sessions(services)) != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return n


def open_session(services):
    requests: queue.SimpleQueue = queue.SimpleQueue()
    end = object()
    responses = services.verifier.Session(iter(requests.get, end), timeout=30)
    return requests, end, responses


def prefill_message() -> verifier_pb2.SessionRequest:
    return verifier_pb2.SessionRequest(
        prefill=verifier_pb2.PrefillRequest(prompt_token_ids=PROMPT_IDS, temperature=0.0)
    )


def test_session_stream_prefill_verify_then_release_on_end(services):
    requests, end, responses = open_session(services)
    requests.put(prefill_message())
    first = next(responses).prefill
    assert first.session_id and first.token_id >= 0
    assert wait_for_sessions(services, 1) == 1
    requests.put(
        verifier_pb2.SessionRequest(verify=verifier_pb2.VerifyRequest(draft_token_ids=[383, 286]))
    )
    verified = next(responses).verify
    assert 1 <= len(verified.token_ids) == verified.accepted_count + 1 <= 3
    requests.put(end)
    assert list(responses) == []
    assert wait_for_sessions(services, 0) == 0


def test_cancelled_session_stream_releases_the_session(services, caplog):
    requests, _, responses = open_session(services)
    requests.put(prefill_message())
    next(responses)
    assert wait_for_sessions(services, 1) == 1
    with caplog.at_level(logging.ERROR):
        responses.cancel()
        assert wait_for_sessions(services, 0, within_s=1.0) == 0
        time.sleep(0.2)  # the handler's own exit, after the release
    # A client that cancels is routine, not an error in the verifier's log.
    assert not [r for r in caplog.records if "unexpected error" in r.getMessage()]


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (verifier_pb2.SessionRequest(verify=verifier_pb2.VerifyRequest()), "verify"),
        (verifier_pb2.SessionRequest(), "step"),
    ],
)
def test_bad_session_streams_are_invalid_argument(services, message, field):
    requests, end, responses = open_session(services)
    requests.put(message)
    requests.put(end)
    with pytest.raises(grpc.RpcError) as info:
        next(responses)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()


def test_propose_stream_answers_each_request_like_propose(services):
    with grpc.insecure_channel(services.draft_address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        contexts = [PROMPT_IDS, PROMPT_IDS[:3], [1]]
        requests = [draft_pb2.ProposeRequest(context_token_ids=c, k=4) for c in contexts]
        streamed = list(stub.ProposeStream(iter(requests), timeout=10))
        unary = [stub.Propose(r, timeout=10) for r in requests]
        assert [untimed(r) for r in streamed] == [untimed(r) for r in unary]
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ProposeStream(iter([draft_pb2.ProposeRequest(k=0)]), timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_session_stream_cannot_take_over_another_session(services):
    services.verifier.Prefill(
        verifier_pb2.PrefillRequest(session_id="theirs", prompt_token_ids=PROMPT_IDS), timeout=10
    )
    requests, end, responses = open_session(services)
    requests.put(
        verifier_pb2.SessionRequest(
            prefill=verifier_pb2.PrefillRequest(session_id="theirs", prompt_token_ids=[1])
        )
    )
    assert next(responses).prefill.session_id != "theirs"
    requests.put(end)
    list(responses)
    # "theirs" is still there, untouched by the stream's end.
    verified = services.verifier.Verify(
        verifier_pb2.VerifyRequest(session_id="theirs", draft_token_ids=[]), timeout=10
    )
    assert len(verified.token_ids) == 1
    services.verifier.Release(verifier_pb2.ReleaseRequest(session_id="theirs"), timeout=10)
