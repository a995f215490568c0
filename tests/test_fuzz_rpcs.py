"""Bad input at every RPC: property-based fuzzing of the three services over real localhost ports.

Requests are drawn from the message descriptors (tests/proto_strategies.py): random field values
over each type's whole range, plus raw payloads that do not decode at all (garbage, truncated,
flipped bytes, invalid UTF-8), sent with generic byte-level calls. Every call must end OK or with
one of the codes a caller's mistake deserves:

- INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, RESOURCE_EXHAUSTED everywhere;
- NOT_FOUND from the verifier only: a Verify (unary or on a Session stream) naming an unknown
  session id (never created, released or expired) is answered NOT_FOUND, the right code for it;
- DEADLINE_EXCEEDED only on the calls sent on purpose with a short client deadline (gateway
  generations of up to 2^20 tokens): that is the client's own deadline, not a server fault.

Never INTERNAL or UNKNOWN (a bug escaping a handler), never a hang (every other call carries a
10 s deadline), and each service answers health SERVING afterwards.

Undecodable payloads: gRPC's Python server answers INTERNAL ("Exception deserializing
request!") when the request deserializer raises. Every Speculant server installs
:class:`speculant.grpc_server.MalformedRequestInterceptor`, which turns that into
INVALID_ARGUMENT, so the property covers malformed bytes too, with no exception.

The default run sends about 1,000 requests per service; ``pytest -m slow`` runs the 10,000-per-
service variant.
"""

from __future__ import annotations

import math
import time

import grpc
import pytest
from hypothesis import strategies as st

from speculant.health import health_status
from speculant.v1 import gateway_pb2, verifier_pb2
from tests.fuzz_calls import (
    ALLOWED_GRAPHS,
    ALLOWED_VERIFIER,
    CALL_DEADLINE_S,
    DEFAULT_PER_SERVICE,
    DRAFT,
    GATEWAY,
    LIVE_SESSIONS,
    SLOW_PER_SERVICE,
    VERIFIER,
    Call,
    Code,
    Tally,
    check,
    draft_calls,
    gateway_calls,
    run_fuzz,
    send,
    verifier_calls,
)


def fuzz_service(
    address: str, calls: list[tuple[st.SearchStrategy[Call], int]], n: int, allowed: frozenset
) -> Tally:
    """Fuzz each method in turn, with n requests shared by weight (one property per method:
    hypothesis then shrinks a failure to a minimal request of that method)."""
    tally = Tally()
    with grpc.insecure_channel(address) as channel:

        def execute(call: Call) -> None:
            outcome = send(channel, call)
            tally.codes[outcome.code] += 1
            tally.methods[call.method] += 1
            tally.messages += len(call.payloads)
            if outcome.code != Code.OK:
                tally.details[(outcome.code.name, outcome.details[:120])] += 1
            tally.malformed += call.malformed
            check(outcome, call, allowed)
            if call.method == VERIFIER + "Prefill" and outcome.code == Code.OK:
                # Free the sessions the fuzzing creates (but the long-lived ones) so that the
                # verifier's cap on live sessions is not what every later prefill runs into.
                response = verifier_pb2.PrefillResponse.FromString(outcome.responses[0])
                if response.session_id not in LIVE_SESSIONS:
                    release = verifier_pb2.ReleaseRequest(session_id=response.session_id)
                    channel.unary_unary(VERIFIER + "Release")(
                        release.SerializeToString(), timeout=CALL_DEADLINE_S
                    )

        total_weight = sum(weight for _, weight in calls)
        for strategy, weight in calls:
            run_fuzz(strategy, math.ceil(n * weight / total_weight), execute)
    return tally


def assert_serving(address: str) -> None:
    assert health_status(address, timeout_s=5.0) == "SERVING"


def open_live_sessions(services) -> None:
    for i, session_id in enumerate(LIVE_SESSIONS):
        services.verifier.Prefill(
            verifier_pb2.PrefillRequest(
                session_id=session_id, prompt_token_ids=[1, 403, 407], temperature=i / 2
            ),
            timeout=CALL_DEADLINE_S,
        )


