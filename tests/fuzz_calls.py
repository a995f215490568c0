"""The calls the RPC fuzzer sends (tests/test_fuzz_rpcs.py): hypothesis strategies of plausible
and arbitrary requests for every method of the three services, sent with generic byte-level
calls, and the outcome each call may end with."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speculant.v1 import common_pb2, draft_pb2, gateway_pb2, verifier_pb2
from tests.proto_strategies import doubles, malformed_payloads, messages, scalar

log = logging.getLogger(__name__)

DEFAULT_PER_SERVICE = 300  # requests per service in the default suite (-m slow: 10,000)
SLOW_PER_SERVICE = 10_000
CALL_DEADLINE_S = 10.0  # a call that takes longer than this is a hang
SHORT_DEADLINE_S = 0.2  # for huge generations: DEADLINE_EXCEEDED is then the expected outcome
VOCAB = 512  # stories260K
LIVE_SESSIONS = tuple(f"fuzz-live-{i}" for i in range(4))

Code = grpc.StatusCode
ALLOWED = frozenset(
    {
        Code.OK,
        Code.INVALID_ARGUMENT,
        Code.FAILED_PRECONDITION,
        Code.OUT_OF_RANGE,
        Code.RESOURCE_EXHAUSTED,
    }
)
# An unknown verifier session id (never created, released or expired) is NOT_FOUND.
ALLOWED_VERIFIER = ALLOWED | {Code.NOT_FOUND, Code.ALREADY_EXISTS}
# A graph the draft tier does not serve (a request names it) is NOT_FOUND.
ALLOWED_GRAPHS = ALLOWED | {Code.NOT_FOUND}


@dataclass
class Call:
    """One RPC to send: method path, its shape, and the raw request payload(s)."""

    method: str
    kind: str  # "unary", "server_stream" or "bidi"
    payloads: list[bytes]
    deadline_s: float = CALL_DEADLINE_S
    malformed: bool = False

    @property
    def deadline_ok(self) -> bool:
        return self.deadline_s < CALL_DEADLINE_S


@dataclass
class Outcome:
    code: grpc.StatusCode
    details: str
    responses: list[bytes] = field(default_factory=list)


def send(channel: grpc.Channel, call: Call) -> Outcome:
    """Send the call with generic (bytes in, bytes out) multicallables."""
    responses: list[bytes] = []
    try:
        if call.kind == "unary":
            rpc = channel.unary_unary(call.method)
            responses.append(rpc(call.payloads[0], timeout=call.deadline_s))
        elif call.kind == "server_stream":
            rpc = channel.unary_stream(call.method)
            responses.extend(rpc(call.payloads[0], timeout=call.deadline_s))
        else:
            rpc = channel.stream_stream(call.method)
            responses.extend(rpc(iter(call.payloads), timeout=call.deadline_s))
    except grpc.RpcError as exc:
        return Outcome(exc.code(), exc.details() or "", responses)
    return Outcome(Code.OK, "", responses)


@dataclass
class Tally:
    """Requests sent per service: by status code and by method."""

    codes: Counter = field(default_factory=Counter)
    methods: Counter = field(default_factory=Counter)
    details: Counter = field(default_factory=Counter)
    malformed: int = 0
    messages: int = 0

    @property
    def requests(self) -> int:
        return sum(self.codes.values())

    def summary(self) -> str:
        codes = ", ".join(f"{c.name} {n}" for c, n in self.codes.most_common())
        methods = ", ".join(f"{m.rsplit('/', 1)[1]} {n}" for m, n in sorted(self.methods.items()))
        return (
            f"{self.requests} requests ({self.messages} messages, {self.malformed} malformed); "
            f"codes: {codes}; methods: {methods}"
        )


def check(outcome: Outcome, call: Call, allowed: frozenset) -> None:
    ok = outcome.code in allowed or (call.deadline_ok and outcome.code == Code.DEADLINE_EXCEEDED)
    # A status message too big for the client's trailer limit turns any error into
    # RESOURCE_EXHAUSTED and loses it: error messages quoting request fields must be clipped.
    ok = ok and "metadata size exceeds" not in outcome.details
    assert ok, (
        f"{call.method} answered {outcome.code.name}: {outcome.details!r}\n"
        f"request payloads (first 300 bytes each): {[p[:300] for p in call.payloads]}"
    )


def run_fuzz(strategy: st.SearchStrategy, n: int, execute) -> None:
    """Run `execute` on n examples drawn from `strategy` (no example database, no deadline)."""

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(strategy)
    def fuzz(call: Call) -> None:
        execute(call)

    fuzz()


def either(message: st.SearchStrategy, descriptor) -> st.SearchStrategy[tuple[bytes, bool]]:
    """(payload, malformed): mostly a serialized random message, sometimes undecodable bytes."""
    return st.one_of(
        message.map(lambda m: (m.SerializeToString(), False)),
        message.map(lambda m: (m.SerializeToString(), False)),
        message.map(lambda m: (m.SerializeToString(), False)),
        malformed_payloads(descriptor).map(lambda b: (b, True)),
    )


def unary(method: str, message: st.SearchStrategy, descriptor, kind: str = "unary"):
    return either(message, descriptor).map(lambda pm: Call(method, kind, [pm[0]], malformed=pm[1]))


def bidi(method: str, message: st.SearchStrategy, descriptor, max_messages: int = 4):
    return st.lists(either(message, descriptor), min_size=0, max_size=max_messages).map(
        lambda items: Call(
            method, "bidi", [p for p, _ in items], malformed=any(m for _, m in items)
        )
    )


# -- plausible requests: random, but valid often enough to reach the deep code paths ---------


def token_ids(max_size: int = 12) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=max_size)


@st.composite
def plausible_distribution(draw, draft: int) -> common_pb2.SparseDistribution:
    others = draw(st.lists(st.integers(0, VOCAB + 2), max_size=4))
    ids = [draft, *others]
    weights = draw(st.lists(st.floats(0.0, 1.0), min_size=len(ids), max_size=len(ids)))
    total = sum(weights)
    probs = [w / total for w in weights] if total > 0 else [1.0] + [0.0] * len(others)
    if draw(st.integers(0, 9)) == 0:  # now and then: break it
        probs[draw(st.integers(0, len(probs) - 1))] = draw(
            st.sampled_from([float("nan"), -0.5, 2.0, 1e308, float("inf")])
        )
    return common_pb2.SparseDistribution(token_ids=ids, probs=probs)


@st.composite
def plausible_verify(draw) -> verifier_pb2.VerifyRequest:
    drafts = draw(st.lists(st.integers(0, VOCAB - 1), max_size=8))
    request = verifier_pb2.VerifyRequest(
        session_id=draw(st.sampled_from([*LIVE_SESSIONS, "no-such-session", ""])),
        draft_token_ids=drafts,
    )
    if draw(st.booleans()):
        for d in drafts:
            request.draft_distributions.append(draw(plausible_distribution(d)))
    return request


@st.composite
def plausible_prefill(draw) -> verifier_pb2.PrefillRequest:
    request = verifier_pb2.PrefillRequest(
        session_id=draw(st.sampled_from(["", *LIVE_SESSIONS, "fuzz-x"])),
        prompt_token_ids=draw(token_ids()),
        temperature=draw(st.one_of(st.floats(0.0, 2.0), st.just(0.0))),
    )
    if draw(st.booleans()):
        request.seed = draw(st.integers(0, 2**64 - 1))
    if draw(st.booleans()):
        draw(plausible_sampling(request.sampling))
    if draw(st.booleans()):
        request.top_logprobs = draw(mostly(st.integers(0, 20), st.integers(-(2**31), 2**31 - 1)))
    return request


# Valid ranges of the sampling controls (SamplingControls), and how to draw each.
SAMPLING_CONTROLS = {
    "top_k": st.integers(0, 600),
    "top_p": st.floats(0.01, 1.0),
    "min_p": st.floats(0.0, 1.0),
    "repetition_penalty": st.floats(0.5, 2.0),
    "presence_penalty": st.floats(-2.0, 2.0),
    "frequency_penalty": st.floats(-2.0, 2.0),
}


@st.composite
def plausible_sampling(draw, controls: common_pb2.SamplingControls) -> None:
    """Set some sampling controls, mostly in range, sometimes any value of the type."""
    for name, valid in SAMPLING_CONTROLS.items():
        if draw(st.booleans()):
            anything = st.integers(-(2**31), 2**31 - 1) if name == "top_k" else doubles()
            setattr(controls, name, draw(mostly(valid, anything)))


def mostly(valid: st.SearchStrategy, anything: st.SearchStrategy) -> st.SearchStrategy:
    """A valid value four times in five, else anything of the type."""
    return st.one_of(valid, valid, valid, valid, anything)


# Valid ranges of the drafting options (ProposeRequest and DraftOptions share the names).
DRAFT_OPTIONS = {
    "k": st.integers(1, 64),
    "strategy": st.sampled_from([0, 1, 2]),
    "attentive_mix": st.booleans(),
    "order_bias": st.floats(0.0, 4.0),
    "mix_temperature": st.floats(0.01, 4.0),
    "reliability_weight": st.floats(0.0, 4.0),
    "entropy_penalty": st.floats(0.0, 4.0),
    "mixing": st.sampled_from(["seed", "backoff", "witten-bell"]),
    "escape_weight": st.floats(0.01, 10.0),
    "seed": st.integers(0, 2**64 - 1),
}


@st.composite
def plausible_options(draw, message):
    """Set each drafting option of `message` (present or not), mostly within its valid range."""
    by_name = message.DESCRIPTOR.fields_by_name
    for name, valid in DRAFT_OPTIONS.items():
        if name not in by_name or not draw(st.booleans()):
            continue
        setattr(message, name, draw(mostly(valid, scalar(by_name[name]))))
    return message


# -- the draft service ------------------------------------------------------------------------

DRAFT = "/speculant.v1.DraftService/"


@st.composite
def plausible_propose(draw) -> draft_pb2.ProposeRequest:
    request = draft_pb2.ProposeRequest(context_token_ids=draw(token_ids(40)))
    return draw(plausible_options(request))


@st.composite
def plausible_learn(draw) -> draft_pb2.LearnRequest:
    return draft_pb2.LearnRequest(
        token_ids=draw(token_ids(300)),
        generation_id=draw(st.text(max_size=140)),
        persist=draw(st.booleans()),
    )


def draft_calls() -> list[tuple[st.SearchStrategy[Call], int]]:
    propose = st.one_of(messages(draft_pb2.ProposeRequest.DESCRIPTOR), plausible_propose())
    desc = draft_pb2.ProposeRequest.DESCRIPTOR
    info = draft_pb2.GetGraphInfoRequest.DESCRIPTOR
    learn_desc = draft_pb2.LearnRequest.DESCRIPTOR
    learn = st.one_of(messages(learn_desc), plausible_learn())
    return [
        (unary(DRAFT + "Propose", propose, desc), 5),
        (bidi(DRAFT + "ProposeStream", propose, desc), 4),
        (unary(DRAFT + "GetGraphInfo", messages(info), info), 1),
        (unary(DRAFT + "Learn", learn, learn_desc), 2),
    ]


# -- the verifier service ---------------------------------------------------------------------

VERIFIER = "/speculant.v1.VerifierService/"


def verifier_calls() -> list[tuple[st.SearchStrategy[Call], int]]:
    prefill_d = verifier_pb2.PrefillRequest.DESCRIPTOR
    verify_d = verifier_pb2.VerifyRequest.DESCRIPTOR
    session_d = verifier_pb2.SessionRequest.DESCRIPTOR
    prefill = st.one_of(messages(prefill_d), plausible_prefill())
    verify = st.one_of(messages(verify_d), plausible_verify())
    step = st.one_of(
        messages(session_d),
        plausible_prefill().map(lambda p: verifier_pb2.SessionRequest(prefill=p)),
        plausible_verify().map(lambda v: verifier_pb2.SessionRequest(verify=v)),
    )
    release = st.one_of(
        messages(verifier_pb2.ReleaseRequest.DESCRIPTOR),
        st.sampled_from(LIVE_SESSIONS).map(lambda s: verifier_pb2.ReleaseRequest(session_id=s)),
    )
    model_info = verifier_pb2.GetModelInfoRequest.DESCRIPTOR
    stats = verifier_pb2.GetStatsRequest.DESCRIPTOR
    plausible_session = st.builds(
        lambda first, rest: Call(
            VERIFIER + "Session",
            "bidi",
            [verifier_pb2.SessionRequest(prefill=first).SerializeToString()]
            + [verifier_pb2.SessionRequest(verify=v).SerializeToString() for v in rest],
        ),
        plausible_prefill(),
        st.lists(plausible_verify(), max_size=5),
    )
    return [
        (unary(VERIFIER + "Prefill", prefill, prefill_d), 2),
        (unary(VERIFIER + "Verify", verify, verify_d), 3),
        (unary(VERIFIER + "Release", release, verifier_pb2.ReleaseRequest.DESCRIPTOR), 1),
        (bidi(VERIFIER + "Session", step, session_d), 2),
        (plausible_session, 2),
        (unary(VERIFIER + "GetModelInfo", messages(model_info), model_info), 1),
        (unary(VERIFIER + "GetStats", messages(stats), stats), 1),
    ]


# -- the gateway ------------------------------------------------------------------------------

GATEWAY = "/speculant.v1.GatewayService/"
PROMPTS = ("Once upon a time", "The little dog", "Lily and Tom went to the park. They", " ")


@st.composite
def plausible_generate(draw) -> gateway_pb2.GenerateRequest:
    request = gateway_pb2.GenerateRequest(
        prompt=draw(mostly(st.sampled_from(PROMPTS), st.text(max_size=30))),
        max_tokens=draw(st.integers(0, 8)),
        stop=draw(st.lists(st.sampled_from([".", "the", "!", "", "\n"]), max_size=3)),
    )
    if draw(st.booleans()):
        request.temperature = draw(mostly(st.floats(0.0, 2.0), doubles()))
    if draw(st.booleans()):
        request.seed = draw(st.integers(0, 2**64 - 1))
    if draw(st.booleans()):
        draw(plausible_options(request.draft))
    if draw(st.booleans()):
        draw(plausible_sampling(request.sampling))
    if draw(st.booleans()):
        request.top_logprobs = draw(mostly(st.integers(0, 20), st.integers(-(2**31), 2**31 - 1)))
    return request


@st.composite
def gateway_call(draw, method: str, kind: str) -> Call:
    desc = gateway_pb2.GenerateRequest.DESCRIPTOR
    if draw(st.integers(0, 4)) == 0:
        return Call(method, kind, [draw(malformed_payloads(desc))], malformed=True)
    request = draw(st.one_of(plausible_generate(), messages(desc), plausible_generate()))
    if not request.HasField("max_tokens") or request.max_tokens > 8:
        request.max_tokens = draw(st.integers(-2, 8))
    return Call(method, kind, [request.SerializeToString()])


@st.composite
def huge_gateway_call(draw) -> Call:
    """Up to 2^20 tokens (or over the limit) with a short client deadline: DEADLINE_EXCEEDED
    (the client's own) is then a fine outcome, as long as the gateway stops and frees all."""
    method, kind = draw(
        st.sampled_from(
            [(GATEWAY + "Generate", "unary"), (GATEWAY + "GenerateStream", "server_stream")]
        )
    )
    request = draw(
        st.one_of(plausible_generate(), messages(gateway_pb2.GenerateRequest.DESCRIPTOR))
    )
    request.max_tokens = draw(st.sampled_from([1_000, 1 << 20, (1 << 20) + 1, 2**31 - 1]))
    return Call(method, kind, [request.SerializeToString()], deadline_s=SHORT_DEADLINE_S)


def gateway_calls() -> list[tuple[st.SearchStrategy[Call], int]]:
    return [
        (gateway_call(GATEWAY + "Generate", "unary"), 20),
        (gateway_call(GATEWAY + "GenerateStream", "server_stream"), 19),
        (huge_gateway_call(), 1),
    ]


# -- the runs ---------------------------------------------------------------------------------
