"""Exactness, sampling: speculative decoding samples from the target model's distribution,
plain and with the controls (top_k, top_p, min_p and the penalties).

Plain: the first two generated tokens after a fixed prompt, over 5,000 seeded runs of the
embedded decoder, are compared with their exact joint probabilities computed from the model
(P(t1, t2) = p(t1 | prompt) * p(t2 | prompt, t1)) by a chi-square test. The first token comes
from the prefill, the second from rejection sampling of a draft; with max_tokens=3 the second
round verifies exactly one draft token. The same test run with a deliberately wrong rejection
rule must fail: that shows the test has the power to catch a wrong rule.

With controls: speculative decoding with sampling controls must sample exactly what Hugging Face
``generate(do_sample=True, ...)`` with the same settings samples: at each position the target's
*processed* distribution p (the penalties over the prompt and every token before the position,
then temperature, top_k, top_p, min_p; see tests/sampling_checks.py), computed here with Hugging
Face's own logits processors.

Each test draws the first two tokens of 3,000 seeded requests with max_tokens=3: the first
token comes from the prefill, the second from verifying a one-position draft (a chain of one
token, or a tree of sibling drafts), so it is a token decided by verification (the tests check
that the rounds did have drafts, and that some drafts were accepted and some corrected). A
chi-square test compares the pairs, and the first tokens alone, with their exact law (p > 1e-3),
and no pair may fall outside its support (a token top_k, top_p or min_p removed).

Negative controls, on the same samples: the law without the controls, and the law with the
controls on the first token only (a wrongly verified second token), must both fail the test
(p < 1e-3): the test can see each control, at the verified position too.

The default suite runs one combination embedded; one over the services and the full matrix
(each control alone, at temperature 0.8 and 1.0, embedded and over the services, with greedy
and sampled drafts, chains and trees) are marked slow.
"""

from __future__ import annotations

import pytest

from speculant.config import DraftParams, SamplingControls
from speculant.v1 import common_pb2
from tests.fixtures.e2e import verifier_config
from tests.sampling_checks import (
    PROMPT,
    PairSample,
    chi_square_p_value,
    exact_joint,
    model_joint,
    outside_support,
    sample_pairs,
    sample_pairs_embedded,
    sample_pairs_over_gateway,
)
from verifier_service import sampling

# -- plain sampling ----------------------------------------------------------------------------


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


# -- sampling with controls --------------------------------------------------------------------

RUNS = 3000
# Prompts where each control moves a lot of mass at both positions (so that the negative
# controls fail by far): likely continuations that the warpers cut, and likely continuations
# that already occurred (the penalties).
WARPER_PROMPT = "The cat sat on the mat. The cat"
PENALTY_PROMPT = "Lily saw a big dog. The dog was big and the dog"

# Each control alone: (its setting, the prompt that shows it).
CONTROLS = {
    "top_k": ({"top_k": 10}, WARPER_PROMPT),
    "top_p": ({"top_p": 0.8}, WARPER_PROMPT),
    "min_p": ({"min_p": 0.1}, WARPER_PROMPT),
    "repetition_penalty": ({"repetition_penalty": 1.3}, PENALTY_PROMPT),
    "presence_penalty": ({"presence_penalty": 1.0}, PENALTY_PROMPT),
    "frequency_penalty": ({"frequency_penalty": 1.0}, PENALTY_PROMPT),
}
# The draft of the second round, by (mode, temperature): (strategy, tree_nodes; 0 = a chain),
# so that every control is checked with greedy and sampled drafts, chains and trees.
DRAFT_SHAPES = {
    ("embedded", 0.8): ("greedy", 0),
    ("embedded", 1.0): ("sampling", 12),
    ("services", 0.8): ("sampling", 0),
    ("services", 1.0): ("greedy", 12),
}
MIN_CELLS = 5  # min_p and top_p leave few likely pairs
STRATEGY_PB = {
    "greedy": common_pb2.DRAFT_STRATEGY_GREEDY,
    "sampling": common_pb2.DRAFT_STRATEGY_SAMPLING,
}


def sample_embedded(decoder, prompt: str, temperature: float, controls: dict, shape) -> PairSample:
    strategy, tree_nodes = shape
    draft = DraftParams(k=4, strategy=strategy, tree_nodes=tree_nodes)
    prompt_ids = decoder.tokenizer(prompt).input_ids
    sampling = SamplingControls(**controls)
    return sample_pairs_embedded(decoder, prompt_ids, temperature, draft, sampling, RUNS)


def sample_services(services, tokenizer, prompt: str, temperature: float, controls: dict, shape):
    strategy, tree_nodes = shape
    draft = common_pb2.DraftOptions(k=4, strategy=STRATEGY_PB[strategy], tree_nodes=tree_nodes)
    sampling = common_pb2.SamplingControls(**controls)
    prompt_ids = tokenizer(prompt).input_ids
    return sample_pairs_over_gateway(
        services.gateway, prompt_ids, temperature, draft, sampling, RUNS
    )


