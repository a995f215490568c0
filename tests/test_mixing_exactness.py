"""Exactness with the new drafting options: at temperature 0 the output is token-identical to
Hugging Face greedy decoding for every mixing mode, embedded and (one case, to prove the fields
travel through the gateway and the draft service) over services. 16 dev prompts keep it fast;
tests/test_exactness.py covers all of them for the seed's modes."""

from __future__ import annotations

import pytest

from speculant.config import DraftConfig
from speculant.v1 import common_pb2
from tests.exactness_checks import (
    assert_drafts_served,
    assert_parallel,
    generate_embedded,
    generate_over_gateway,
    totals,
)

K = 8
CONFIGS = [
    pytest.param("greedy", "witten-bell", 1.0, id="greedy-wb"),
    pytest.param("greedy", "witten-bell", 8.0, id="greedy-wb8"),
    pytest.param("greedy", "backoff", 1.0, id="greedy-backoff"),
    pytest.param("sampling", "seed", 1.0, id="sampling-seed"),
    pytest.param("sampling", "witten-bell", 8.0, id="sampling-wb8"),
]


@pytest.mark.parametrize(("strategy", "mixing", "escape_weight"), CONFIGS)
def test_greedy_identical_embedded(
    embedded_decoder,
    prompts16,
    references16,
    strategy,
    mixing,
    escape_weight,
):
    draft = DraftConfig(
        k=K,
        strategy=strategy,
        mixing=mixing,
        escape_weight=escape_weight,
        draft_size="fixed",  # all of each draft is verified
    )
    mismatches, stats = generate_embedded(embedded_decoder, prompts16, references16, draft)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_parallel(*totals(stats), strategy)


def test_greedy_identical_over_services_with_witten_bell_chains(
    services,
    prompts16,
    references16,
):
    draft = common_pb2.DraftOptions(
        k=K, mixing="witten-bell", escape_weight=8.0, tree_nodes=0, draft_size="fixed"
    )
    mismatches, stats = generate_over_gateway(services.gateway, prompts16, references16, draft)
    assert_drafts_served(stats)
    rounds, tokens = totals(stats)
    drafted = sum(s.draft_tokens for s in stats)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_parallel(rounds, tokens, "greedy")
    # the fields reached the draft service: chains of at most k tokens, not trees
    assert drafted <= K * (rounds - len(prompts16))
