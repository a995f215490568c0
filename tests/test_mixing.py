"""Mixing modes on hand-made graphs: Witten-Bell q computed by hand (tests.witten_bell_reference),
the escape weight, greedy and sampled drafts, the step cache across modes, and how `mixing` and
`attentive_mix` interact. Validation of the mixing options is tested in
test_mixing_validation.py."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from draft_service.drafting import Drafter
from draft_service.mixing import witten_bell_weights
from speculant.config import DraftConfig, DraftParams
from speculant.graph_reader import NGramGraph
from tests.draft_checks import as_dict
from tests.fixtures.graphs import CORE_CHAINS
from tests.graph_factory import write_graph
from tests.witten_bell_reference import (
    CHAINS,
    WB_AFTER_45,
    WB_AFTER_345,
    ClassicParams,
    assert_q,
    hand_witten_bell,
)

# -- Witten-Bell q ------------------------------------------------------------------------------


def test_hand_reference_matches_the_comment() -> None:
    assert hand_witten_bell([3, 4, 5], CHAINS) == WB_AFTER_345
    assert hand_witten_bell([4, 5], CHAINS) == WB_AFTER_45


@pytest.mark.parametrize(
    ("context", "expected", "order"),
    [([3, 4, 5], WB_AFTER_345, 3), ([2, 4, 5], WB_AFTER_45, 2), ([5], {6: 0.75, 7: 0.25}, 1)],
)
def test_witten_bell_q_by_hand(mixing_graph: NGramGraph, context, expected, order) -> None:
    drafter = Drafter(mixing_graph)
    dist, matched = drafter.next_distribution(context, ClassicParams(mixing="witten-bell"))
    assert matched == order
    assert_q(as_dict(dist), {t: Fraction(p) for t, p in expected.items()})


def test_escape_weight_by_hand(mixing_graph: NGramGraph) -> None:
    # escape_weight 2: Q2 = (c_2 + 4 Q1) / 7 = {7: 3/7, 8: 1/7, 6: 3/7};
    # Q3 = (c_3 + 2 Q2) / 3 = {8: 3/7, 7: 2/7, 6: 2/7}
    expected = {8: Fraction(3, 7), 7: Fraction(2, 7), 6: Fraction(2, 7)}
    assert hand_witten_bell([3, 4, 5], CHAINS, Fraction(2)) == expected
    params = ClassicParams(mixing="witten-bell", escape_weight=2.0)
    dist, _ = Drafter(mixing_graph).next_distribution([3, 4, 5], params)
    assert_q(as_dict(dist), expected)
    # escape_weight 10 trusts order 1 most: q = {6: 150/253, 7: 70/253, 8: 33/253}
    ten = hand_witten_bell([3, 4, 5], CHAINS, Fraction(10))
    assert ten == {6: Fraction(150, 253), 7: Fraction(70, 253), 8: Fraction(33, 253)}
    drafter = Drafter(mixing_graph)  # one step cache for both: the weight is part of its key
    for weight, token in ((1.0, 8), (10.0, 6), (1.0, 8), (10.0, 6)):
        params = ClassicParams(k=1, mixing="witten-bell", escape_weight=weight)
        assert drafter.propose([3, 4, 5], params).token_ids == [token]


def test_witten_bell_weights_by_hand() -> None:
    # lambda_3 = 1/2, lambda_2 = 3/5, the lowest order takes the rest: 1/2, 3/10, 1/5.
    assert witten_bell_weights([1.0, 3.0, 4.0], [1, 2, 2]) == pytest.approx([0.5, 0.3, 0.2])
    assert witten_bell_weights([7.0], [3]) == [1.0]
    # escape_weight 2: lambda_3 = 1/3, lambda_2 = 3/7: 1/3, 2/7, 8/21
    got = witten_bell_weights([1.0, 3.0, 4.0], [1, 2, 2], 2.0)
    assert got == pytest.approx([1 / 3, 2 / 7, 8 / 21])


def test_witten_bell_on_the_core_graph_matches_the_recursion(core_graph: NGramGraph) -> None:
    drafter = Drafter(core_graph)
    params = ClassicParams(mixing="witten-bell")
    contexts = [[1, 2, 3], [7, 1, 2], [10, 10], [20, 20], [5, 20], [1], [2, 3]]
    for context in contexts:
        dist, _ = drafter.next_distribution(context, params)
        assert_q(as_dict(dist), hand_witten_bell(context, CORE_CHAINS))


@pytest.mark.parametrize("escape", [1, 8])
def test_witten_bell_on_random_graphs(tmp_path: Path, escape: int) -> None:
    """q equals the exact recursion, and the greedy draft (with its one-lookup shortcut when the
    highest order decides the argmax) is the exact argmax, lowest id on ties."""
    rng = np.random.default_rng(7)
    vocab = 12
    chains: dict = {}
    for order in range(1, 5):
        chain = chains.setdefault(order, {})
        for _ in range(60):
            context = tuple(rng.integers(0, vocab, size=order).tolist())
            ids = rng.choice(vocab, size=int(rng.integers(1, 7)), replace=False).tolist()
            skew = int(rng.choice([1, 20]))  # some contexts have a dominant first successor
            chain[context] = {
                i: int(rng.integers(1, 6)) * (skew if j == 0 else 1) for j, i in enumerate(ids)
            }
    params = ClassicParams(k=1, mixing="witten-bell", escape_weight=float(escape))
    with NGramGraph.open(write_graph(tmp_path / "g", chains, vocab_size=vocab)) as graph:
        drafter = Drafter(graph, cache_size=0)
        checked = 0
        for _ in range(600):
            context = rng.integers(0, vocab, size=int(rng.integers(1, 7))).tolist()
            expected = hand_witten_bell(context, chains, Fraction(escape))
            result = drafter.next_distribution(context, params)
            if not expected:
                assert result is None
                continue
            assert_q(as_dict(result[0]), expected)
            top = max(expected.values())
            argmax = min(t for t, q in expected.items() if q == top)
            runner_up = max((q for q in expected.values() if q != top), default=Fraction(0))
            if top - runner_up > Fraction(1, 10**9) or sum(q == top for q in expected.values()) > 1:
                assert drafter.propose(context, params).token_ids == [argmax], context
                checked += 1
        assert checked > 200


@pytest.mark.parametrize("strategy", ["greedy", "sampling"])
def test_witten_bell_greedy_and_sampled_drafts(mixing_graph: NGramGraph, strategy: str) -> None:
    drafter = Drafter(mixing_graph)
    params = ClassicParams(k=8, strategy=strategy, mixing="witten-bell")
    proposal = drafter.propose([3, 4, 5], params, seed=3)
    if strategy == "greedy":
        # argmax 8 (3/5); after (.., 5, 8) only order 1 matches: a tie 9/10 -> 9; then 11.
        assert proposal.token_ids == [8, 9, 11]
        assert proposal.matched_orders == [3, 1, 1]
        assert [as_dict(d) for d in proposal.distributions] == [{8: 1.0}, {9: 1.0}, {11: 1.0}]
    else:
        assert_q(as_dict(proposal.distributions[0]), WB_AFTER_345)


def test_modes_differ_and_the_step_cache_keeps_them_apart(mixing_graph: NGramGraph) -> None:
    drafter = Drafter(
        mixing_graph
    )  # one drafter: its greedy step cache is shared by the calls below
    count_heavy = {"order_bias": 0.0, "reliability_weight": 5.0}  # seed weights -> order 1
    runs = [
        ("witten-bell", {}, [8]),  # 3/5
        ("seed", count_heavy, [6]),  # not witten-bell's cached step
        ("backoff", {}, [8]),
        ("witten-bell", {}, [8]),  # not the seed's cached step
        ("seed", count_heavy, [6]),
    ]
    for mixing, weights, expected in runs:
        params = ClassicParams(k=1, mixing=mixing, **weights)
        assert drafter.propose([3, 4, 5], params).token_ids == expected, (mixing, weights)


# -- mixing vs attentive_mix ------------------------------------------------------------------


@pytest.mark.parametrize("mixing", ["seed", "backoff", "witten-bell"])
def test_attentive_mix_false_forces_backoff(mixing_graph: NGramGraph, mixing: str) -> None:
    drafter = Drafter(mixing_graph, cache_size=0)
    forced = ClassicParams(attentive_mix=False, mixing=mixing)
    assert forced.effective_mixing == "backoff"
    dist, order = drafter.next_distribution([3, 4, 5], forced)
    assert (as_dict(dist), order) == ({8: 1.0}, 3)
    reference = drafter.next_distribution([3, 4, 5], ClassicParams(mixing="backoff"))
    assert as_dict(reference[0]) == {8: 1.0}


def test_an_unset_mixing_gets_the_servers_default() -> None:
    """The default mixing and escape weight are tuning choices (measured in
    docs/benchmarks.md): a request that leaves them unset gets the server's, whatever they
    are; attentive_mix off forces backoff."""
    filled = DraftParams().with_defaults()  # unset: a graph's tuned value, else these
    defaults = DraftConfig()
    assert (filled.mixing, filled.escape_weight) == (defaults.mixing, defaults.escape_weight)
    assert DraftParams().effective_mixing == defaults.mixing
    assert DraftParams(attentive_mix=False).effective_mixing == "backoff"
