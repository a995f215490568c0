"""Verify batching (verifier_service.batching) on the real stories260K model: concurrent sessions
share one forward pass and stay exact.

- the batched forward gives each row the logits and the KV cache of a forward of its own;
- concurrent greedy sessions are token-identical to Hugging Face ``generate(do_sample=False)``,
  in process and through the gateway;
- seeded sampling gives the same tokens batched and unbatched, and each row samples with its
  own controls (penalties, temperature, warpers) and reports its own logprobs;
- a failed batch fails its calls and leaves their sessions as they were.

Which calls share a batch depends on thread timing, so the tests that need a batch hold the
first batch at the model until the other threads' calls are queued (:func:`hold_first_batch`):
the next batch then serves them all together.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import torch

from gateway.launch.baseline import PlainDecoder
from speculant.config import SamplingControls, SessionOptions, VerifierConfig
from speculant.types import SparseDistribution, VerifyResult
from speculant.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, verifier_pb2
from speculant.wire import verify_result_from_pb, verify_result_to_pb
from tests.assets import STORIES_MODEL, dev_prompt_sets, load_dev_prompts
from tests.concurrency import hold_first_batch, run_threads
from tests.fixtures.models import first_token, hf_greedy
from verifier_service.batching import VerifyBatcher
from verifier_service.model import LoadedModel
from verifier_service.verifier import LocalVerifier

N_SESSIONS = 6
N_TOKENS = 48


def make_verifier(loaded: LoadedModel, max_batch: int) -> LocalVerifier:
    config = VerifierConfig(model_name=str(STORIES_MODEL), max_batch=max_batch)
    return LocalVerifier(config, model=loaded)


@pytest.fixture
def verifier(loaded: LoadedModel) -> Iterator[LocalVerifier]:
    v = make_verifier(loaded, max_batch=8)
    yield v
    v.close()


@pytest.fixture(scope="module")
def references(loaded: LoadedModel) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, Hugging Face greedy continuation of N_TOKENS) for N_SESSIONS dev prompts."""
    refs = []
    for text in load_dev_prompts(N_SESSIONS):
        ids = loaded.tokenizer(text).input_ids
        refs.append((ids, hf_greedy(loaded, ids, N_TOKENS)))
    return refs


# -- the batched forward ---------------------------------------------------------------------


def prefilled(loaded: LoadedModel, prompts: list[list[int]]) -> list:
    """A fresh cache per prompt, each holding its prompt."""
    caches = [loaded.new_cache() for _ in prompts]
    for cache, prompt in zip(caches, prompts, strict=True):
        loaded.forward(cache, torch.tensor(prompt), 0, 1)
    return caches


@pytest.fixture(params=["packed", "padded"])
def batching_model(request, loaded: LoadedModel) -> LoadedModel:
    """The model with the lean forward (its batches run packed) or without (padded, through
    the transformers forward)."""
    if request.param == "packed":
        assert loaded.lean is not None
        return loaded
    twin = LoadedModel.from_model(loaded.model, loaded.tokenizer, use_lean=False)
    assert twin.lean is None
    return twin


def test_forward_batch_matches_single_forwards(batching_model: LoadedModel) -> None:
    """Rows with different cache lengths and new-token counts (1 to 9) in one batch: each row's
    logits and written-back cache match a forward of its own."""
    loaded = batching_model
    rng = random.Random(0)
    lengths, widths = [3, 40, 17, 9], [1, 9, 5, 3]
    prompts = [[1] + [rng.randrange(3, 512) for _ in range(n - 1)] for n in lengths]
    inputs = [[rng.randrange(3, 512) for _ in range(w)] for w in widths]

    singles = prefilled(loaded, prompts)
    expected = [
        loaded.forward(cache, torch.tensor(new), len(prompt), len(new))
        for cache, prompt, new in zip(singles, prompts, inputs, strict=True)
    ]
    batched = prefilled(loaded, prompts)
    logits = loaded.forward_batch(batched, inputs, lengths)
    assert loaded.supports_batching
    for row, (got, want) in enumerate(zip(logits, expected, strict=True)):
        assert got.shape == want.shape == (widths[row], loaded.vocab_size)
        assert torch.allclose(got, want, atol=1e-4), f"row {row}"
        assert torch.equal(got.argmax(-1), want.argmax(-1)), f"row {row}"
    for row, (one, many) in enumerate(zip(singles, batched, strict=True)):
        assert many.get_seq_length() == lengths[row] + widths[row]
        for a, b in zip(one.layers, many.layers, strict=True):
            assert a.keys.shape == b.keys.shape
            assert torch.allclose(a.keys, b.keys, atol=1e-5), f"row {row} keys"
            assert torch.allclose(a.values, b.values, atol=1e-5), f"row {row} values"


