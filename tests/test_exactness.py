"""Exactness, greedy: speculative decoding at temperature 0 is token-identical to Hugging Face
`generate(do_sample=False)` of the same model, on every dev prompt, embedded and over the
services, for every drafting strategy with and without attentive mixing; and it needs well
under one verifier forward per token (verification is parallel)."""

from __future__ import annotations

import pytest

from gateway.baseline import PlainDecoder
from speculant.config import DraftConfig, GenerationConfig
from speculant.v1 import common_pb2, gateway_pb2
from tests.conftest import STORIES_MODEL, load_dev_prompts
from tests.e2e_fixtures import embedded_decoder, services  # noqa: F401  (fixtures)

MAX_TOKENS = 128
K = 8
CONFIGS = [
    pytest.param("greedy", True, id="greedy-mix"),
    pytest.param("greedy", False, id="greedy-backoff"),
    pytest.param("sampling", True, id="sampling-mix"),
    pytest.param("sampling", False, id="sampling-backoff"),
]


@pytest.fixture(scope="session")
def dev_prompts() -> list[str]:
    return load_dev_prompts()


@pytest.fixture(scope="session")
def reference_outputs(embedded_decoder, dev_prompts) -> list[list[int]]:  # noqa: F811
    """Plain greedy decoding with Hugging Face generate, per dev prompt."""
    plain = PlainDecoder.load(str(STORIES_MODEL), embedded_decoder.verifier.info.eos_token_ids)
    tokenizer = embedded_decoder.tokenizer
    return [plain.generate(tokenizer(p).input_ids, MAX_TOKENS).token_ids for p in dev_prompts]


# Verification is parallel: clearly fewer verifier forwards than generated tokens. Sampled drafts
# are accepted less often by a greedy (temperature 0) target than argmax drafts, hence two bounds.
MAX_ROUNDS_PER_TOKEN = {"greedy": 0.6, "sampling": 0.9}


def assert_parallel(rounds: int, tokens: int, strategy: str) -> None:
    bound = MAX_ROUNDS_PER_TOKEN[strategy]
    assert rounds < bound * tokens, f"{rounds} verifier forwards for {tokens} tokens"


@pytest.mark.parametrize(("strategy", "attentive_mix"), CONFIGS)
def test_greedy_identical_embedded(
    embedded_decoder,  # noqa: F811
    dev_prompts,
    reference_outputs,
    strategy,
    attentive_mix,
):
    draft = DraftConfig(k=K, strategy=strategy, attentive_mix=attentive_mix)
    generation = GenerationConfig(max_tokens=MAX_TOKENS, temperature=0.0, seed=0)
    rounds = tokens = 0
    mismatches = []
    for i, (prompt, expected) in enumerate(zip(dev_prompts, reference_outputs, strict=True)):
        result = embedded_decoder.generate(
            prompt=prompt, generation_config=generation, draft_config=draft
        )
        if result.token_ids != expected:
            mismatches.append(i)
        rounds += result.stats.rounds
        tokens += len(result.token_ids)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_parallel(rounds, tokens, strategy)


@pytest.mark.parametrize(("strategy", "attentive_mix"), CONFIGS)
def test_greedy_identical_over_services(
    services,  # noqa: F811
    dev_prompts,
    reference_outputs,
    strategy,
    attentive_mix,
):
    strategy_enum = {
        "greedy": common_pb2.DRAFT_STRATEGY_GREEDY,
        "sampling": common_pb2.DRAFT_STRATEGY_SAMPLING,
    }[strategy]
    rounds = tokens = 0
    mismatches = []
    for i, (prompt, expected) in enumerate(zip(dev_prompts, reference_outputs, strict=True)):
        response = services.gateway.Generate(
            gateway_pb2.GenerateRequest(
                prompt=prompt,
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                seed=0,
                draft=common_pb2.DraftOptions(
                    k=K, strategy=strategy_enum, attentive_mix=attentive_mix
                ),
            ),
            timeout=60,
        )
        if list(response.token_ids) != expected:
            mismatches.append(i)
        assert response.stats.draft_failures == 0
        rounds += response.stats.rounds
        tokens += len(response.token_ids)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_parallel(rounds, tokens, strategy)
