"""The drafting core on hand-made graphs: backoff, dead ends, mixing, strategies, validation."""

from __future__ import annotations

import math
import sys
from functools import partial
from pathlib import Path

import lmdb
import numpy as np
import pytest
from graph_factory import write_graph
from scipy import stats

from draft_service.drafting import Drafter
from draft_service.mixing import order_weights
from speculant.errors import InvalidArgumentError
from speculant.graph_format import META_DB, META_KEY, GraphFormatError
from speculant.graph_manifest import write_manifest
from speculant.graph_reader import NGramGraph
from speculant.types import DraftParams
from tests.fixtures.graphs import CORE_CHAINS, CORE_VOCAB

# These tests pin the seed's attentive formula ("seed" mixing), which the DESIGN's formula and
# parameters describe; the default mixing is Witten-Bell (tests/test_mixing.py).
# chains without the context overlay, unless a test says
SeedParams = partial(DraftParams, mixing="seed", tree_nodes=0, overlay_weight=0.0)


@pytest.fixture
def drafter(core_graph: NGramGraph) -> Drafter:
    return Drafter(core_graph)


def hand_q(
    context: list[int], params: DraftParams, chains: dict = CORE_CHAINS
) -> tuple[dict[int, float], int]:
    """Reference q (dict id -> prob) and matched order, straight from the formula."""
    params = params.with_defaults()  # unset mixing parameters: the built-in defaults
    matching = []
    for order in range(min(len(context), max(chains)), 0, -1):
        succ = chains.get(order, {}).get(tuple(context[len(context) - order :]))
        if succ:
            matching.append((order, succ))
            if not params.attentive_mix:
                break
    if not matching:
        return {}, 0
    scores = []
    for order, succ in matching:
        total = sum(succ.values())
        entropy = -sum(c / total * math.log(c / total) for c in succ.values())
        scores.append(
            params.order_bias * math.log(order)
            + params.reliability_weight * math.log(1 + total)
            - params.entropy_penalty * entropy
        )
    top = max(scores)
    exps = [math.exp((s - top) / params.mix_temperature) for s in scores]
    weights = [e / sum(exps) for e in exps]
    q: dict[int, float] = {}
    for w, (_, succ) in zip(weights, matching, strict=True):
        total = sum(succ.values())
        for token, count in succ.items():
            q[token] = q.get(token, 0.0) + w * count / total
    return q, matching[0][0]


def as_dict(dist) -> dict[int, float]:
    return dict(zip(dist.token_ids.tolist(), dist.probs.tolist(), strict=True))


def plain(proposal) -> tuple:
    """A proposal as comparable plain data."""
    dists = [as_dict(d) for d in proposal.distributions]
    return proposal.token_ids, dists, proposal.matched_orders


# -- backoff -----------------------------------------------------------------------------------


def test_backoff_picks_the_highest_matching_order_and_rematches(drafter: Drafter) -> None:
    params = SeedParams(k=8, attentive_mix=False)
    proposal = drafter.propose([7, 1], params)
    # (7, 1) unknown -> order 1 (1,) -> 2; (7, 1, 2) unknown -> order 2 (1, 2) -> 3;
    # (1, 2, 3) -> order 3 -> 9; then nothing follows 9: a partial draft.
    assert proposal.token_ids == [2, 3, 9]
    assert proposal.matched_orders == [1, 2, 3]
    assert [as_dict(d) for d in proposal.distributions] == [{2: 1.0}, {3: 1.0}, {9: 1.0}]


def test_short_context_works(drafter: Drafter) -> None:
    proposal = drafter.propose([1], SeedParams(k=8, attentive_mix=False))
    assert proposal.token_ids == [2, 3, 9]
    assert proposal.matched_orders == [1, 2, 3]


def test_k_limits_the_draft(drafter: Drafter) -> None:
    proposal = drafter.propose([7, 1], SeedParams(k=2, attentive_mix=False))
    assert proposal.token_ids == [2, 3]
    assert len(proposal.distributions) == len(proposal.matched_orders) == 2


