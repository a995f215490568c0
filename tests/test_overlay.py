"""Context overlay: per order, counts c_graph,o + overlay_weight * c_context,o, then the selected
mixing. A hand-made graph where the overlay changes q exactly as that rule says, the search of the
context, validation naming `overlay_weight`, the coordinator sending the whole context, source
statistics, and exactness at temperature 0 with the overlay on, embedded and over the services
(16 dev prompts, as tests/test_mixing_exactness.py: the demo kit's 8, then 8 with ../shared)."""

from __future__ import annotations

import itertools
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from graph_factory import write_graph

from draft_service import overlay
from draft_service.drafting import Drafter
from draft_service.mixing import witten_bell_weights
from draft_service.overlay import ContextIndex, ContextIndexCache, merge_order
from gateway.engine import RequestDefaults
from gateway.generation import GenerationRequest
from speculant.config import DEFAULT_OVERLAY_WEIGHT, DraftConfig, DraftParams
from speculant.errors import InvalidArgumentError
from speculant.graph_reader import NGramGraph
from speculant.v1 import common_pb2, draft_pb2
from speculant.wire import draft_fields_from_pb, draft_params_from_pb
from tests.exactness_checks import (
    assert_parallel,
    generate_embedded,
    generate_over_gateway,
    totals,
)
from tests.fixtures.e2e import PROMPTS16
from tests.scripted_round import run, setup

K = 8

# Order 1: after 8 the corpus saw 9 twice and 2 once; after 1: 2 (x3), 3 (x1).
# Order 2: (5, 1) -> 2 once. The context (4, 8) never occurs in the corpus.
CHAINS = {
    1: {(8,): {9: 2, 2: 1}, (1,): {2: 3, 3: 1}, (6,): {4: 1}},
    2: {(5, 1): {2: 1}},
}


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> NGramGraph:
    path = write_graph(Path(tmp_path_factory.mktemp("overlay")) / "g", CHAINS, max_order=2)
    opened = NGramGraph.open(path)
    yield opened
    opened.close()


CHAIN_OF_1 = DraftParams(k=1, tree_nodes=0, overlay_weight=0.0)


def params(**changes: object) -> DraftParams:
    """One sampled draft token from the graph alone, unless changes say otherwise."""
    defaults = {"k": 1, "strategy": "sampling", "tree_nodes": 0, "overlay_weight": 0.0}
    return DraftParams(**{**defaults, **changes}).validate()


def q_of(drafter: Drafter, context: list[int], p: DraftParams) -> dict[int, float]:
    proposal = drafter.propose(context, p, seed=0)
    dist = proposal.distributions[0]
    return dict(zip(dist.token_ids.tolist(), dist.probs.tolist(), strict=True))


def packed(tokens: list[int]) -> bytes:
    return np.asarray(tokens, dtype=">u4").tobytes()


def index_of(tokens: list[int], max_order: int, chunks: int = 1) -> ContextIndex:
    """An index of tokens, fed in `chunks` extensions (as rounds would)."""
    index = ContextIndex(max_order)
    cuts = np.linspace(0, len(tokens), chunks + 1).astype(int)
    for start, end in itertools.pairwise(cuts):
        index.extend(packed(tokens[start:end]))
    return index


def brute_force_successors(context: list[int], tail: list[int], max_order: int) -> tuple:
    """The definition (draft_service.overlay), position by position."""
    found = []
    for order in range(min(len(tail), max_order), 0, -1):
        counts: dict[int, int] = {}
        for i in range(order, len(context)):
            if context[i - order : i] == tail[-order:]:
                counts[context[i]] = counts.get(context[i], 0) + 1
        if counts:
            found.append((order, tuple(sorted(counts.items()))))
    return tuple(found)


def test_context_index_counts_every_order() -> None:
    index = index_of([1, 2, 3, 4, 9, 2, 3, 4, 7, 2, 3, 5], max_order=5)
    found = index.successors(packed([8, 2, 3, 4]))
    # (2, 3, 4) occurs twice, followed by 9 and 7; (8, 2, 3, 4) never
    assert found == ((3, ((7, 1), (9, 1))), (2, ((7, 1), (9, 1))), (1, ((7, 1), (9, 1))))
    assert index.successors(packed([3, 5])) == ()  # 5 only at the end: no successor
    nested = index_of([2, 3, 7, 3, 8, 2, 3, 7], max_order=3).successors(packed([2, 3]))
    assert nested == ((2, ((7, 2),)), (1, ((7, 2), (8, 1))))