def test_forward_batch_with_trees_matches_lone_forwards(batching_model: LoadedModel) -> None:
    """Chains and token trees in one batch: each tree row's logits match its lone
    forward_tree's, each chain row's its lone forward's."""
    loaded = batching_model
    rng = random.Random(1)
    lengths = [5, 30, 12, 21]
    trees: list[list[int] | None] = [[-1, 0, 0, 1, -1, 4], None, [-1, -1, -1], None]
    widths = [1 + len(t) if t is not None else w for t, w in zip(trees, [0, 6, 0, 2], strict=True)]
    prompts = [[1] + [rng.randrange(3, 512) for _ in range(n - 1)] for n in lengths]
    inputs = [[rng.randrange(3, 512) for _ in range(w)] for w in widths]

    expected = []
    for cache, prompt, new, tree in zip(
        prefilled(loaded, prompts), prompts, inputs, trees, strict=True
    ):
        ids = torch.tensor(new)
        if tree is None:
            expected.append(loaded.forward(cache, ids, len(prompt), len(new)))
        else:
            expected.append(loaded.forward_tree_with(None, cache, ids, len(prompt), tree))
    logits = loaded.forward_batch(prefilled(loaded, prompts), inputs, lengths, trees)
    for row, (got, want) in enumerate(zip(logits, expected, strict=True)):
        assert got.shape == want.shape == (widths[row], loaded.vocab_size)
        assert torch.allclose(got, want, atol=1e-4), f"row {row}"
        assert torch.equal(got.argmax(-1), want.argmax(-1)), f"row {row}"


def test_a_failed_packed_forward_leaves_every_cache_as_it_was(
    loaded: LoadedModel, monkeypatch
) -> None:
    """A packed batch that fails in its third layer at its last row's attention, when every
    row's keys are appended to two layers and two rows' to the third: every cache keeps its
    prompt, and the failure reaches the caller."""
    rng = random.Random(2)
    lengths = [6, 11, 4]
    prompts = [[1] + [rng.randrange(3, 512) for _ in range(n - 1)] for n in lengths]
    caches, untouched = prefilled(loaded, prompts), prefilled(loaded, prompts)
    lean = loaded.lean
    assert lean is not None
    attention, calls = lean._attention, []

    def failing(*args):
        calls.append(1)
        if len(calls) == 3 * 2 + 3:  # layer 2, row 2
            raise RuntimeError("attention failed")
        return attention(*args)

    monkeypatch.setattr(lean, "_attention", failing)
    with pytest.raises(RuntimeError, match="attention failed"):
        loaded.forward_batch(caches, [[7, 8, 9], [10, 11], [12, 13]], lengths)
    for cache, reference in zip(caches, untouched, strict=True):
        for a, b in zip(cache.layers, reference.layers, strict=True):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


# -- exactness under concurrency -------------------------------------------------------------


def greedy_session(
    verifier: LocalVerifier, session_id: str, prompt: list[int], ref: list[int], seed: int
) -> list[int]:
    """Greedy decoding of N_TOKENS with arbitrary drafts (correct prefixes of random length,
    then junk), so that rows of a batch accept different numbers of drafts."""
    rng = random.Random(seed)
    out = [first_token(verifier, session_id, prompt, temperature=0.0)]
    while len(out) < N_TOKENS:
        good = ref[len(out) : len(out) + rng.randint(0, 6)]
        junk = [rng.randrange(3, verifier.info.vocab_size) for _ in range(rng.randint(0, 3))]
        out += verifier.verify(session_id, good + junk).token_ids
    return out[:N_TOKENS]