@pytest.mark.parametrize("context", [[], [50], [9], [1, 2, 3, 9]])
@pytest.mark.parametrize("strategy", ["greedy", "sampling"])
def test_dead_end_gives_an_empty_draft(drafter: Drafter, context, strategy) -> None:
    proposal = drafter.propose(context, SeedParams(k=5, strategy=strategy), seed=1)
    assert proposal.token_ids == []
    assert proposal.distributions == []
    assert proposal.matched_orders == []


def test_dead_end_after_some_tokens_gives_a_partial_draft(drafter: Drafter) -> None:
    proposal = drafter.propose([3], SeedParams(k=8))  # 3 -> 4 -> 5 -> nothing
    assert proposal.token_ids == [4, 5]
    assert proposal.matched_orders == [1, 1]


def test_only_the_last_max_order_tokens_matter(drafter: Drafter) -> None:
    params = SeedParams(k=4)
    long = [0, 5, 6, 7, 8] * 20 + [1, 2, 3]
    assert plain(drafter.propose(long, params)) == plain(drafter.propose([1, 2, 3], params))


# -- mixing ------------------------------------------------------------------------------------


def test_mixing_weights_by_hand() -> None:
    # Context (1, 2): order 2 has {3: 2} (C=2, H=0), order 1 has {3: 2, 4: 2} (C=4, H=ln 2).
    s2 = 1.0 * math.log(2) + 1.0 * math.log(3) - 0.5 * 0.0
    s1 = 1.0 * math.log(1) + 1.0 * math.log(5) - 0.5 * math.log(2)
    w2 = math.exp(s2) / (math.exp(s2) + math.exp(s1))
    got = order_weights([2, 1], [2.0, 4.0], [0.0, math.log(2)], SeedParams())
    assert got == pytest.approx([w2, 1 - w2], rel=1e-12)


def test_mixed_q_equals_the_formula(drafter: Drafter) -> None:
    params = SeedParams(k=1, strategy="sampling")
    # Context (1, 2): q(3) = w2 + w1/2, q(4) = w1/2.
    s2 = math.log(2) + math.log(3)
    s1 = math.log(5) - 0.5 * math.log(2)
    w2 = 1 / (1 + math.exp(s1 - s2))
    expected = {3: w2 + (1 - w2) / 2, 4: (1 - w2) / 2}
    dist, order = drafter.next_distribution([1, 2], params)
    assert order == 2
    assert as_dict(dist) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    proposal = drafter.propose([1, 2], params, seed=3)
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
def test_q_matches_reference_for_several_parameters(drafter: Drafter, params, context) -> None:
    expected, order = hand_q(context, params)
    dist, got_order = drafter.next_distribution(context, params)
    assert got_order == order
    assert as_dict(dist) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_greedy_is_argmax_of_the_mixed_q(drafter: Drafter) -> None:
    # After (1, 2, 3): backoff alone drafts 9 (order 3); the mix favours 4 (orders 2 and 1).
    q, _ = hand_q([1, 2, 3], SeedParams())
    assert max(q, key=q.get) == 4
    mixed = drafter.propose([1, 2, 3], SeedParams(k=1))
    assert mixed.token_ids == [4]
    assert mixed.matched_orders == [3]
    assert as_dict(mixed.distributions[0]) == {4: 1.0}  # greedy: q is the point mass
    backoff = drafter.propose([1, 2, 3], SeedParams(k=1, attentive_mix=False))
    assert backoff.token_ids == [9]


def test_greedy_ties_go_to_the_lowest_token_id(drafter: Drafter) -> None:
    # (2,) has {3: 2, 4: 2}. (10, 10) has {12: 2, 11: 1} and (10,) {11: 2, 12: 1}: with equal
    # order weights (order_bias 0), q(11) == q(12) exactly, and 12 comes first in the data.
    assert drafter.propose([2], SeedParams(k=1)).token_ids == [3]
    params = SeedParams(k=1, order_bias=0.0, entropy_penalty=0.0, reliability_weight=0.0)
    q, _ = hand_q([10, 10], params)
    assert q[11] == q[12]
    assert drafter.propose([10, 10], params).token_ids == [11]


