"""Interpolated Witten-Bell mixing by hand, for the mixing tests: a hand-made graph (CHAINS, its
vocabulary VOCAB; the mixing_graph fixture of tests/fixtures/graphs.py), its q worked out in
exact fractions, and the recursion hand_witten_bell computes on any chains."""

from __future__ import annotations

from fractions import Fraction
from functools import partial

import pytest

from speculant.config import DraftParams

VOCAB = 100

# After (3, 4, 5): order 3 has seen 8 once, order 2 prefers 7, order 1 prefers 6.
# Then 8 -> {9, 10} (a tie: greedy takes 9 with q = 1/2), 9 -> 11 (certain), 11: dead end.
CHAINS = {
    1: {
        (5,): {6: 3, 7: 1},
        (8,): {9: 1, 10: 1},
        (9,): {11: 1},
    },
    2: {(4, 5): {7: 2, 8: 1}},
    3: {(3, 4, 5): {8: 1}},
}
# Interpolated Witten-Bell by hand, from the lowest matching order upward:
# Q1 = P_1 = {6: 3/4, 7: 1/4}                                   (C_1 = 4, T_1 = 2)
# Q2 = (c_2 + 2 Q1) / (3 + 2) = {7: 1/2, 8: 1/5, 6: 3/10}       (C_2 = 3, T_2 = 2)
# Q3 = (c_3 + 1 Q2) / (1 + 1) = {8: 3/5, 7: 1/4, 6: 3/20}       (C_3 = 1, T_3 = 1)
WB_AFTER_345 = {8: Fraction(3, 5), 7: Fraction(1, 4), 6: Fraction(3, 20)}
WB_AFTER_45 = {7: Fraction(1, 2), 8: Fraction(1, 5), 6: Fraction(3, 10)}

# Unless a test says otherwise: the seed formula and classic Witten-Bell (escape_weight 1), the
# values the tests' hand computations use; the library defaults are checked on their own.
# chains from the graph alone (no context overlay)
ClassicParams = partial(
    DraftParams, mixing="seed", escape_weight=1.0, tree_nodes=0, overlay_weight=0.0
)


def hand_witten_bell(
    context: list[int], chains: dict, escape: Fraction = Fraction(1)
) -> dict[int, Fraction]:
    """Interpolated Witten-Bell q in exact fractions, straight from the recursion
    Q_j = (c_j + escape * T_j * Q_{j-1}) / (C_j + escape * T_j)."""
    matching = [
        succ
        for order in range(1, min(len(context), max(chains)) + 1)
        if (succ := chains.get(order, {}).get(tuple(context[len(context) - order :])))
    ]
    q: dict[int, Fraction] = {}
    for succ in matching:  # lowest order first
        total, types = sum(succ.values()), escape * len(succ)
        if not q:
            q = {t: Fraction(c, total) for t, c in succ.items()}
            continue
        q = {
            t: (succ.get(t, 0) + types * q.get(t, Fraction(0))) / (total + types)
            for t in set(q) | set(succ)
        }
    return q


def assert_q(got: dict[int, float], expected: dict[int, Fraction]) -> None:
    """got (a draft's q) is expected (exact fractions), to 12 significant digits."""
    assert set(got) == set(expected)
    for token, prob in expected.items():
        assert got[token] == pytest.approx(float(prob), rel=1e-12, abs=0)