def greedy_tree_session(
    verifier: LocalVerifier, session_id: str, prompt: list[int], ref: list[int], seed: int
) -> list[int]:
    """Greedy decoding of N_TOKENS with draft trees: a junk first branch, then a branch of a
    correct prefix of random length with a junk child, so the verifier takes the second."""
    rng = random.Random(seed)
    out = [first_token(verifier, session_id, prompt, temperature=0.0)]
    while len(out) < N_TOKENS:
        good = ref[len(out) : len(out) + rng.randint(0, 5)]
        junk = rng.randrange(3, verifier.info.vocab_size)
        drafts = [junk, *good, rng.randrange(3, verifier.info.vocab_size)]
        # good[k] is draft 1 + k, a child of good[k - 1] (draft k); the last junk follows the
        # last good one (or the first junk)
        parents = [-1, *(k if k else -1 for k in range(len(good))), len(good)]
        out += verifier.verify(session_id, drafts, draft_parents=parents).token_ids
    return out[:N_TOKENS]


@pytest.mark.parametrize("drafts", ["chains", "trees", "both"])
def test_concurrent_greedy_sessions_match_hf(
    verifier: LocalVerifier, references, drafts: str
) -> None:
    assert verifier.batcher is not None
    hold_first_batch(verifier.batcher, N_SESSIONS - 1)
    outputs: dict[int, list[int]] = {}

    def session(i: int) -> None:
        prompt, ref = references[i]
        tree = drafts == "trees" or (drafts == "both" and i % 2)
        run = greedy_tree_session if tree else greedy_session
        outputs[i] = run(verifier, f"g{i}", prompt, ref, seed=i)

    run_threads(session, N_SESSIONS)
    for i, (_, ref) in enumerate(references):
        assert outputs[i] == ref, f"session {i} differs from Hugging Face greedy"
    batcher = verifier.batcher
    assert batcher.largest >= N_SESSIONS - 1  # the held-back calls shared one forward
    assert batcher.jobs > batcher.forwards


def sampled_session(
    verifier: LocalVerifier, session_id: str, prompt: list[int], seed: int, rounds: int
) -> list[int]:
    """Seeded sampling at temperature 0.8 with drafts of 4 tokens, half of them given a q
    (a two-token distribution), half point-mass; returns every emitted token."""
    rng = random.Random(seed)
    out = [first_token(verifier, session_id, prompt, temperature=0.8, seed=seed)]
    for round_ in range(rounds):
        drafts = [rng.randrange(3, 60) for _ in range(4)]
        q = None
        if round_ % 2:
            q = [SparseDistribution(np.array([d, d + 1]), np.array([0.75, 0.25])) for d in drafts]
        out += verifier.verify(session_id, drafts, q).token_ids
    return out


def test_seeded_sampling_is_the_same_batched_and_unbatched(loaded, references) -> None:
    rounds = 12
    alone = make_verifier(loaded, max_batch=1)
    assert alone.batcher is None
    try:
        expected = [
            sampled_session(alone, f"a{i}", references[i][0], seed=100 + i, rounds=rounds)
            for i in range(N_SESSIONS)
        ]
    finally:
        alone.close()
    batched = make_verifier(loaded, max_batch=8)
    assert batched.batcher is not None
    hold_first_batch(batched.batcher, N_SESSIONS - 1)
    outputs: dict[int, list[int]] = {}

    def session(i: int) -> None:
        outputs[i] = sampled_session(batched, f"b{i}", references[i][0], 100 + i, rounds)

    try:
        run_threads(session, N_SESSIONS)
        assert batched.batcher.largest >= N_SESSIONS - 1
    finally:
        batched.close()
    for i in range(N_SESSIONS):
        assert outputs[i] == expected[i], f"session {i}"
    assert len({tuple(o) for o in expected}) == N_SESSIONS  # the seeds differ


