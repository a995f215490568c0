"""Adaptive draft length (min_draft_prob) on hand-made graphs: where greedy and sampled drafts
stop, and that a sampled draft token stays a plain draw from the q it reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from draft_service.drafting import Drafter
from speculant.draft_params import DraftParams
from speculant.graph_reader import NGramGraph
from tests.draft_checks import as_dict
from tests.graph_factory import write_graph
from tests.witten_bell_reference import VOCAB, ClassicParams


@pytest.mark.parametrize(
    ("mixing", "threshold", "expected"),
    [
        # witten-bell: running probabilities 3/5, 3/10, 3/10 for 8, 9, 11
        ("witten-bell", 0.0, [8, 9, 11]),
        ("witten-bell", 0.29, [8, 9, 11]),
        ("witten-bell", 0.31, [8]),
        ("witten-bell", 0.7, [8]),  # the first token is always drafted
        ("witten-bell", 1.0, [8]),
        # backoff: q(8) = 1 at order 3, then 1/2, 1: running 1, 1/2, 1/2
        ("backoff", 0.49, [8, 9, 11]),
        ("backoff", 0.51, [8]),
        ("backoff", 1.0, [8]),
    ],
)
def test_min_draft_prob_stops_at_the_right_position(
    mixing_graph: NGramGraph, mixing: str, threshold: float, expected: list[int]
) -> None:
    for cache_size in (0, 100):  # from the graph, then again through a warm step cache
        drafter = Drafter(mixing_graph, cache_size=cache_size)
        # without a threshold, cached steps may lack q(d): it is recomputed when needed
        drafter.propose([3, 4, 5], ClassicParams(k=8, mixing=mixing))
        params = ClassicParams(k=8, mixing=mixing, min_draft_prob=threshold)
        for _ in range(2):
            assert drafter.propose([3, 4, 5], params).token_ids == expected


def test_min_draft_prob_needs_a_match_for_the_first_token(mixing_graph: NGramGraph) -> None:
    params = ClassicParams(k=8, min_draft_prob=1.0)
    assert Drafter(mixing_graph).propose([42], params).token_ids == []  # dead end: still empty


@pytest.mark.parametrize("mixing", ["seed", "witten-bell"])
def test_sampled_drafts_stop_before_a_position_whose_best_q_falls_below(
    core_graph: NGramGraph, mixing: str
) -> None:
    """With one seed, the thresholded draft is the longest prefix (>= 1 token) of the free draft
    such that before each position i >= 2, q(d_1) * ... * q(d_{i-1}) * max q_i stays >=
    min_draft_prob: decided before d_i is drawn, never from d_i itself."""
    drafter = Drafter(core_graph)
    for seed in range(40):
        free = drafter.propose(
            [20, 20], ClassicParams(k=8, strategy="sampling", mixing=mixing), seed
        )
        q_of_draft = [
            as_dict(d)[t] for t, d in zip(free.token_ids, free.distributions, strict=True)
        ]
        best_q = [float(d.probs.max()) for d in free.distributions]
        running = np.cumprod(q_of_draft)
        for threshold in (0.05, 0.2, 0.5):
            keep = len(free.token_ids)
            for i in range(1, len(free.token_ids)):
                if running[i - 1] * best_q[i] < threshold:
                    keep = i
                    break
            params = ClassicParams(
                k=8, strategy="sampling", mixing=mixing, min_draft_prob=threshold
            )
            cut = drafter.propose([20, 20], params, seed)
            assert cut.token_ids == free.token_ids[:keep]


# After 30: 31 or 32 (q = 1/2 each, backoff); after (30, 31): 40..43 with q 0.4, 0.3, 0.2, 0.1.
SPREAD_CHAINS = {
    1: {(30,): {31: 1, 32: 1}, (31,): {40: 4, 41: 3, 42: 2, 43: 1}},
    2: {(30, 31): {40: 4, 41: 3, 42: 2, 43: 1}},
}


def test_a_sampled_draft_token_is_a_plain_draw_from_the_q_it_reports(tmp_path: Path) -> None:
    """Exactness of adaptive length with sampled drafts: given the tokens before it, a drafted
    token must be distributed as the q it reports (the verifier corrects against that q).

    With min_draft_prob = 1/2 * 1/4, a rule that cut the draft after drawing d_2 (dropping
    d_2 when q(d_1) q(d_2) < 1/8, i.e. q(d_2) < 1/4) would only ever draft 40 and 41 after 31,
    a draw from q restricted to its likelier tokens: the chi-square below rejects it."""
    from scipy.stats import chisquare

    path = write_graph(tmp_path / "graph", SPREAD_CHAINS, vocab_size=VOCAB)
    params = DraftParams(
        k=2, strategy="sampling", mixing="backoff", tree_nodes=0, min_draft_prob=1 / 8
    )
    seconds: list[int] = []
    with NGramGraph.open(path) as graph:
        drafter = Drafter(graph)
        for seed in range(4000):
            proposal = drafter.propose([30], params, seed)
            if proposal.token_ids[0] == 31:
                assert len(proposal.token_ids) == 2  # 1/2 * max q = 0.2 >= 1/8: always drafted
                assert as_dict(proposal.distributions[1]) == pytest.approx(
                    {40: 0.4, 41: 0.3, 42: 0.2, 43: 0.1}
                )
                seconds.append(proposal.token_ids[1])
    observed = [seconds.count(t) for t in (40, 41, 42, 43)]
    expected = [len(seconds) * q for q in (0.4, 0.3, 0.2, 0.1)]
    assert chisquare(observed, expected).pvalue > 1e-3, observed
