"""Sampling controls under verify batching: concurrent sessions with different controls (each
row of a batched forward processed with its own penalties, history, temperature and warpers)
emit the same seeded tokens, with the same logprobs, as each session run on its own."""

from __future__ import annotations

import random

import numpy as np

from speculant.config import SamplingControls, SessionOptions, VerifierConfig
from speculant.types import SparseDistribution
from tests.assets import STORIES_MODEL, load_dev_prompts
from tests.test_batching import hold_first_batch, run_threads
from verifier_service.verifier import LocalVerifier

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
