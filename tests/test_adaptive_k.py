"""Adaptive draft length (gateway.rounds.adaptive_k): the schedule as a pure function, and greedy
output
identical to Hugging Face with it, embedded and over the services, with fewer wasted drafts."""

from __future__ import annotations

import pytest

from gateway.generation import GenerationStats
from gateway.rounds.adaptive_k import GROW, next_draft_length
from speculant.config import DraftConfig
from speculant.v1 import common_pb2
from tests.assets import load_dev_prompts
from tests.exactness_checks import (
    MAX_TOKENS,
    assert_drafts_served,
    generate_embedded,
    generate_over_gateway,
    plain_greedy_outputs,
)

PROMPTS = 8
K = 8


# -- the schedule -------------------------------------------------------------------------------


def test_a_rejection_shrinks_halfway_toward_what_the_round_needed() -> None:
    assert next_draft_length(8, drafted=8, accepted=0, k_max=8) == 5  # ceil((8 + 1) / 2)
    assert next_draft_length(8, drafted=8, accepted=3, k_max=8) == 6  # ceil((8 + 4) / 2)
    assert next_draft_length(2, drafted=2, accepted=0, k_max=8) == 2  # ceil(3 / 2)
    assert next_draft_length(1, drafted=1, accepted=0, k_max=8) == 1  # never below 1


def test_a_full_acceptance_grows_up_to_k_max() -> None:
    assert next_draft_length(3, drafted=3, accepted=3, k_max=8) == 3 + GROW
    assert next_draft_length(8, drafted=8, accepted=8, k_max=8) == 8
    assert next_draft_length(7, drafted=7, accepted=7, k_max=8) == 8


def test_a_short_draft_fully_accepted_keeps_k() -> None:
    """The drafter stopped early (a dead end): k was not the limit."""
    assert next_draft_length(6, drafted=2, accepted=2, k_max=8) == 6
    assert next_draft_length(6, drafted=0, accepted=0, k_max=8) == 6  # an empty draft


def test_k_min_is_respected_and_capped_by_k_max() -> None:
    assert next_draft_length(8, drafted=8, accepted=0, k_max=8, k_min=6) == 6
    assert next_draft_length(4, drafted=4, accepted=0, k_max=4, k_min=9) == 4


def test_the_length_always_stays_in_range() -> None:
    for k_max in (1, 2, 5, 8, 64):
        for current in range(1, k_max + 1):
            for drafted in range(current + 1):
                for accepted in range(drafted + 1):
                    k = next_draft_length(current, drafted, accepted, k_max)
                    assert 1 <= k <= k_max
                    if accepted < drafted:
                        assert k <= current  # a rejection never grows k


def test_wasted_draft_tokens_are_drafted_minus_accepted() -> None:
    stats = GenerationStats()
    stats.record_round(8, 3)
    stats.record_round(5, 5)
    assert stats.wasted_draft_tokens == 5
    assert stats.as_dict()["wasted_draft_tokens"] == 5


# -- exactness ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prompts8() -> list[str]:
    return load_dev_prompts(PROMPTS)


@pytest.fixture(scope="module")
def references8(embedded_decoder, prompts8) -> list[list[int]]:
    return plain_greedy_outputs(embedded_decoder, prompts8, MAX_TOKENS)


def test_greedy_identical_with_adaptive_k_embedded(embedded_decoder, prompts8, references8):
    # chains: a tree's depth adapts too, but its node budget stays (see gateway.rounds.adaptive_k)
    fixed = DraftConfig(k=K, tree_nodes=0)
    adaptive = DraftConfig(k=K, adaptive_k=True, tree_nodes=0)
    mismatches, adaptive_stats = generate_embedded(
        embedded_decoder, prompts8, references8, adaptive
    )
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    _, fixed_stats = generate_embedded(embedded_decoder, prompts8, references8, fixed)
    wasted = sum(s.wasted_draft_tokens for s in adaptive_stats)
    wasted_fixed = sum(s.wasted_draft_tokens for s in fixed_stats)
    assert wasted < wasted_fixed, "adaptive k should cut the rejected drafts"
    lengths = {len(s.drafted_by_position) for s in adaptive_stats}
    assert max(lengths) <= K
    # the draft length changed from round to round: position K-1 was drafted less than position 0
    drafted_first = sum(s.drafted_by_position[0] for s in adaptive_stats)
    drafted_last = sum(
        s.drafted_by_position[K - 1] for s in adaptive_stats if len(s.drafted_by_position) == K
    )
    assert drafted_last < drafted_first


def test_greedy_identical_with_adaptive_k_over_services(services, prompts8, references8):
    draft = common_pb2.DraftOptions(k=K, adaptive_k=True, tree_nodes=0)
    mismatches, stats = generate_over_gateway(services.gateway, prompts8, references8, draft)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_drafts_served(stats)
    for s in stats:
        assert s.wasted_draft_tokens == s.draft_tokens - s.accepted_tokens
    _, fixed = generate_over_gateway(
        services.gateway, prompts8, references8, common_pb2.DraftOptions(k=K, tree_nodes=0)
    )
    assert sum(s.draft_tokens for s in stats) < sum(s.draft_tokens for s in fixed)
