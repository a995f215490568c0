"""Exactness, greedy with penalties: speculative greedy decoding (temperature 0) with a
repetition penalty, or OpenAI's presence/frequency penalties, is token-identical to Hugging
Face ``generate(do_sample=False, repetition_penalty=...)`` (the OpenAI penalties given to
generate as a logits processor, tests/sampling_checks.py OpenAIPenalties) on the demo kit's
dev prompts, embedded and over the services, with chain and tree drafts.

A penalty makes every position's argmax depend on all the tokens before it, the drafts the
same round accepted included: a verifier that penalised from a stale history (say, the
context at the start of the round) would differ within a few rounds. Warpers (top_k, top_p)
set on a greedy request cannot change the argmax, and do not.
"""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from speculant.config import DraftConfig, GenerationConfig, SamplingControls
from speculant.v1 import common_pb2
from tests.assets import STORIES_MODEL, load_dev_prompts
from tests.exactness_checks import assert_drafts_served
from tests.sampling_checks import greedy_over_gateway, hf_generate

MAX_TOKENS = 64
PENALTIES = {
    "repetition": {"repetition_penalty": 1.3},
    "presence-frequency": {"presence_penalty": 0.5, "frequency_penalty": 0.5},
    "all-and-warpers": {
        "repetition_penalty": 1.2,
        "presence_penalty": 0.3,
        "frequency_penalty": 0.4,
        "top_k": 5,
        "top_p": 0.5,
    },
}
EOS = [2]  # stories260K's


@pytest.fixture(scope="module")
def hf_model():
    """stories260K as Hugging Face loads it (its own generation_config, no penalty)."""
    return AutoModelForCausalLM.from_pretrained(STORIES_MODEL).eval()


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return load_dev_prompts(8)


@pytest.fixture(scope="module")
def references(hf_model, tokenizer, prompts) -> dict[str, list[list[int]]]:
    """generate(do_sample=False) with each PENALTIES setting, per prompt."""
    return {
        name: [
            hf_generate(
                hf_model, tokenizer(p).input_ids, MAX_TOKENS, EOS, SamplingControls(**controls)
            )
            for p in prompts
        ]
        for name, controls in PENALTIES.items()
    }


def test_the_penalties_change_greedy_output(hf_model, tokenizer, prompts, references):
    """The references differ from plain greedy decoding (else the tests below prove nothing)."""
    plain = [hf_generate(hf_model, tokenizer(p).input_ids, MAX_TOKENS, EOS) for p in prompts]
    for name, outputs in references.items():
        differing = sum(a != b for a, b in zip(outputs, plain, strict=True))
        assert differing >= len(prompts) - 1, f"{name}: only {differing} prompts differ"


# In the default suite: each setting once, greedy and sampled drafts, chains and trees; the
# other combinations are slow.
DEFAULT_EMBEDDED = {
    ("repetition", "greedy", 12),
    ("presence-frequency", "sampling", 0),
    ("all-and-warpers", "sampling", 12),
}
EMBEDDED_CONFIGS = [
    pytest.param(
        name,
        strategy,
        tree_nodes,
        id=f"{name}-{strategy}-{shape}",
        marks=() if (name, strategy, tree_nodes) in DEFAULT_EMBEDDED else pytest.mark.slow,
    )
    for name in PENALTIES
    for strategy in ("greedy", "sampling")
    for tree_nodes, shape in ((0, "chain"), (12, "tree"))
]


@pytest.mark.parametrize(("name", "strategy", "tree_nodes"), EMBEDDED_CONFIGS)
def test_penalised_greedy_identical_embedded(
    embedded_decoder, prompts, references, name, strategy, tree_nodes
):
    generation = GenerationConfig(max_tokens=MAX_TOKENS, temperature=0.0, seed=0, **PENALTIES[name])
    draft = DraftConfig(k=4, strategy=strategy, tree_nodes=tree_nodes)
    accepted = 0
    for i, prompt in enumerate(prompts):
        result = embedded_decoder.generate(
            prompt=prompt, generation_config=generation, draft_config=draft
        )
        assert result.token_ids == references[name][i], f"prompt {i} differs from generate"
        accepted += result.stats.accepted_tokens
    assert accepted > MAX_TOKENS, "verification should have accepted drafts"


SERVICE_CONFIGS = [
    pytest.param("repetition", common_pb2.DRAFT_STRATEGY_GREEDY, 12, id="repetition-greedy-tree"),
    pytest.param(
        "presence-frequency", common_pb2.DRAFT_STRATEGY_SAMPLING, 0, id="pf-sampling-chain"
    ),
    pytest.param(
        "all-and-warpers",
        common_pb2.DRAFT_STRATEGY_GREEDY,
        0,
        id="all-greedy-chain",
        marks=pytest.mark.slow,
    ),
]


@pytest.mark.parametrize(("name", "strategy", "tree_nodes"), SERVICE_CONFIGS)
def test_penalised_greedy_identical_over_services(
    services, prompts, references, name, strategy, tree_nodes
):
    draft = common_pb2.DraftOptions(k=4, strategy=strategy, tree_nodes=tree_nodes)
    sampling = common_pb2.SamplingControls(**PENALTIES[name])
    responses = greedy_over_gateway(services.gateway, prompts, MAX_TOKENS, draft, sampling)
    for i, response in enumerate(responses):
        assert list(response.token_ids) == references[name][i], f"prompt {i} differs"
    stats = [response.stats for response in responses]
    assert_drafts_served(stats)
    assert sum(s.accepted_tokens for s in stats) > MAX_TOKENS
