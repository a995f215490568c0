"""The drafting core on hand-made graphs: backoff, dead ends, mixing, strategies, the greedy
cache, and q on random graphs. Its validation is tested in test_draft_validation.py, the graph
reader in test_graph_reader.py.

These tests pin the seed's attentive formula ("seed" mixing, tests.seed_formula), which the
DESIGN's formula and parameters describe; the default mixing is Witten-Bell
(tests/test_mixing.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from draft_service.drafting import Drafter
from draft_service.mixing import order_weights
from speculant.config import DraftParams
from speculant.graph_reader import NGramGraph
from tests.draft_checks import as_dict
from tests.graph_factory import write_graph
from tests.seed_formula import SeedParams, hand_q, plain

# -- backoff -----------------------------------------------------------------------------------


def test_backoff_picks_the_highest_matching_order_and_rematches(core_drafter: Drafter) -> None:
    params = SeedParams(k=8, attentive_mix=False)
    proposal = core_drafter.propose([7, 1], params)
    # (7, 1) unknown -> order 1 (1,) -> 2; (7, 1, 2) unknown -> order 2 (1, 2) -> 3;
    # (1, 2, 3) -> order 3 -> 9; then nothing follows 9: a partial draft.
    assert proposal.token_ids == [2, 3, 9]
    assert proposal.matched_orders == [1, 2, 3]
    assert [as_dict(d) for d in proposal.distributions] == [{2: 1.0}, {3: 1.0}, {9: 1.0}]


def test_short_context_works(core_drafter: Drafter) -> None:
    proposal = core_drafter.propose([1], SeedParams(k=8, attentive_mix=False))
    assert proposal.token_ids == [2, 3, 9]
    assert proposal.matched_orders == [1, 2, 3]


def test_k_limits_the_draft(core_drafter: Drafter) -> None:
    proposal = core_drafter.propose([7, 1], SeedParams(k=2, attentive_mix=False))
    assert proposal.token_ids == [2, 3]
    assert len(proposal.distributions) == len(proposal.matched_orders) == 2


@pytest.mark.parametrize("context", [[], [50], [9], [1, 2, 3, 9]])
@pytest.mark.parametrize("strategy", ["greedy", "sampling"])
def test_dead_end_gives_an_empty_draft(core_drafter: Drafter, context, strategy) -> None:
    proposal = core_drafter.propose(context, SeedParams(k=5, strategy=strategy), seed=1)
    assert proposal.token_ids == []
    assert proposal.distributions == []
    assert proposal.matched_orders == []


def test_dead_end_after_some_tokens_gives_a_partial_draft(core_drafter: Drafter) -> None:
    proposal = core_drafter.propose([3], SeedParams(k=8))  # 3 -> 4 -> 5 -> nothing
    assert proposal.token_ids == [4, 5]
    assert proposal.matched_orders == [1, 1]


def test_only_the_last_max_order_tokens_matter(core_drafter: Drafter) -> None:
    params = SeedParams(k=4)
    long = [0, 5, 6, 7, 8] * 20 + [1, 2, 3]
    assert plain(core_drafter.propose(long, params)) == plain(
        core_drafter.propose([1, 2, 3], params)
    )


# -- mixing ------------------------------------------------------------------------------------


def test_mixing_weights_by_hand() -> None:
    # Context (1, 2): order 2 has {3: 2} (C=2, H=0), order 1 has {3: 2, 4: 2} (C=4, H=ln 2).
    s2 = 1.0 * math.log(2) + 1.0 * math.log(3) - 0.5 * 0.0
    s1 = 1.0 * math.log(1) + 1.0 * math.log(5) - 0.5 * math.log(2)
    w2 = math.exp(s2) / (math.exp(s2) + math.exp(s1))
    got = order_weights([2, 1], [2.0, 4.0], [0.0, math.log(2)], SeedParams())
    assert got == pytest.approx([w2, 1 - w2], rel=1e-12)


def test_mixed_q_equals_the_formula(core_drafter: Drafter) -> None:
    params = SeedParams(k=1, strategy="sampling")
    # Context (1, 2): q(3) = w2 + w1/2, q(4) = w1/2.
    s2 = math.log(2) + math.log(3)
    s1 = math.log(5) - 0.5 * math.log(2)
    w2 = 1 / (1 + math.exp(s1 - s2))
    expected = {3: w2 + (1 - w2) / 2, 4: (1 - w2) / 2}
    dist, order = core_drafter.next_distribution([1, 2], params)
    assert order == 2
    assert as_dict(dist) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    proposal = core_drafter.propose([1, 2], params, seed=3)
    assert as_dict(proposal.distributions[0]) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert proposal.distributions[0].probs.dtype == np.float64
    assert proposal.distributions[0].probs.sum() == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize(
    "params",
    [
        SeedParams(),
        SeedParams(order_bias=3.0, reliability_weight=0.2, entropy_penalty=2.0),
        SeedParams(mix_temperature=0.05),
        SeedParams(mix_temperature=50.0, entropy_penalty=0.0),
        SeedParams(attentive_mix=False),
    ],
)
@pytest.mark.parametrize("context", [[1, 2, 3], [1, 2], [20, 20], [10, 10], [3], [2]])
def test_q_matches_reference_for_several_parameters(core_drafter: Drafter, params, context) -> None:
    expected, order = hand_q(context, params)
    dist, got_order = core_drafter.next_distribution(context, params)
    assert got_order == order
    assert as_dict(dist) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_greedy_is_argmax_of_the_mixed_q(core_drafter: Drafter) -> None:
    # After (1, 2, 3): backoff alone drafts 9 (order 3); the mix favours 4 (orders 2 and 1).
    q, _ = hand_q([1, 2, 3], SeedParams())
    assert max(q, key=q.get) == 4
    mixed = core_drafter.propose([1, 2, 3], SeedParams(k=1))
    assert mixed.token_ids == [4]
    assert mixed.matched_orders == [3]
    assert as_dict(mixed.distributions[0]) == {4: 1.0}  # greedy: q is the point mass
    backoff = core_drafter.propose([1, 2, 3], SeedParams(k=1, attentive_mix=False))
    assert backoff.token_ids == [9]


def test_greedy_ties_go_to_the_lowest_token_id(core_drafter: Drafter) -> None:
    # (2,) has {3: 2, 4: 2}. (10, 10) has {12: 2, 11: 1} and (10,) {11: 2, 12: 1}: with equal
    # order weights (order_bias 0), q(11) == q(12) exactly, and 12 comes first in the data.
    assert core_drafter.propose([2], SeedParams(k=1)).token_ids == [3]
    params = SeedParams(k=1, order_bias=0.0, entropy_penalty=0.0, reliability_weight=0.0)
    q, _ = hand_q([10, 10], params)
    assert q[11] == q[12]
    assert core_drafter.propose([10, 10], params).token_ids == [11]


# -- sampling ----------------------------------------------------------------------------------


def test_sampling_is_reproducible_with_a_seed(core_drafter: Drafter) -> None:
    params = SeedParams(k=6, strategy="sampling")
    runs = [core_drafter.propose([20, 20], params, seed=s) for s in range(30)]
    again = [core_drafter.propose([20, 20], params, seed=s) for s in range(30)]
    for a, b in zip(runs, again, strict=True):
        assert a.token_ids == b.token_ids
        assert [as_dict(d) for d in a.distributions] == [as_dict(d) for d in b.distributions]
    assert len({tuple(r.token_ids[:1]) for r in runs}) > 1  # different seeds do differ


def test_sampling_without_seed_is_nondeterministic(core_drafter: Drafter) -> None:
    params = SeedParams(k=1, strategy="sampling")
    firsts = {core_drafter.propose([20, 20], params).token_ids[0] for _ in range(200)}
    assert len(firsts) > 1


def test_sampling_follows_q(core_drafter: Drafter) -> None:
    """Chi-square: the drawn tokens follow the reported q, and not the order-2 P alone."""
    params = SeedParams(k=1, strategy="sampling", order_bias=0.3)
    expected, _ = hand_q([20, 20], params)
    ids = sorted(expected)
    n = 20_000
    counts = dict.fromkeys(ids, 0)
    for seed in range(n):
        proposal = core_drafter.propose([20, 20], params, seed=seed)
        (token,) = proposal.token_ids
        assert as_dict(proposal.distributions[0]) == pytest.approx(expected, rel=1e-12)
        counts[token] += 1
    observed = np.array([counts[i] for i in ids])
    probs = np.array([expected[i] for i in ids])
    assert stats.chisquare(observed, probs * n).pvalue > 1e-4
    # A wrong q (order 2's P alone, zero-padded with a little mass) is clearly rejected.
    wrong_p, _ = hand_q([20, 20], SeedParams(attentive_mix=False))
    wrong = np.array([wrong_p.get(i, 0.0) + 1e-3 for i in ids])
    assert stats.chisquare(observed, wrong / wrong.sum() * n).pvalue < 1e-9


def test_sampling_draws_only_tokens_with_positive_q(core_drafter: Drafter) -> None:
    params = SeedParams(k=1, strategy="sampling", mix_temperature=1e-3, order_bias=100.0)
    for seed in range(300):
        proposal = core_drafter.propose([1, 2, 3], params, seed=seed)
        dist = as_dict(proposal.distributions[0])
        assert all(p > 0 for p in dist.values())
        assert proposal.token_ids[0] in dist


# -- the greedy cache ----------------------------------------------------------------------


def test_greedy_cache_is_transparent_and_bounded(core_graph: NGramGraph) -> None:
    cached = Drafter(core_graph, cache_size=3)
    uncached = Drafter(core_graph, cache_size=0)
    rng = np.random.default_rng(0)
    pool = [1, 2, 3, 4, 10, 20, 9]
    for _ in range(300):
        context = rng.choice(pool, size=int(rng.integers(0, 6))).tolist()
        params = SeedParams(
            k=int(rng.integers(1, 6)),
            attentive_mix=bool(rng.integers(2)),
            order_bias=float(rng.choice([0.0, 1.0])),
        )
        assert plain(cached.propose(context, params)) == plain(uncached.propose(context, params))
        assert len(cached.chain.cache) <= 3


# -- random graphs -----------------------------------------------------------------------------


def test_random_graph_matches_reference(tmp_path: Path) -> None:
    """Random chains (successor sets overlap arbitrarily across orders) against hand_q."""
    rng = np.random.default_rng(7)
    vocab = 12
    chains: dict = {}
    for order in range(1, 5):
        chain = chains.setdefault(order, {})
        for _ in range(60):
            context = tuple(rng.integers(0, vocab, size=order).tolist())
            ids = rng.choice(vocab, size=int(rng.integers(1, 7)), replace=False).tolist()
            chain[context] = {i: int(rng.integers(1, 50)) for i in ids}
    with NGramGraph.open(write_graph(tmp_path / "g", chains, vocab_size=vocab)) as graph:
        drafter = Drafter(graph, cache_size=0)
        checked = 0
        for _ in range(400):
            context = rng.integers(0, vocab, size=int(rng.integers(1, 7))).tolist()
            params = SeedParams(
                k=1,
                strategy="sampling",
                attentive_mix=bool(rng.random() < 0.8),
                order_bias=float(rng.uniform(0, 3)),
                reliability_weight=float(rng.uniform(0, 2)),
                entropy_penalty=float(rng.uniform(0, 2)),
                mix_temperature=float(rng.uniform(0.1, 5)),
            )
            expected, order = hand_q(context, params, chains)
            result = drafter.next_distribution(context, params)
            if order == 0:
                assert result is None
                continue
            dist, got_order = result
            assert got_order == order
            assert as_dict(dist) == pytest.approx(expected, rel=1e-9, abs=1e-15)
            greedy = drafter.propose(
                context, DraftParams(**{**params.__dict__, "strategy": "greedy"})
            )
            top = max(expected.values())
            assert greedy.token_ids[0] == min(
                t for t, p in expected.items() if p >= top * (1 - 1e-12)
            )
            checked += 1
        assert checked > 100