@pytest.mark.parametrize("chunks", [1, 3, 17])
def test_context_index_equals_the_definition_however_it_grew(chunks: int) -> None:
    rng = np.random.default_rng(chunks)
    for _ in range(40):
        context = rng.integers(0, 6, size=int(rng.integers(0, 60))).tolist()  # many repeats
        index = index_of(context, max_order=4, chunks=chunks)
        for _ in range(10):
            tail = rng.integers(0, 6, size=int(rng.integers(1, 6))).tolist()
            expected = brute_force_successors(context, tail, 4)
            assert index.successors(packed(tail)) == expected, (context, tail)


def test_the_index_cache_reuses_a_prefix_and_never_shares_one_index() -> None:
    cache = ContextIndexCache(max_order=3, capacity=4)
    first = cache.checkout(packed([1, 2, 3, 1, 2]))
    cache.checkin(first)
    grown = cache.checkout(packed([1, 2, 3, 1, 2, 4, 1, 2]))  # the next round: extended
    assert grown is first and grown.length == 8
    assert cache.checkout(packed([1, 2, 3, 1, 2, 4, 1, 2])) is not grown  # held: never shared
    assert grown.successors(packed([1, 2])) == brute_force_successors(
        [1, 2, 3, 1, 2, 4, 1, 2], [1, 2], 3
    )
    other = cache.checkout(packed([1, 2, 3, 1, 2]))  # shorter than the held one: a new index
    assert other is not grown and other.length == 5
    cache.checkin(grown)
    cache.checkin(other)
    diverged = cache.checkout(packed([1, 2, 3, 1, 9, 9]))  # [1, 2, 3, 1, 2] is no prefix
    assert diverged.successors(packed([1])) == ((1, ((2, 1), (9, 1))),)
    for i in range(10):  # bounded: the oldest go first
        cache.checkin(cache.checkout(packed([50 + i, 1, 2])))
    assert len(cache) == 4


def test_concurrent_overlay_drafts_equal_fresh_ones(graph: NGramGraph) -> None:
    """Threads drafting for contexts that share a prefix (one bucket of the index cache) get
    what a fresh drafter proposes for each context."""
    drafter = Drafter(graph)
    base = [1, 3, 5, 1, 8, 6, 4, 8, 1, 3]
    contexts = [
        base + [int(t) for t in np.random.default_rng(i).integers(1, 9, size=i)] for i in range(12)
    ]
    p = DraftParams(k=3, overlay_weight=2.0)
    expected = [Drafter(graph).propose(c, p).token_ids for c in contexts]

    def draft(i: int) -> list[int]:
        return drafter.propose(contexts[i % len(contexts)], p).token_ids

    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(draft, range(240)))
    assert got == [expected[i % len(contexts)] for i in range(240)]