# -- sampling ----------------------------------------------------------------------------------


def test_sampling_is_reproducible_with_a_seed(drafter: Drafter) -> None:
    params = SeedParams(k=6, strategy="sampling")
    runs = [drafter.propose([20, 20], params, seed=s) for s in range(30)]
    again = [drafter.propose([20, 20], params, seed=s) for s in range(30)]
    for a, b in zip(runs, again, strict=True):
        assert a.token_ids == b.token_ids
        assert [as_dict(d) for d in a.distributions] == [as_dict(d) for d in b.distributions]
    assert len({tuple(r.token_ids[:1]) for r in runs}) > 1  # different seeds do differ


def test_sampling_without_seed_is_nondeterministic(drafter: Drafter) -> None:
    params = SeedParams(k=1, strategy="sampling")
    firsts = {drafter.propose([20, 20], params).token_ids[0] for _ in range(200)}
    assert len(firsts) > 1


def test_sampling_follows_q(drafter: Drafter) -> None:
    """Chi-square: the drawn tokens follow the reported q, and not the order-2 P alone."""
    params = SeedParams(k=1, strategy="sampling", order_bias=0.3)
    expected, _ = hand_q([20, 20], params)
    ids = sorted(expected)
    n = 20_000
    counts = dict.fromkeys(ids, 0)
    for seed in range(n):
        proposal = drafter.propose([20, 20], params, seed=seed)
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


def test_sampling_draws_only_tokens_with_positive_q(drafter: Drafter) -> None:
    params = SeedParams(k=1, strategy="sampling", mix_temperature=1e-3, order_bias=100.0)
    for seed in range(300):
        proposal = drafter.propose([1, 2, 3], params, seed=seed)
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


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"k": 0}, "k"),
        ({"k": 65}, "k"),
        ({"mix_temperature": 0.0}, "mix_temperature"),
        ({"mix_temperature": -1.0}, "mix_temperature"),
        ({"mix_temperature": float("nan")}, "mix_temperature"),
        ({"order_bias": -0.1}, "order_bias"),
        ({"reliability_weight": -1.0}, "reliability_weight"),
        ({"entropy_penalty": -2.0}, "entropy_penalty"),
        ({"entropy_penalty": float("nan")}, "entropy_penalty"),
        ({"strategy": "beam"}, "strategy"),
    ],
)
def test_bad_params_name_the_field(drafter: Drafter, kwargs, field) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        drafter.propose([1, 2], SeedParams(**kwargs))
    assert info.value.field == field
    assert field in str(info.value)


@pytest.mark.parametrize("context", [[1, CORE_VOCAB], [-1, 2], [1, 2, 10**9], np.array([1, 100])])
def test_token_ids_outside_the_vocabulary_are_rejected(drafter: Drafter, context) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        drafter.propose(context, SeedParams())
    assert info.value.field == "context_token_ids"


def test_numpy_contexts_work(drafter: Drafter) -> None:
    params = SeedParams(k=8, attentive_mix=False)
    for dtype in (np.int32, np.int64, np.uint32):
        assert drafter.propose(np.array([7, 1], dtype=dtype), params).token_ids == [2, 3, 9]


# -- the graph ---------------------------------------------------------------------------------


def test_successors_lookup(core_graph: NGramGraph) -> None:
    ids, counts = core_graph.successors([20])
    assert ids.tolist() == [21, 22, 23, 24]
    assert counts.tolist() == [5, 3, 1, 1]
    assert core_graph.successors([1, 2, 3])[0].tolist() == [9]
    assert core_graph.successors([5]) is None
    assert core_graph.successors([]) is None
    assert core_graph.successors([1, 2, 3, 4]) is None  # beyond max order
    assert core_graph.meta.max_order == 3
    assert core_graph.vocab_size == CORE_VOCAB


