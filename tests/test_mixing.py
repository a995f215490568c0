"""Mixing modes and adaptive draft length on hand-made graphs: Witten-Bell q computed by hand,
min_draft_prob stopping positions, how `mixing` and `attentive_mix` interact, and validation
(errors name the field, in the core, the draft service and the gateway)."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import partial
from pathlib import Path

import grpc
import numpy as np
import pytest
from graph_factory import write_graph

from draft_service.drafting import Drafter
from draft_service.mixing import witten_bell_weights
from draft_service.server import start_server
from gateway.generation import GenerationRequest
from speculant.config import DraftConfig
from speculant.errors import InvalidArgumentError
from speculant.graph_reader import NGramGraph
from speculant.types import DraftParams
from speculant.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from speculant.wire import draft_options_from_pb, draft_params_from_pb
from tests.fixtures.graphs import CORE_CHAINS

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
# values the hand computations below use; the library defaults are checked on their own.
# chains from the graph alone (no context overlay)
ClassicParams = partial(
    DraftParams, mixing="seed", escape_weight=1.0, tree_nodes=0, overlay_weight=0.0
)


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_graph(tmp_path_factory.mktemp("mix") / "graph", CHAINS, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def graph(graph_dir: Path):
    with NGramGraph.open(graph_dir) as g:
        yield g


def as_dict(dist) -> dict[int, float]:
    return dict(zip(dist.token_ids.tolist(), dist.probs.tolist(), strict=True))


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
    assert set(got) == set(expected)
    for token, prob in expected.items():
        assert got[token] == pytest.approx(float(prob), rel=1e-12, abs=0)


# -- Witten-Bell q ------------------------------------------------------------------------------


def test_hand_reference_matches_the_comment() -> None:
    assert hand_witten_bell([3, 4, 5], CHAINS) == WB_AFTER_345
    assert hand_witten_bell([4, 5], CHAINS) == WB_AFTER_45


@pytest.mark.parametrize(
    ("context", "expected", "order"),
    [([3, 4, 5], WB_AFTER_345, 3), ([2, 4, 5], WB_AFTER_45, 2), ([5], {6: 0.75, 7: 0.25}, 1)],
)
def test_witten_bell_q_by_hand(graph: NGramGraph, context, expected, order) -> None:
    drafter = Drafter(graph)
    dist, matched = drafter.next_distribution(context, ClassicParams(mixing="witten-bell"))
    assert matched == order
    assert_q(as_dict(dist), {t: Fraction(p) for t, p in expected.items()})


def test_escape_weight_by_hand(graph: NGramGraph) -> None:
    # escape_weight 2: Q2 = (c_2 + 4 Q1) / 7 = {7: 3/7, 8: 1/7, 6: 3/7};
    # Q3 = (c_3 + 2 Q2) / 3 = {8: 3/7, 7: 2/7, 6: 2/7}
    expected = {8: Fraction(3, 7), 7: Fraction(2, 7), 6: Fraction(2, 7)}
    assert hand_witten_bell([3, 4, 5], CHAINS, Fraction(2)) == expected
    params = ClassicParams(mixing="witten-bell", escape_weight=2.0)
    dist, _ = Drafter(graph).next_distribution([3, 4, 5], params)
    assert_q(as_dict(dist), expected)
    # escape_weight 10 trusts order 1 most: q = {6: 150/253, 7: 70/253, 8: 33/253}
    ten = hand_witten_bell([3, 4, 5], CHAINS, Fraction(10))
    assert ten == {6: Fraction(150, 253), 7: Fraction(70, 253), 8: Fraction(33, 253)}
    drafter = Drafter(graph)  # one step cache for both: the weight is part of its key
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
def test_witten_bell_greedy_and_sampled_drafts(graph: NGramGraph, strategy: str) -> None:
    drafter = Drafter(graph)
    params = ClassicParams(k=8, strategy=strategy, mixing="witten-bell")
    proposal = drafter.propose([3, 4, 5], params, seed=3)
    if strategy == "greedy":
        # argmax 8 (3/5); after (.., 5, 8) only order 1 matches: a tie 9/10 -> 9; then 11.
        assert proposal.token_ids == [8, 9, 11]
        assert proposal.matched_orders == [3, 1, 1]
        assert [as_dict(d) for d in proposal.distributions] == [{8: 1.0}, {9: 1.0}, {11: 1.0}]
    else:
        assert_q(as_dict(proposal.distributions[0]), WB_AFTER_345)


def test_modes_differ_and_the_step_cache_keeps_them_apart(graph: NGramGraph) -> None:
    drafter = Drafter(graph)  # one drafter: its greedy step cache is shared by the calls below
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
def test_attentive_mix_false_forces_backoff(graph: NGramGraph, mixing: str) -> None:
    drafter = Drafter(graph, cache_size=0)
    forced = ClassicParams(attentive_mix=False, mixing=mixing)
    assert forced.effective_mixing == "backoff"
    dist, order = drafter.next_distribution([3, 4, 5], forced)
    assert (as_dict(dist), order) == ({8: 1.0}, 3)
    reference = drafter.next_distribution([3, 4, 5], ClassicParams(mixing="backoff"))
    assert as_dict(reference[0]) == {8: 1.0}


def test_default_mixing_is_witten_bell_with_escape_weight_8() -> None:
    """Chosen by measured tokens per verifier forward on the tinystories dev prompts (2.61 vs
    1.92 for the seed formula and 2.37 for plain backoff at k=8)."""
    filled = DraftParams().with_defaults()  # unset: a graph's tuned value, else these
    assert filled.mixing == DraftConfig().mixing == "witten-bell"
    assert filled.escape_weight == DraftConfig().escape_weight == 8.0
    assert DraftParams().min_draft_prob == DraftConfig().min_draft_prob == 0.0
    assert DraftParams().effective_mixing == "witten-bell"
    assert DraftParams(attentive_mix=False).effective_mixing == "backoff"


# -- adaptive draft length --------------------------------------------------------------------


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
    graph: NGramGraph, mixing: str, threshold: float, expected: list[int]
) -> None:
    for cache_size in (0, 100):  # from the graph, then again through a warm step cache
        drafter = Drafter(graph, cache_size=cache_size)
        # without a threshold, cached steps may lack q(d): it is recomputed when needed
        drafter.propose([3, 4, 5], ClassicParams(k=8, mixing=mixing))
        params = ClassicParams(k=8, mixing=mixing, min_draft_prob=threshold)
        for _ in range(2):
            assert drafter.propose([3, 4, 5], params).token_ids == expected


def test_min_draft_prob_needs_a_match_for_the_first_token(graph: NGramGraph) -> None:
    params = ClassicParams(k=8, min_draft_prob=1.0)
    assert Drafter(graph).propose([42], params).token_ids == []  # dead end: still empty


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


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mixing": "kneser-ney"}, "mixing"),
        ({"mixing": ""}, "mixing"),
        ({"min_draft_prob": -0.1}, "min_draft_prob"),
        ({"min_draft_prob": 1.5}, "min_draft_prob"),
        ({"min_draft_prob": math.nan}, "min_draft_prob"),
        ({"escape_weight": 0.0}, "escape_weight"),
        ({"escape_weight": -1.0}, "escape_weight"),
        ({"escape_weight": math.inf}, "escape_weight"),
    ],
)
def test_validation_names_the_field(changes: dict, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ClassicParams(**changes).validate()
    assert info.value.field == field
    with pytest.raises(ValueError, match=field):
        DraftConfig(**changes)


def test_propose_request_fields_reach_the_params() -> None:
    request = draft_pb2.ProposeRequest(
        context_token_ids=[1], mixing="witten-bell", min_draft_prob=0.25, escape_weight=8.0
    )
    params, _ = draft_params_from_pb(request, ClassicParams())
    assert (params.mixing, params.min_draft_prob, params.escape_weight) == ("witten-bell", 0.25, 8)
    unset, _ = draft_params_from_pb(
        draft_pb2.ProposeRequest(context_token_ids=[1]), ClassicParams()
    )
    assert (unset.mixing, unset.min_draft_prob) == ("seed", 0.0)


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"mixing": "bogus"}, "mixing"),
        ({"min_draft_prob": 2.0}, "min_draft_prob"),
        ({"min_draft_prob": math.nan}, "min_draft_prob"),
        ({"escape_weight": 0.0}, "escape_weight"),
    ],
)
def test_bad_propose_fields_are_invalid_argument(
    graph_dir: Path, request_fields: dict, field: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        draft_params_from_pb(
            draft_pb2.ProposeRequest(context_token_ids=[1], **request_fields), ClassicParams()
        )
    assert info.value.field == field
    server = start_server(graph_dir, port=0)
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            with pytest.raises(grpc.RpcError) as rpc:
                stub.Propose(
                    draft_pb2.ProposeRequest(context_token_ids=[5], **request_fields), timeout=5
                )
            assert rpc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in rpc.value.details()
            ok = stub.Propose(
                draft_pb2.ProposeRequest(
                    context_token_ids=[3, 4, 5],
                    k=8,
                    mixing="witten-bell",
                    escape_weight=1.0,
                    min_draft_prob=0.31,
                ),
                timeout=5,
            )
            assert list(ok.draft_token_ids) == [8]
    finally:
        server.stop(0)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"mixing": "bogus"}, "draft.mixing"),
        ({"min_draft_prob": -1.0}, "draft.min_draft_prob"),
        ({"escape_weight": -1.0}, "draft.escape_weight"),
    ],
)
def test_gateway_draft_options_name_the_field(options: dict, field: str) -> None:
    params = draft_options_from_pb(common_pb2.DraftOptions(**options), DraftConfig())
    with pytest.raises(InvalidArgumentError) as info:
        GenerationRequest(prompt_ids=[1], draft=params).validate()
    assert info.value.field == field


def test_gateway_draft_options_pass_through() -> None:
    options = common_pb2.DraftOptions(mixing="witten-bell", min_draft_prob=0.1, escape_weight=8)
    params = draft_options_from_pb(options, DraftConfig())
    assert (params.mixing, params.min_draft_prob, params.escape_weight) == ("witten-bell", 0.1, 8)
    defaults = draft_options_from_pb(
        common_pb2.DraftOptions(), DraftConfig(mixing="backoff", min_draft_prob=0.2)
    )
    assert (defaults.mixing, defaults.min_draft_prob) == ("backoff", 0.2)


def test_config_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECULANT_DRAFT__MIXING", "witten-bell")
    monkeypatch.setenv("SPECULANT_DRAFT__MIN_DRAFT_PROB", "0.1")
    config = DraftConfig()
    assert (config.mixing, config.min_draft_prob) == ("witten-bell", 0.1)
    params = DraftParams.from_config(config)
    assert (params.mixing, params.min_draft_prob) == ("witten-bell", 0.1)