def test_overlay_adds_weighted_context_counts_at_a_shared_order(graph: NGramGraph) -> None:
    """Context [1, 3, 5, 1]: the context has (1 -> 3) once at order 1 (its last 1 has no
    successor; (5, 1) has none either). With w = 2 order 1 becomes {2: 3, 3: 1 + 2}, order 2 the
    graph's {2: 1}; Witten-Bell (b = 1) mixes those."""
    drafter = Drafter(graph)
    context = [1, 3, 5, 1]
    p = params(mixing="witten-bell", escape_weight=1.0, overlay_weight=2.0)
    q = q_of(drafter, context, p)
    w_high, w_low = witten_bell_weights([1.0, 6.0], [1, 2], 1.0)
    expected = {2: w_high * 1.0 + w_low * 3 / 6, 3: w_low * 3 / 6}
    assert q.keys() == expected.keys()
    for token, value in expected.items():
        assert q[token] == pytest.approx(value, rel=1e-12)
    # overlay_weight 0: the graph alone, order 1 {2: 3, 3: 1}
    plain = q_of(drafter, context, params(mixing="witten-bell", escape_weight=1.0))
    w_high, w_low = witten_bell_weights([1.0, 4.0], [1, 2], 1.0)
    assert plain[3] == pytest.approx(w_low * 1 / 4, rel=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_merging_one_order_pairwise_equals_the_sorted_union(seed: int, monkeypatch) -> None:
    """merge_order's pairwise merge (small inputs) and its sorted union (large ones) give each
    id the same count, g + w * e bit for bit, and every id once."""
    rng = np.random.default_rng(seed)
    g_ids = rng.choice(60, size=int(rng.integers(1, 40)), replace=False).astype(np.uint32)
    g_counts = rng.integers(1, 50, size=g_ids.size).astype(np.uint32)
    e_ids = rng.choice(60, size=int(rng.integers(1, 12)), replace=False).astype(np.int64)
    e_counts = rng.integers(1, 5, size=e_ids.size).astype(np.float64)
    weight = float(rng.choice([0.5, 3.0, 64.0]))

    def merged() -> dict[int, float]:
        ids, counts = merge_order(g_ids, g_counts, e_ids, e_counts, weight)
        assert ids.size == np.unique(ids).size == len(set(g_ids.tolist()) | set(e_ids.tolist()))
        return dict(zip(ids.tolist(), counts.tolist(), strict=True))

    pairwise = merged()
    monkeypatch.setattr(overlay, "PAIRWISE_LIMIT", 0)
    assert merged() == pairwise
    graph_counts = dict(zip(g_ids.tolist(), g_counts.tolist(), strict=True))
    extra_counts = dict(zip(e_ids.tolist(), e_counts.tolist(), strict=True))
    for token, count in pairwise.items():
        g, e = graph_counts.get(token), extra_counts.get(token)
        expected = float(g) if e is None else e * weight if g is None else g + e * weight
        assert count == expected


def test_overlay_matches_a_context_the_graph_never_saw(graph: NGramGraph) -> None:
    """Context [4, 8, 6, 4, 8]: (4, 8) -> 6 only in the request. Order 2 = {6: w}, order 1 =
    {9: 2, 2: 1, 6: w}; so the overlay's name-like continuation wins at the high order."""
    drafter = Drafter(graph)
    context = [4, 8, 6, 4, 8]
    for w in (0.5, 1.0, 4.0):
        q = q_of(
            drafter, context, params(mixing="witten-bell", escape_weight=1.0, overlay_weight=w)
        )
        w_high, w_low = witten_bell_weights([w, 3 + w], [1, 3], 1.0)
        expected = {
            6: w_high + w_low * w / (3 + w),
            9: w_low * 2 / (3 + w),
            2: w_low * 1 / (3 + w),
        }
        assert q == pytest.approx(expected, rel=1e-12)
    # backoff: the highest matching order (2, from the overlay alone) is q
    q = q_of(drafter, context, params(mixing="backoff", overlay_weight=1.0))
    assert q == {6: 1.0}
    # seed mixing on the same combined counts: weights from C_o and entropies of the combined
    seeded = q_of(drafter, context, params(mixing="seed", overlay_weight=1.0))
    assert set(seeded) == {6, 9, 2} and math.isclose(sum(seeded.values()), 1.0)
    # greedy: the argmax of the combined q, its order and its source
    greedy = drafter.propose(
        context,
        DraftParams(k=3, mixing="witten-bell", escape_weight=1.0, overlay_weight=1.0, tree_nodes=0),
    )
    assert greedy.token_ids[0] == 6 and greedy.matched_orders[0] == 2
    assert greedy.sources[0] == "overlay"
    assert drafter.propose(context, CHAIN_OF_1).token_ids == [9]  # overlay off
    assert drafter.propose(context, CHAIN_OF_1).sources == ["graph"]


def test_source_both_and_graph(graph: NGramGraph) -> None:
    drafter = Drafter(graph)
    # the context has 1 -> 2: the greedy token 2 is listed by the graph and the context
    proposal = drafter.propose([1, 2, 7, 1], replace(CHAIN_OF_1, overlay_weight=1.0))
    assert proposal.token_ids == [2] and proposal.sources == ["both"]
    # 6 -> 4 only in the graph (the context never continues a 6): graph path, cache allowed
    proposal = drafter.propose([3, 6], replace(CHAIN_OF_1, overlay_weight=1.0))
    assert proposal.token_ids == [4] and proposal.sources == ["graph"]


def test_greedy_cache_follows_the_context(graph: NGramGraph) -> None:
    """The same tail with different context counts gives different steps (no stale cache)."""
    drafter = Drafter(graph)
    p = DraftParams(k=1, mixing="backoff", overlay_weight=10.0, tree_nodes=0)
    assert drafter.propose([8, 2, 8], p).token_ids == [2]  # order 1: {9: 2, 2: 1 + 10}
    assert drafter.propose([8, 9, 8], p).token_ids == [9]


@pytest.mark.parametrize("value", [-1.0, math.nan, math.inf])
def test_validation_names_overlay_weight(value: float) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        DraftParams(overlay_weight=value).validate()
    assert info.value.field == "overlay_weight"
    with pytest.raises(ValueError, match="overlay_weight"):
        DraftConfig(overlay_weight=value)
    if not math.isnan(value):
        with pytest.raises(InvalidArgumentError) as info:
            draft_params_from_pb(
                draft_pb2.ProposeRequest(context_token_ids=[1], overlay_weight=value),
                DraftParams(),
            )
        assert info.value.field == "overlay_weight"
    options = RequestDefaults(DraftConfig()).draft_params(
        draft_fields_from_pb(common_pb2.DraftOptions(overlay_weight=value))
    )
    with pytest.raises(InvalidArgumentError) as info:
        GenerationRequest(prompt_ids=[1], draft=options).validate()
    assert info.value.field == "draft.overlay_weight"


def test_overlay_weight_travels_and_has_one_default() -> None:
    assert DraftParams().overlay_weight == DraftConfig().overlay_weight == DEFAULT_OVERLAY_WEIGHT
    assert DEFAULT_OVERLAY_WEIGHT > 0  # on by default; the sizer drops it where it does not pay
    request = draft_pb2.ProposeRequest(context_token_ids=[1], overlay_weight=2.5)
    assert draft_params_from_pb(request, DraftParams())[0].overlay_weight == 2.5
    options = common_pb2.DraftOptions(overlay_weight=3.0)
    assert (
        RequestDefaults(DraftConfig()).draft_params(draft_fields_from_pb(options)).overlay_weight
        == 3.0
    )
    unset = RequestDefaults(DraftConfig(overlay_weight=1.0)).draft_params(
        draft_fields_from_pb(common_pb2.DraftOptions())
    )
    assert unset.overlay_weight == 1.0


def test_coordinator_sends_the_whole_context_only_with_the_overlay(tokenizer) -> None:
    for weight, window in ((0.0, 5), (1.0, None)):
        coordinator, _, drafter, prompt, _ = setup(tokenizer, wrong_at=1)
        # fixed sizes: the sizer would draft some rounds the other way (overlay on / off)
        draft = DraftParams(k=4, overlay_weight=weight, draft_size="fixed")
        run(coordinator, prompt, max_tokens=40, draft=draft)
        assert len(drafter.contexts) > 2
        if window is None:  # prompt + everything generated so far, growing round by round
            assert all(c[: len(prompt)] == prompt for c in drafter.contexts)
            assert len(drafter.contexts[-1]) > 5
        else:
            assert max(len(c) for c in drafter.contexts) == window


OVERLAY_CONFIGS = [
    pytest.param("greedy", "witten-bell", 4.0, id="greedy-wb8-ov4"),
    pytest.param("greedy", "backoff", 1.0, id="greedy-backoff-ov1"),
    pytest.param("sampling", "witten-bell", 1.0, id="sampling-wb8-ov1"),
]


@pytest.mark.parametrize(("strategy", "mixing", "overlay_weight"), OVERLAY_CONFIGS)
def test_greedy_identical_embedded_with_overlay(
    embedded_decoder,
    prompts16,
    references16,
    strategy,
    mixing,
    overlay_weight,
):
    draft = DraftConfig(
        k=K, strategy=strategy, mixing=mixing, overlay_weight=overlay_weight, draft_size="fixed"
    )
    mismatches, stats = generate_embedded(embedded_decoder, prompts16, references16, draft)
    for s in stats:
        assert s.accepted_from_graph + s.accepted_from_overlay + s.accepted_from_both == (
            s.accepted_tokens
        )
    from_overlay = sum(s.accepted_from_overlay + s.accepted_from_both for s in stats)
    rounds, tokens = totals(stats)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_parallel(rounds, tokens, strategy)
    assert from_overlay > 0  # the overlay was used


def test_greedy_identical_over_services_with_overlay(
    services,
    prompts16,
    references16,
):
    draft = common_pb2.DraftOptions(
        k=K, mixing="witten-bell", escape_weight=8.0, overlay_weight=4.0, draft_size="fixed"
    )
    mismatches, stats = generate_over_gateway(services.gateway, prompts16, references16, draft)
    for s in stats:
        assert s.draft_failures == 0
        assert s.accepted_from_graph + s.accepted_from_overlay + s.accepted_from_both == (
            s.accepted_tokens
        )
    from_overlay = sum(s.accepted_from_overlay + s.accepted_from_both for s in stats)
    rounds, tokens = totals(stats)
    assert not mismatches, f"prompts {mismatches} differ from plain greedy decoding"
    assert_parallel(rounds, tokens, "greedy")
    assert from_overlay > 0  # the weight and the sources crossed both services
    assert len(prompts16) in (8, PROMPTS16 - 8)  # one of the two prompt sets