def check_follows_processed_law(
    model, prompt_ids: list[int], temperature: float, controls: dict, sample: PairSample
) -> None:
    """The samples follow the processed law, and fail against the two wrong laws."""
    sampling = SamplingControls(**controls)
    runs = sample.runs
    assert sample.drafted >= 0.9 * runs, f"only {sample.drafted} of {runs} rounds had drafts"
    assert 0 < sample.accepted < sample.drafted, (
        f"{sample.accepted} of {sample.drafted} drafts accepted: both verification outcomes "
        "(accepted and corrected) should decide some second tokens"
    )
    joint = model_joint(model, prompt_ids, temperature, sampling)  # [V, V]
    impossible = outside_support(joint, sample.counts)
    assert not impossible, f"pairs of probability 0 under the processed law: {impossible}"
    p_first = chi_square_p_value(joint.sum(axis=1), sample.first_tokens(), min_cells=2)
    assert p_first > 1e-3, f"first tokens do not follow the processed law (p = {p_first:.2e})"
    p_joint = chi_square_p_value(joint, sample.counts, MIN_CELLS)
    assert p_joint > 1e-3, f"pairs do not follow the processed law (p = {p_joint:.2e})"

    plain = model_joint(model, prompt_ids, temperature)
    p_plain = chi_square_p_value(plain, sample.counts, MIN_CELLS)
    assert p_plain < 1e-3, f"negative control: the unprocessed law passes (p = {p_plain:.2e})"
    first_only = model_joint(model, prompt_ids, temperature, sampling, second_sampling=None)
    p_first_only = chi_square_p_value(first_only, sample.counts, MIN_CELLS)
    assert p_first_only < 1e-3, (
        f"negative control: the law with an unprocessed second token passes "
        f"(p = {p_first_only:.2e})"
    )
    print(  # shown with -s (or -rP): the figures behind the verdict
        f"{controls} T={temperature}: p(pairs) = {p_joint:.3f}, p(first) = {p_first:.3f}; "
        f"negative controls p = {p_plain:.1e} (unprocessed), {p_first_only:.1e} (unprocessed "
        f"second token); {sample.drafted}/{runs} drafted, {sample.accepted} accepted"
    )


# One combination per mode in the default suite.
EMBEDDED_COMBINATION = {"top_k": 20, "top_p": 0.9, "repetition_penalty": 1.3}
SERVICES_COMBINATION = {"min_p": 0.05, "frequency_penalty": 1.0}


def test_controls_combined_embedded(embedded_decoder):
    """top_k + top_p + repetition_penalty at temperature 0.8, sampled drafts in a tree."""
    sample = sample_embedded(
        embedded_decoder, PENALTY_PROMPT, 0.8, EMBEDDED_COMBINATION, ("sampling", 12)
    )
    prompt_ids = embedded_decoder.tokenizer(PENALTY_PROMPT).input_ids
    model = embedded_decoder.verifier.model.model
    check_follows_processed_law(model, prompt_ids, 0.8, EMBEDDED_COMBINATION, sample)


@pytest.mark.slow  # 50 s: the default suite checks the services with controls at temperature
# 0 (test_penalised_greedy.py, test_generation_config.py) and their logprobs (test_logprobs.py)
def test_controls_combined_over_services(services, embedded_decoder):
    """min_p + frequency_penalty at temperature 1.0 through the gateway, greedy chain drafts."""
    tokenizer = embedded_decoder.tokenizer
    sample = sample_services(
        services, tokenizer, PENALTY_PROMPT, 1.0, SERVICES_COMBINATION, ("greedy", 0)
    )
    prompt_ids = tokenizer(PENALTY_PROMPT).input_ids
    model = embedded_decoder.verifier.model.model
    check_follows_processed_law(model, prompt_ids, 1.0, SERVICES_COMBINATION, sample)


MATRIX = [
    pytest.param(name, temperature, id=f"{name}-T{temperature}")
    for name in CONTROLS
    for temperature in (0.8, 1.0)
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "temperature"), MATRIX)
def test_each_control_embedded(embedded_decoder, name, temperature):
    controls, prompt = CONTROLS[name]
    shape = DRAFT_SHAPES[("embedded", temperature)]
    sample = sample_embedded(embedded_decoder, prompt, temperature, controls, shape)
    prompt_ids = embedded_decoder.tokenizer(prompt).input_ids
    model = embedded_decoder.verifier.model.model
    check_follows_processed_law(model, prompt_ids, temperature, controls, sample)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "temperature"), MATRIX)
def test_each_control_over_services(services, embedded_decoder, name, temperature):
    controls, prompt = CONTROLS[name]
    shape = DRAFT_SHAPES[("services", temperature)]
    tokenizer = embedded_decoder.tokenizer
    sample = sample_services(services, tokenizer, prompt, temperature, controls, shape)
    model = embedded_decoder.verifier.model.model
    check_follows_processed_law(model, tokenizer(prompt).input_ids, temperature, controls, sample)
