"""The round loop's bookkeeping, with a scripted verifier: stop conditions, streaming, stats.

The verifier here (tests/scripted_round.py) emits a fixed token sequence (the "model's" output)
and accepts exactly the draft tokens that match it, as greedy verification does; exactness
against the real model is tested in tests/test_exactness.py.
"""

from __future__ import annotations

import pytest

from gateway.generation import FinishReason, GenerationRequest, GenerationResult
from speculant.config import DraftParams
from speculant.errors import InvalidArgumentError, OutOfRangeError
from tests.scripted_round import STORY, run, setup


def test_eos_ends_generation_and_is_not_returned(tokenizer):
    coordinator, verifier, _, prompt, script = setup(tokenizer)
    chunks, result = run(coordinator, prompt, max_tokens=500, draft=DraftParams(k=4))
    assert result.finish_reason == FinishReason.EOS
    assert result.token_ids == script[:-1]
    assert result.text == " " + STORY  # the continuation of "Hello" starts with a space
    assert verifier.released, "the verifier session must be released"
    assert [t for c in chunks for t in c.token_ids] == result.token_ids
    assert "".join(c.text_delta for c in chunks) == result.text


def test_perfect_drafts_give_k_plus_one_tokens_per_round(tokenizer):
    coordinator, verifier, _, prompt, _ = setup(tokenizer)
    _, result = run(coordinator, prompt, max_tokens=500, draft=DraftParams(k=4))
    stats = result.stats
    assert stats.rounds == 1 + len(verifier.verify_calls)  # the prefill counts as a round
    assert stats.accepted_tokens == stats.draft_tokens
    assert stats.acceptance_rate == 1.0
    assert stats.tokens_per_round > 3.0
    assert stats.accepted_by_position[0] == len(verifier.verify_calls)


def test_acceptance_by_position_counts_the_first_rejection(tokenizer):
    coordinator, verifier, _, prompt, _ = setup(tokenizer, wrong_at=2)
    _, result = run(coordinator, prompt, max_tokens=500, draft=DraftParams(k=4))
    stats = result.stats
    full_rounds = sum(1 for n in verifier.verify_calls if n >= 3)
    assert stats.accepted_by_position[2] == 0  # position 2 is always wrong
    assert stats.accepted_by_position[0] == stats.accepted_by_position[1] >= full_rounds
    assert stats.accepted_tokens < stats.draft_tokens
    assert result.token_ids == verifier.script[:-1]  # wrong drafts never change the output


def test_max_tokens_is_never_exceeded_and_drafts_shrink_to_fit(tokenizer):
    coordinator, verifier, _, prompt, script = setup(tokenizer)
    chunks, result = run(coordinator, prompt, max_tokens=7, draft=DraftParams(k=4))
    assert result.finish_reason == FinishReason.MAX_TOKENS
    assert result.token_ids == script[:7]
    assert sum(verifier.verify_calls) + len(verifier.verify_calls) + 1 == 7  # no wasted drafts
    assert [t for c in chunks for t in c.token_ids] == result.token_ids


def test_max_tokens_zero_runs_no_model(tokenizer):
    coordinator, verifier, _, prompt, _ = setup(tokenizer)
    _, result = run(coordinator, prompt, max_tokens=0)
    assert result.token_ids == [] and result.finish_reason == FinishReason.MAX_TOKENS
    assert result.stats.rounds == 0 and verifier.verify_calls == []


def test_stop_string_cuts_text_and_tokens(tokenizer):
    coordinator, _, _, prompt, _ = setup(tokenizer)
    chunks, result = run(coordinator, prompt, max_tokens=500, stop=("little girl",))
    assert result.finish_reason == FinishReason.STOP
    assert result.text == " Once upon a time, there was a "
    assert "little" not in tokenizer.decode(result.token_ids)
    assert "".join(c.text_delta for c in chunks) == result.text
    assert [t for c in chunks for t in c.token_ids] == result.token_ids


def test_context_length_stops_generation(tokenizer):
    coordinator, _, _, prompt, script = setup(
        tokenizer, max_context_length=len(prompt_of(tokenizer)) + 5
    )
    _, result = run(coordinator, prompt, max_tokens=100, draft=DraftParams(k=8))
    assert result.finish_reason == FinishReason.CONTEXT_LENGTH
    assert result.token_ids == script[:5]


def prompt_of(tokenizer):
    return tokenizer("Hello").input_ids


def test_prompt_that_fills_the_context_is_out_of_range(tokenizer):
    coordinator, _, _, prompt, _ = setup(tokenizer, max_context_length=len(prompt_of(tokenizer)))
    with pytest.raises(OutOfRangeError, match="prompt"):
        run(coordinator, prompt)


@pytest.mark.parametrize("draft_size", ["fixed", "cost"])
def test_failing_drafter_never_fails_the_request(tokenizer, draft_size):
    coordinator, verifier, _, prompt, script = setup(tokenizer, failing=True)
    draft = DraftParams(k=4, draft_size=draft_size)
    _, result = run(coordinator, prompt, max_tokens=500, draft=draft)
    assert result.token_ids == script[:-1]
    assert result.stats.draft_tokens == 0
    if draft_size == "fixed":  # a draft is asked for (and fails) every round
        assert result.stats.draft_failures == len(verifier.verify_calls) > 0
    else:  # the sizer stops asking after empty drafts, probing now and then
        assert 0 < result.stats.draft_failures < len(verifier.verify_calls)


def test_drafter_sees_the_tail_of_prompt_and_output(tokenizer):
    coordinator, _, drafter, prompt, script = setup(tokenizer)
    run(coordinator, prompt, max_tokens=10, draft=DraftParams(k=2, overlay_weight=0.0))
    assert drafter.contexts[0] == (prompt + script[:1])[-5:]
    assert all(len(c) <= 5 for c in drafter.contexts)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"draft": DraftParams(k=0)}, "draft.k"),
        ({"draft": DraftParams(k=65)}, "draft.k"),
        ({"draft": DraftParams(mix_temperature=0)}, "draft.mix_temperature"),
        ({"draft": DraftParams(order_bias=-1)}, "draft.order_bias"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_bad_parameters_name_the_field(tokenizer, kwargs, field):
    coordinator, verifier, _, prompt, _ = setup(tokenizer)
    with pytest.raises(InvalidArgumentError) as info:
        run(coordinator, prompt, **kwargs)
    assert info.value.field == field
    assert verifier.position == 0  # nothing ran


def test_cancellation_stops_the_rounds_and_releases(tokenizer):
    coordinator, verifier, _, prompt, _ = setup(tokenizer)
    request = GenerationRequest(prompt_ids=prompt, max_tokens=500, draft=DraftParams(k=1))
    items = list(coordinator.stream(request, cancelled=lambda: len(verifier.verify_calls) >= 2))
    assert not any(isinstance(i, GenerationResult) for i in items)
    assert len(verifier.verify_calls) == 2
    assert verifier.released