def test_cache_after_a_batched_verify_equals_a_fresh_forward(
    verifier: LocalVerifier, loaded, references
) -> None:
    """One batched round per session (some drafts rejected): each cache then holds exactly
    the prompt and the emitted tokens but the last, as a fresh forward over them does."""
    assert verifier.batcher is not None
    hold_first_batch(verifier.batcher, N_SESSIONS - 1)
    emitted: dict[int, list[int]] = {}

    def session(i: int) -> None:
        prompt, ref = references[i]
        first = first_token(verifier, f"c{i}", prompt, temperature=0.0)
        wrong = (ref[1 + i] + 1) % verifier.info.vocab_size
        drafts = [*ref[1 : 1 + i], wrong, 5]  # i correct drafts, then junk: i accepted
        emitted[i] = [first, *verifier.verify(f"c{i}", drafts).token_ids]

    run_threads(session, N_SESSIONS)
    assert verifier.batcher.largest >= N_SESSIONS - 1
    for i, (prompt, ref) in enumerate(references):
        assert emitted[i] == ref[: i + 2]
        sequence = prompt + emitted[i][:-1]  # the last emitted token is pending, not cached
        fresh = loaded.new_cache()
        loaded.forward(fresh, torch.tensor(sequence), 0, 1)
        with verifier.sessions.use(f"c{i}") as state:
            assert state.length == len(sequence)
            assert state.cache.get_seq_length() == len(sequence)
            for a, b in zip(state.cache.layers, fresh.layers, strict=True):
                assert torch.allclose(a.keys, b.keys, atol=1e-5), f"session {i}"
                assert torch.allclose(a.values, b.values, atol=1e-5), f"session {i}"


def test_a_failed_batch_fails_its_calls_and_keeps_their_sessions(
    verifier: LocalVerifier, references, monkeypatch
) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("batched forward failed")

    assert verifier.batcher is not None
    hold_first_batch(verifier.batcher, 2)
    for i in range(3):
        first_token(verifier, f"f{i}", references[i][0], temperature=0.0)
    monkeypatch.setattr(verifier.model, "forward_batch", broken)
    failures: dict[int, str] = {}

    def session(i: int) -> None:
        try:
            verifier.verify(f"f{i}", references[i][1][1:4])
        except RuntimeError as exc:
            failures[i] = str(exc)

    run_threads(session, 3)
    assert len(failures) == 2  # the two calls of the batched forward; the first ran alone
    assert set(failures.values()) == {"batched forward failed"}
    monkeypatch.undo()
    for i in failures:  # the failed sessions go on from where they were
        prompt, ref = references[i]
        with verifier.sessions.use(f"f{i}") as state:
            assert state.length == state.cache.get_seq_length() == len(prompt)
        assert verifier.verify(f"f{i}", ref[1:6]).token_ids == ref[1:7]


# -- configuration ---------------------------------------------------------------------------


def test_a_verify_reports_the_rows_of_the_forward_that_ran_it(loaded, references) -> None:
    """The gateway's sizer prices a draft by the rows it shares a forward with: each Verify
    says how many there were (1 alone)."""
    batched, alone = make_verifier(loaded, max_batch=8), make_verifier(loaded, max_batch=1)
    try:
        assert batched.batcher is not None
        hold_first_batch(batched.batcher, N_SESSIONS - 1)
        rows: dict[str, list[int]] = {"batched": [], "alone": []}

        def session(i: int) -> None:
            prompt, ref = references[i]
            for name, verifier in (("batched", batched), ("alone", alone)):
                first_token(verifier, f"r{i}", prompt, temperature=0.0)
                rows[name].append(verifier.verify(f"r{i}", ref[1:4]).batch_rows)

        run_threads(session, N_SESSIONS)
        assert max(rows["batched"]) >= N_SESSIONS - 1
        assert rows["alone"] == [1] * N_SESSIONS
    finally:
        batched.close()
        alone.close()


def test_the_rows_travel_over_the_wire_and_an_older_server_counts_as_alone() -> None:
    result = VerifyResult(1, [5, 6], seconds=0.01, batch_rows=3)
    assert verify_result_from_pb(verify_result_to_pb(result)).batch_rows == 3
    older = verifier_pb2.VerifyResponse(accepted_count=0, token_ids=[5])  # no batch_rows
    assert verify_result_from_pb(older).batch_rows == 1


def test_max_batch_one_runs_every_call_alone(loaded, references) -> None:
    v = make_verifier(loaded, max_batch=1)
    try:
        assert v.batcher is None
        prompt, ref = references[0]
        assert greedy_session(v, "one", prompt, ref, seed=0) == ref
    finally:
        v.close()