def release_live_sessions_and_check_no_leak(services) -> None:
    for session_id in LIVE_SESSIONS:
        services.verifier.Release(verifier_pb2.ReleaseRequest(session_id=session_id), timeout=5)
    check_no_leak(services)


def check_no_leak(services) -> None:
    """No verifier session is left live (the gateway's included) once the calls are over."""
    deadline = time.monotonic() + 3.0  # Session streams release as their handler finishes
    while True:
        live = services.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=5).live_sessions
        if live == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert live == 0, f"{live} verifier sessions left live after the fuzzing"


def fuzz_all(services, n: int) -> dict[str, Tally]:
    tallies: dict[str, Tally] = {}
    for name, address, calls, allowed in (
        ("draft", services.draft_address, draft_calls(), ALLOWED_GRAPHS),
        ("verifier", services.verifier_address, verifier_calls(), ALLOWED_VERIFIER),
        ("gateway", services.gateway_address, gateway_calls(), ALLOWED_GRAPHS),
    ):
        if name == "verifier":
            open_live_sessions(services)
        started = time.perf_counter()
        tally = fuzz_service(address, calls, n, allowed)
        seconds = time.perf_counter() - started
        print(f"\n{name}: {tally.summary()}; {seconds:.1f} s")
        for (code, details), count in tally.details.most_common(12) + [
            (k, v) for k, v in tally.details.items() if k[0] == "RESOURCE_EXHAUSTED"
        ]:
            print(f"    {count:6d}  {code} {details}")
        assert tally.requests >= n
        assert_serving(address)
        if name == "verifier":
            release_live_sessions_and_check_no_leak(services)
        if name == "gateway":
            check_no_leak(services)
        tallies[name] = tally
    # The whole system still works after all of it.
    response = services.gateway.Generate(
        gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=8, temperature=0),
        timeout=CALL_DEADLINE_S,
    )
    assert response.stats.generated_tokens > 0
    return tallies


def test_fuzz_every_rpc(services):
    fuzz_all(services, DEFAULT_PER_SERVICE)


@pytest.mark.slow
def test_fuzz_every_rpc_10k(services):
    fuzz_all(services, SLOW_PER_SERVICE)


def test_undecodable_request_is_invalid_argument(services):
    """A payload that is not a valid message gets INVALID_ARGUMENT (not gRPC's INTERNAL), on
    unary and streaming methods alike, and the stream-level cases keep the service healthy."""
    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length-delimited, length past the end
    for address, method, kind in (
        (services.draft_address, DRAFT + "Propose", "unary"),
        (services.draft_address, DRAFT + "ProposeStream", "bidi"),
        (services.draft_address, DRAFT + "Learn", "unary"),
        (services.verifier_address, VERIFIER + "Session", "bidi"),
        (services.verifier_address, VERIFIER + "GetStats", "unary"),
        (services.gateway_address, GATEWAY + "GenerateStream", "server_stream"),
        (services.gateway_address, GATEWAY + "Generate", "unary"),
    ):
        with grpc.insecure_channel(address) as channel:
            outcome = send(channel, Call(method, kind, [garbage]))
        assert outcome.code == Code.INVALID_ARGUMENT, (method, outcome)
        assert "malformed" in outcome.details
        assert_serving(address)


def test_tiny_temperature_is_greedy_not_nan(services):
    """A positive temperature too small for float32 (logits / T overflows, or T rounds to 0)
    samples the argmax, as its limit does, instead of a NaN distribution's last token."""
    prompt = [1, 403, 407]
    greedy = services.verifier.Prefill(
        verifier_pb2.PrefillRequest(prompt_token_ids=prompt, temperature=0.0), timeout=10
    )
    for temperature in (5e-324, 1e-300, 1e-40):
        tiny = services.verifier.Prefill(
            verifier_pb2.PrefillRequest(prompt_token_ids=prompt, temperature=temperature, seed=1),
            timeout=10,
        )
        assert tiny.token_id == greedy.token_id, temperature
        for response in (greedy, tiny):
            services.verifier.Release(
                verifier_pb2.ReleaseRequest(session_id=response.session_id), timeout=10
            )