def test_missing_graph_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GraphFormatError, match="not found"):
        NGramGraph.open(tmp_path / "nope")
    with pytest.raises(GraphFormatError, match=r"no data\.mdb"):
        NGramGraph.open(tmp_path)


def test_unfinished_graph_is_refused(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g", CORE_CHAINS, write_meta=False)
    with pytest.raises(GraphFormatError, match="unfinished"):
        NGramGraph.open(path)


def test_unknown_version_is_refused(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g", CORE_CHAINS, format_version=99)
    with pytest.raises(GraphFormatError, match="format version 99"):
        NGramGraph.open(path)


def test_corrupt_meta_is_refused(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g", CORE_CHAINS)
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(write=True, db=env.open_db(META_DB)) as txn:
        txn.put(META_KEY, b"{not json")
    env.close()
    with pytest.raises(GraphFormatError, match="corrupt"):
        NGramGraph.open(path)


def test_corrupt_data_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data.mdb").write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(GraphFormatError):
        NGramGraph.open(tmp_path)


def test_missing_order_is_refused(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g", {1: {(1,): {2: 1}}}, max_order=1)
    # Claim a higher max order than the databases hold.
    env = lmdb.open(str(path), max_dbs=4)
    meta_db = env.open_db(META_DB)
    with env.begin(write=True, db=meta_db) as txn:
        raw = txn.get(META_KEY).replace(b'"max_order": 1', b'"max_order": 2')
        txn.put(META_KEY, raw)
    env.close()
    write_manifest(path)  # a consistent graph, only its meta claims order 2
    with pytest.raises(GraphFormatError, match="order 2"):
        NGramGraph.open(path)


def test_closed_graph_refuses_lookups(tmp_path: Path) -> None:
    graph = NGramGraph.open(write_graph(tmp_path / "g", CORE_CHAINS))
    graph.close()
    graph.close()  # idempotent
    with pytest.raises(GraphFormatError, match="closed"):
        Drafter(graph).propose([1], SeedParams())


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


def test_release_pages_keeps_lookups_working(core_graph: NGramGraph, drafter: Drafter) -> None:
    params = SeedParams(k=8, attentive_mix=False)
    before = drafter.propose([7, 1], params).token_ids
    released = core_graph.release_pages()
    if sys.platform.startswith("linux"):
        assert released > 0  # the data.mdb mapping was found and advised
    assert drafter.propose([7, 1], params).token_ids == before == [2, 3, 9]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("overlay_weight", 1.7976931348623157e308),  # found by the fuzz test: q became NaN
        ("order_bias", 1e7),
        ("reliability_weight", float("inf")),
        ("entropy_penalty", float("nan")),
        ("escape_weight", 2e6),
        ("mix_temperature", 1e-9),
    ],
)
def test_mixing_weights_beyond_their_bounds_are_invalid(drafter, field, value):
    with pytest.raises(InvalidArgumentError) as info:
        drafter.propose([1, 2, 3], DraftParams(k=4, **{field: value}))
    assert info.value.field == field


@pytest.mark.parametrize("strategy", ["greedy", "sampling"])
@pytest.mark.parametrize("tree_nodes", [0, 6])
def test_mixing_weights_at_their_bounds_still_draft(drafter, strategy, tree_nodes):
    """The bounds are where float64 still holds: every extreme combination gives a draft."""
    top = 1e6
    for mixing in ("seed", "witten-bell"):
        for extreme in (
            {"order_bias": top, "reliability_weight": top, "entropy_penalty": top},
            {"mix_temperature": 1e-6, "escape_weight": top, "overlay_weight": top},
        ):
            params = DraftParams(
                k=4, strategy=strategy, tree_nodes=tree_nodes, mixing=mixing, **extreme
            )
            for context in ([1, 2, 3], [1, 2, 3, 1, 2, 3], [10]):
                proposal = drafter.propose(context, params, seed=1)
                assert proposal.token_ids and all(0 <= t < CORE_VOCAB for t in proposal.token_ids)