def test_batcher_needs_two_rows(loaded) -> None:
    with pytest.raises(ValueError, match="max_batch"):
        VerifyBatcher(loaded, 1, lambda fn: fn())
    with pytest.raises(ValueError):
        VerifierConfig(model_name="m", max_batch=0)


def test_serve_verifier_rejects_a_bad_max_batch(capsys) -> None:
    from launcher.cli import main

    args = ["serve-verifier", "--model", str(STORIES_MODEL), "--port", "0", "--max-batch", "0"]
    assert main(args) == 2  # before any model is loaded
    err = capsys.readouterr().err
    assert err.startswith("speculant serve-verifier: error: invalid max_batch: "), err


# -- sampling controls per row ---------------------------------------------------------------
# Concurrent sessions with different controls (each row of a batched forward processed with its
# own penalties, history, temperature and warpers) emit the same seeded tokens, with the same
# logprobs, as each session run on its own.

ROUNDS = 10
# A batched forward rounds differently from a forward of its own: about 1e-5 in log p, the
# float32 noise of the model (tests/test_logprobs.py); a wrong control is off by far more.
LOGPROB_TOLERANCE = 5e-5
# (temperature, controls) per session: every control, and a greedy one, in one batch
SESSIONS = [
    (0.8, SamplingControls(top_k=10, repetition_penalty=1.3)),
    (1.0, SamplingControls(top_p=0.8, frequency_penalty=1.0)),
    (1.0, SamplingControls(min_p=0.1, presence_penalty=1.0)),
    (0.7, SamplingControls()),
    (0.0, SamplingControls(repetition_penalty=1.5, frequency_penalty=0.5)),
    (1.0, SamplingControls(top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.2)),
]


def run_session(verifier: LocalVerifier, tag: str, index: int, prompt: list[int]) -> list:
    """One seeded session: the first token, then ROUNDS verifications of 4 drafts (half of the
    rounds with a q, half point-mass); every emitted (token, logprobs)."""
    temperature, controls = SESSIONS[index]
    rng = random.Random(index)
    session_id = f"{tag}{index}"
    options = SessionOptions(temperature, controls, seed=100 + index, top_logprobs=3)
    first = verifier.start(session_id, prompt, options)
    out = list(zip(first.token_ids, first.logprobs, strict=True))
    for round_ in range(ROUNDS):
        drafts = [rng.randrange(3, 60) for _ in range(4)]
        q = None
        if round_ % 2:
            q = [SparseDistribution(np.array([d, d + 1]), np.array([0.75, 0.25])) for d in drafts]
        result = verifier.verify(session_id, drafts, q)
        out += list(zip(result.token_ids, result.logprobs, strict=True))
    verifier.release(session_id)
    return out


def test_controls_are_per_row_in_a_batch(loaded):
    prompts = [loaded.tokenizer(p).input_ids for p in load_dev_prompts(len(SESSIONS))]
    config = VerifierConfig(model_name=str(STORIES_MODEL), max_batch=1)
    alone = LocalVerifier(config, model=loaded)
    try:
        expected = [run_session(alone, "a", i, p) for i, p in enumerate(prompts)]
    finally:
        alone.close()
    batched = LocalVerifier(config.model_copy(update={"max_batch": 8}), model=loaded)
    assert batched.batcher is not None, "stories260K batches verify calls"
    hold_first_batch(batched.batcher, len(SESSIONS) - 1)
    outputs: dict[int, list] = {}

    def session(i: int) -> None:
        outputs[i] = run_session(batched, "b", i, prompts[i])

    try:
        run_threads(session, len(SESSIONS))
        assert batched.batcher.largest >= len(SESSIONS) - 1, "the sessions should share batches"
    finally:
        batched.close()
    for i, want in enumerate(expected):
        got = outputs[i]
        assert [t for t, _ in got] == [t for t, _ in want], f"session {i}: other tokens"
        for (_, a), (_, b) in zip(got, want, strict=True):
            assert a.token_id == b.token_id and a.top_token_ids == b.top_token_ids
            assert abs(a.logprob - b.logprob) <= LOGPROB_TOLERANCE, f"session {i}: {a} != {b}"
            assert np.allclose(a.top_logprobs, b.top_logprobs, atol=LOGPROB_TOLERANCE, rtol=0)
    assert len({tuple(t for t, _ in o) for o in expected}) == len(SESSIONS)


