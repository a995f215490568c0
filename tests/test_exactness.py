"""Exactness, greedy: speculative decoding at temperature 0 is token-identical to Hugging Face
`generate(do_sample=False)` of the same model, on every dev prompt, embedded and over the
services, for every drafting strategy with and without attentive mixing, with learning on (the
decoder learning from every generation as it goes) and with a distilled graph; and it needs well
under one verifier forward per token (verification is parallel)."""

from __future__ import annotations

import time

import grpc
import pytest

from gateway import SpeculativeDecoder
from speculant.config import DraftConfig
from speculant.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from tests.assets import dev_prompt_sets, load_dev_prompts
from tests.exactness_checks import (
    MAX_TOKENS,
    assert_drafted,
    assert_drafts_served,
    assert_parallel,
    generate_embedded,
    generate_over_gateway,
    plain_greedy_outputs,
    totals,
)
from tests.fixtures.e2e import verifier_config

K = 8
# (strategy, attentive mixing, draft tree size): greedy drafts are chains by default and trees
# on request (sampled drafts are always chains).
CONFIGS = [
    pytest.param("greedy", True, 12, id="greedy-mix-tree"),
    pytest.param("greedy", True, 0, id="greedy-mix-chain"),
    pytest.param("greedy", False, 0, id="greedy-backoff-chain"),
    pytest.param("sampling", True, 0, id="sampling-mix"),
    pytest.param("sampling", False, 0, id="sampling-backoff"),
]
# Over the services the default suite runs the default drafts and sampled ones; the same
# configurations as embedded, all of them, with `-m slow`.
SLOW_OVER_SERVICES = {"greedy-mix-chain", "greedy-backoff-chain", "sampling-backoff"}
# On the 56 prompts past the demo kit's 8, the default suite runs a draft tree embedded, and the
# default drafts (cost-aware sizes) while learning, from a distilled graph and over the services
# while learning; the other configurations there run with `-m slow` (every configuration runs on
# the demo kit's 8; tests/conftest.py reads this).
SLOW_CASES = {
    "test_greedy_identical_embedded": {
        "prompts8-all-greedy-mix-chain",
        "prompts8-all-greedy-backoff-chain",
        "prompts8-all-sampling-mix",
        "prompts8-all-sampling-backoff",
    },
    "test_greedy_identical_over_services": {
        "prompts8-all-greedy-mix-tree",
        "prompts8-all-sampling-mix",
    },
    "test_greedy_identical_embedded_while_learning": {"prompts8-all-sampling"},
}
SERVICE_CONFIGS = [
    pytest.param(*p.values, id=p.id, marks=[pytest.mark.slow] if p.id in SLOW_OVER_SERVICES else [])
    for p in CONFIGS
]


@pytest.fixture(scope="module", params=dev_prompt_sets())
def dev_prompts(request: pytest.FixtureRequest) -> list[str]:
    """Every dev prompt: the demo kit's 8, then the other 56 (with ../shared)."""
    return load_dev_prompts(*request.param)


@pytest.fixture(scope="module")
def reference_outputs(embedded_decoder, dev_prompts) -> list[list[int]]:
    """Plain greedy decoding with Hugging Face generate, per dev prompt."""
    return plain_greedy_outputs(embedded_decoder, dev_prompts, MAX_TOKENS)


@pytest.mark.parametrize(("strategy", "attentive_mix", "tree_nodes"), CONFIGS)
def test_greedy_identical_embedded(
    embedded_decoder,
    dev_prompts,
    reference_outputs,
    strategy,
    attentive_mix,
    tree_nodes,
):
    draft = DraftConfig(
        k=K,
        strategy=strategy,
        attentive_mix=attentive_mix,
        tree_nodes=tree_nodes,
        draft_size="fixed",  # all of each draft is verified (the default's sizes: below)
    )
    mismatches, stats = generate_embedded(embedded_decoder, dev_prompts, reference_outputs, draft)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_parallel(*totals(stats), strategy)


@pytest.mark.parametrize(("strategy", "attentive_mix", "tree_nodes"), SERVICE_CONFIGS)
def test_greedy_identical_over_services(
    services,
    dev_prompts,
    reference_outputs,
    strategy,
    attentive_mix,
    tree_nodes,
):
    strategy_enum = {
        "greedy": common_pb2.DRAFT_STRATEGY_GREEDY,
        "sampling": common_pb2.DRAFT_STRATEGY_SAMPLING,
    }[strategy]
    draft = common_pb2.DraftOptions(
        k=K,
        strategy=strategy_enum,
        attentive_mix=attentive_mix,
        tree_nodes=tree_nodes,
        draft_size="fixed",
    )
    mismatches, stats = generate_over_gateway(
        services.gateway, dev_prompts, reference_outputs, draft
    )
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_drafts_served(stats)
    assert_parallel(*totals(stats), strategy)


@pytest.mark.parametrize("strategy", ["greedy", "sampling"])
def test_greedy_identical_embedded_while_learning(
    learning_decoder,
    dev_prompts,
    reference_outputs,
    strategy,
):
    """Learning on (the default): each generation is learned as soon as it finishes, so later
    prompts draft from what earlier ones generated; the output stays plain greedy decoding."""
    before = learning_decoder.live.stats().learned_documents
    draft = DraftConfig(strategy=strategy)  # the default draft tree
    mismatches, stats = generate_embedded(learning_decoder, dev_prompts, reference_outputs, draft)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert learning_decoder.live.stats().learned_documents == before + len(dev_prompts)
    if strategy == "greedy":  # sized by cost, the default
        assert_drafted(stats)
    else:
        assert_parallel(*totals(stats), strategy)


def test_greedy_identical_over_services_while_learning(
    learning_services,
    dev_prompts,
    reference_outputs,
):
    prompts, references = dev_prompts[:24], reference_outputs[:24]
    mismatches, stats = generate_over_gateway(
        learning_services.gateway, prompts, references, common_pb2.DraftOptions()
    )
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_drafts_served(stats)
    assert_drafted(stats)
    with grpc.insecure_channel(learning_services.draft_address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the gateway reports in the background
            live = stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=5).live
            if live.learned_documents >= len(prompts):
                break
            time.sleep(0.1)
    assert live.learned_documents >= len(prompts)


def test_greedy_identical_with_a_distilled_graph(distilled_graph, dev_prompts, reference_outputs):
    decoder = SpeculativeDecoder(distilled_graph, verifier_config(), learn=False)
    mismatches, stats = generate_embedded(decoder, dev_prompts, reference_outputs, DraftConfig())
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_drafted(stats)
