"""Exactness, sampling: speculative decoding samples from the target model's distribution.

The first two generated tokens after a fixed prompt, over 5,000 seeded runs of the embedded
decoder, are compared with their exact joint probabilities computed from the model
(P(t1, t2) = p(t1 | prompt) * p(t2 | prompt, t1)) by a chi-square test. The first token comes
from the prefill, the second from rejection sampling of a draft; with max_tokens=3 the second
round verifies exactly one draft token. The same test run with a deliberately wrong rejection
rule must fail: that shows the test has the power to catch a wrong rule.
"""

from __future__ import annotations

import pytest

from tests.fixtures.e2e import verifier_config
from tests.sampling_checks import (
    PROMPT,
    chi_square_p_value,
    exact_joint,
    sample_pairs,
)
from verifier_service import sampling


@pytest.mark.parametrize(
    ("temperature", "strategy"),
    [
        (1.0, "sampling"),
        pytest.param(0.7, "greedy", marks=pytest.mark.slow),
        pytest.param(0.7, "sampling", marks=pytest.mark.slow),
    ],
)
def test_first_two_tokens_follow_the_model(embedded_decoder, temperature, strategy):
    prompt_ids = embedded_decoder.tokenizer(PROMPT).input_ids
    joint = exact_joint(embedded_decoder, prompt_ids, temperature)
    counts = sample_pairs(embedded_decoder, prompt_ids, temperature, strategy)
    p_value = chi_square_p_value(joint, counts)
    assert p_value > 1e-3, f"sampled pairs do not follow the model (p = {p_value:.2e})"


def test_a_wrong_rejection_rule_is_caught(embedded_decoder, monkeypatch):
    """Negative control: draw the corrected token from p instead of the residual max(0, p - q)."""

    def wrong_residual(p, q, draft_id):
        return p.clone()

    monkeypatch.setattr(sampling, "residual_distribution", wrong_residual)
    prompt_ids = embedded_decoder.tokenizer(PROMPT).input_ids
    joint = exact_joint(embedded_decoder, prompt_ids, 1.0)
    counts = sample_pairs(embedded_decoder, prompt_ids, 1.0, "sampling")
    p_value = chi_square_p_value(joint, counts)
    assert p_value < 1e-6, f"the test failed to catch a wrong rule (p = {p_value:.2e})"


@pytest.mark.slow  # the rule of test_first_two_tokens_follow_the_model, on a learning graph
@pytest.mark.parametrize("strategy", ["greedy", "sampling"])
def test_first_two_tokens_follow_the_model_while_learning(learning_decoder, strategy):
    """Learning on: the decoder learns from each of the 3,000 runs, so the drafts (and, for
    sampled drafts, the q they report) change from run to run; the law of the output does not."""
    prompt_ids = learning_decoder.tokenizer(PROMPT).input_ids
    joint = exact_joint(learning_decoder, prompt_ids, 1.0)
    before = learning_decoder.live.stats().learned_documents
    counts = sample_pairs(learning_decoder, prompt_ids, 1.0, strategy, tree_nodes=12, runs=3000)
    assert learning_decoder.live.stats().learned_documents == before + 3000
    p_value = chi_square_p_value(joint, counts)
    assert p_value > 1e-3, f"sampled pairs do not follow the model (p = {p_value:.2e})"


@pytest.mark.slow  # the same rule on another graph's q (the default suite: the tinystories one)
def test_first_two_tokens_follow_the_model_with_a_distilled_graph(distilled_graph):
    from gateway import SpeculativeDecoder

    decoder = SpeculativeDecoder(distilled_graph, verifier_config(), learn=False)
    prompt_ids = decoder.tokenizer(PROMPT).input_ids
    joint = exact_joint(decoder, prompt_ids, 1.0)
    counts = sample_pairs(decoder, prompt_ids, 1.0, "sampling", tree_nodes=12, runs=3000)
    p_value = chi_square_p_value(joint, counts)
    assert p_value > 1e-3, f"sampled pairs do not follow the model (p = {p_value:.2e})"