# -- through the gateway ---------------------------------------------------------------------

N_STREAMS = 8
GATEWAY_PROMPTS = 16
GATEWAY_TOKENS = 96


@pytest.fixture(scope="module")
def gateway(tinystories_graph) -> Iterator[tuple[gateway_pb2_grpc.GatewayServiceStub, object]]:
    """Draft service, verifier (max_batch 8) and gateway on localhost ports, in process:
    (the gateway's stub, the LocalVerifier behind it)."""
    from draft_service.server import start_server as start_draft
    from gateway.api.server import start_gateway
    from verifier_service.server import start_server as start_verifier

    draft = start_draft(tinystories_graph, port=0)
    config = VerifierConfig(model_name=str(STORIES_MODEL), device="cpu", max_batch=8)
    verifier_server, local_verifier = start_verifier(config, port=0)
    # A long draft timeout: a round without its draft (on a busy machine) would change the
    # tokens of a seeded sampling request (not their distribution).
    gateway_server, _ = start_gateway(
        [draft.address], verifier_server.address, port=0, draft_timeout_s=30.0
    )
    channel = grpc.insecure_channel(gateway_server.address)
    try:
        yield gateway_pb2_grpc.GatewayServiceStub(channel), local_verifier
    finally:
        channel.close()
        gateway_server.stop(0)
        verifier_server.stop(0)
        local_verifier.close()
        draft.stop(0)


def generate_concurrently(stub, requests: list[gateway_pb2.GenerateRequest]) -> list[list[int]]:
    """Each request's tokens, sent over N_STREAMS threads (request i on thread i % N_STREAMS)."""
    outputs: dict[int, list[int]] = {}

    def stream(t: int) -> None:
        for i in range(t, len(requests), N_STREAMS):
            outputs[i] = list(stub.Generate(requests[i], timeout=120).token_ids)

    run_threads(stream, N_STREAMS)
    return [outputs[i] for i in range(len(requests))]


# verify batching serves chains (draft trees are verified one at a time)
CHAINS = common_pb2.DraftOptions(tree_nodes=0)


# The demo kit's 8 prompts in the default suite, the next 8 with `-m slow` (tests/conftest.py).
SLOW_CASES = {"test_concurrent_streams_through_the_gateway_stay_exact": {"prompts8-16"}}


@pytest.mark.parametrize("prompt_set", dev_prompt_sets(GATEWAY_PROMPTS))
def test_concurrent_streams_through_the_gateway_stay_exact(gateway, loaded, prompt_set) -> None:
    """8 concurrent greedy streams are token-identical to Hugging Face greedy decoding, and
    8 concurrent seeded sampling streams give the tokens the same requests give one by one."""
    stub, local_verifier = gateway
    prompts = load_dev_prompts(*prompt_set)
    plain = PlainDecoder.load(str(STORIES_MODEL), list(local_verifier.info.eos_token_ids))
    references = [
        plain.generate(loaded.tokenizer(p).input_ids, GATEWAY_TOKENS).token_ids for p in prompts
    ]
    greedy = [
        gateway_pb2.GenerateRequest(
            prompt=p, max_tokens=GATEWAY_TOKENS, temperature=0.0, draft=CHAINS
        )
        for p in prompts
    ]
    hold_first_batch(local_verifier.batcher, N_STREAMS - 1)
    outputs = generate_concurrently(stub, greedy)
    mismatches = [i for i, (a, b) in enumerate(zip(outputs, references, strict=True)) if a != b]
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    batcher = local_verifier.batcher
    assert batcher.largest >= 2 and batcher.jobs > batcher.forwards

    sampled = [
        gateway_pb2.GenerateRequest(
            prompt=p, max_tokens=GATEWAY_TOKENS, temperature=0.8, seed=1000 + i, draft=CHAINS
        )
        for i, p in enumerate(prompts)
    ]
    one_by_one = [list(stub.Generate(r, timeout=120).token_ids) for r in sampled]
    assert generate_concurrently(stub, sampled) == one_by_one
