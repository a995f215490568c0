"""Cost-aware draft sizes (gateway.rounds.draft_sizing): the cost profile, calibrated acceptance and
the sizer's decisions, on hand-made drafts and timings; the round loop with a scripted verifier
(outputs never change); the profile a real verifier measures and reports.

Exactness with the sizer on is tested where exactness is (tests/test_exactness.py and the
chi-square tests run with the default draft_size "cost"); here the decisions themselves."""

from __future__ import annotations

import json
import math

import pytest

from gateway.rounds.coordinator import Coordinator
from gateway.rounds.draft_sizing import (
    BINS,
    CHAIN,
    CONTEXT,
    FIRST_BUDGET,
    GRAPH,
    MARGIN,
    MAX_SKIP,
    SHARE_EVERY,
    STALL_STEPS,
    NodeFeatures,
    PendingDrafts,
    RequestAcceptance,
    Shape,
    SharedAcceptance,
    SizingModel,
    _Average,
    _DraftCost,
    confidence_bin,
)
from speculant.config import DraftParams
from speculant.cost_profile import (
    MAX_FORWARD_TOKENS,
    CostProfile,
    CostProfileError,
    verify_cost_profile,
)
from speculant.types import DraftProposal, ModelInfo, VerifyResult
from tests.scripted_round import EOS, OracleDrafter, ScriptedVerifier, run

# -- the cost profile --------------------------------------------------------------------------


def test_a_profile_interpolates_and_extrapolates_the_points_measured():
    profile = CostProfile.from_points({1: 0.010, 3: 0.014, 8: 0.040, 4: 0.012})
    assert profile.cost(1) == pytest.approx(0.010)
    assert profile.cost(2) == pytest.approx(0.012)  # halfway between 1 and 3
    assert profile.cost(4) == pytest.approx(0.012)  # cheaper than 3, as measured
    assert profile.cost(6) == pytest.approx(0.012 + 2 * (0.040 - 0.012) / 4)
    slope = (0.040 - 0.012) / 4  # past the last point: along the last segment
    assert profile.cost(MAX_FORWARD_TOKENS) == pytest.approx(0.040 + slope * 57)
    assert profile.cost(0) == profile.cost(1) and profile.cost(500) == profile.cost(65)
    assert profile.costs(MAX_FORWARD_TOKENS) == [profile.cost(n) for n in range(1, 66)]


def test_observations_move_a_measured_profile_slowly_and_a_fixed_one_not_at_all():
    measured = CostProfile.from_points({1: 0.010, 65: 0.010}, refresh=True)
    measured.observe(5, 1.0)  # a burst of load: clipped to twice the value, then averaged
    assert 0.010 < measured.cost(5) < 0.0106
    for _ in range(300):
        measured.observe(5, 0.020)
    assert measured.cost(5) == pytest.approx(0.020, rel=0.01)
    assert measured.cost(4) == pytest.approx(0.010)  # other sizes keep their own value
    assert measured.cost(6) == pytest.approx(0.010)  # larger ones too: not forced to grow
    flat = CostProfile.flat(0.010)
    flat.observe(5, 1.0)
    assert flat.cost(5) == 0.010


def test_the_cut_verifies_more_drafts_where_a_larger_forward_costs_less():
    """A CPU whose forward over 2-3 new tokens costs more than over 4 (its BLAS): the sizer
    verifies 3 drafts rather than 1, though the third is unlikely, and 1 where 4 is dear."""
    draft = DraftProposal([10, 11, 12], path_probs=[0.97, 0.97 * 0.05, 0.97 * 0.05**2])
    kept = {}
    for name, four in (("cheap", 0.016), ("dear", 0.035)):
        profile = CostProfile.from_points({1: 0.010, 2: 0.017, 3: 0.026, 4: four, 65: 0.5})
        model = SizingModel(profile)
        teach(model, accepted=True)  # the first node is trusted, the others barely
        kept[name] = len(model.for_request(DraftParams(k=8)).decide(draft, 0.0).keep)
    assert kept == {"cheap": 3, "dear": 1}


def test_a_snapshot_of_a_measured_profile_is_refreshed_from_the_verifiers_forwards():
    """Over the services the coordinator sizes by GetModelInfo's profile, a copy: it refreshes
    it from the forward seconds each Verify reports (the verifier refreshes its own)."""
    snapshot = CostProfile.from_points({1: 0.010, 65: 0.010}, "measured")
    model = SizingModel(snapshot)
    params = DraftParams(k=4)
    sizer = model.for_request(params)
    for position in range(300):
        sizer.plan(params, 4)
        cut = sizer.cut(DraftProposal(), 0.0)
        result = VerifyResult(0, [7], seconds=0.020)
        sizer.observe(None, cut, result, position + 2, [7] * (position + 3), (0, 0.02, 0.02))
    assert model.profile.cost(1) == pytest.approx(0.020, rel=0.01)
    assert snapshot.cost(1) == pytest.approx(0.010)  # the snapshot itself is left alone
    own = CostProfile.from_points({1: 0.010, 65: 0.010}, "measured", refresh=True)
    assert SizingModel(own).profile is own  # the verifier's own (embedded): refreshed there


def batched_rounds(model: SizingModel, rows: int, rounds: int = 100) -> None:
    """Rounds whose Verify ran in forwards of `rows` rows (what the verifier reports)."""
    params = DraftParams(k=4)
    sizer = model.for_request(params)
    for position in range(rounds):
        sizer.plan(params, 4)
        cut = sizer.cut(DraftProposal(), 0.0)
        result = VerifyResult(0, [7], seconds=0.040, batch_rows=rows)
        sizer.observe(None, cut, result, position + 2, [7] * (position + 3), (0, 0.04, 0.04))


def test_in_a_batch_a_draft_is_sized_by_what_its_tokens_cost_every_row():
    """Where a forward's cost grows with its tokens, verifying a token in a batch of 4 rows
    delays all four: the cut keeps fewer drafts than alone. With a flat profile it keeps as
    many; a batch's seconds do not refresh the profile (they are the rows' together)."""
    draft = DraftProposal(list(range(10, 18)), path_probs=[0.9**i for i in range(1, 9)])
    kept = {}
    for name, profile, rows in (
        ("growing alone", CostProfile.from_points({1: 0.010, 65: 0.330}, refresh=True), 1),
        ("growing, batched", CostProfile.from_points({1: 0.010, 65: 0.330}, refresh=True), 4),
        ("flat, batched", CostProfile.flat(0.010), 4),
    ):
        model = SizingModel(profile)
        teach(model, accepted=True)
        cost_before = model.profile.cost(1)
        batched_rounds(model, rows)
        assert model.batch_rows.value == pytest.approx(rows, rel=0.01)
        if rows > 1:
            assert model.profile.cost(1) == cost_before
        kept[name] = len(model.for_request(DraftParams(k=8)).decide(draft, 0.0).keep)
    assert kept["growing, batched"] < kept["growing alone"]
    assert kept["flat, batched"] == len(draft.token_ids)


def test_a_moving_average_is_a_plain_mean_until_its_weight_takes_over():
    average = _Average()
    for sample in (10.0, 1.0, 1.0, 1.0):  # a cold first sample weighs no more than the others
        average.add(sample, weight=0.02)
    assert average.value == pytest.approx(13.0 / 4)
    for _ in range(2000):
        average.add(2.0, weight=0.02)
    assert average.value == pytest.approx(2.0)


def test_drafting_cost_splits_into_a_call_and_its_nodes():
    cost = _DraftCost()
    for nodes in [2, 5, 9, 3, 12, 7] * 20:  # 300 us a call, 10 us a node
        cost.add(nodes, 300e-6 + 10e-6 * nodes)
    per_call, per_node = cost.split()
    assert per_call == pytest.approx(300e-6) and per_node == pytest.approx(10e-6)
    same = _DraftCost()
    for _ in range(50):  # one size only: no split, the cautious per-node mean
        same.add(8, 400e-6)
    assert same.split() == (0.0, pytest.approx(50e-6))


def rich_shape_choices(rich_rate: float, rounds: int = 3000) -> list[Shape]:
    """The shapes a request drafts when a chain emits 3 tokens per second of round and a tree
    with the overlay rich_rate."""
    model = SizingModel(CostProfile.flat(0.01))
    params = DraftParams(k=8, tree_nodes=12, overlay_weight=4.0)
    sizer = model.for_request(params)
    rates = {CHAIN: 3.0, Shape(True, True): rich_rate}
    chosen = []
    for position in range(rounds):
        sizer.plan(params, 8)
        shape = sizer.shape
        chosen.append(shape)
        cut = sizer.cut(confident(4), 1e-4)
        model.round_tokens[shape].add(rates[shape], 0.02)  # tokens a round: the shape's rate
        model.round_seconds[shape].add(1.0, 0.02)
        sizer.observe(
            None, cut, VerifyResult(0, [7]), position + 2, [7] * (position + 3), (0, 0, 0)
        )
    return chosen


def test_a_shape_that_measures_much_worse_is_tried_more_rarely():
    near = rich_shape_choices(2.4)[1000:]
    poor = rich_shape_choices(0.6)[1000:]
    assert near.count(CHAIN) > 0.9 * len(near) and poor.count(CHAIN) > 0.9 * len(poor)
    # tried every 16 / 0.8^2 = 25 and every 16 / 0.2^2 = 400 (capped at 256) rounds
    assert 60 <= near.count(Shape(True, True)) <= 100
    assert 5 <= poor.count(Shape(True, True)) <= 10


def test_a_cheaper_shape_within_the_rates_noise_does_not_replace_the_richest():
    close = rich_shape_choices(2.9)[1000:]  # 3% below the chain's rate: noise
    assert close.count(Shape(True, True)) > 0.9 * len(close)


def test_a_stalled_round_does_not_weigh_on_the_shared_costs_and_rates():
    model = SizingModel(CostProfile.flat(0.01))
    params = DraftParams(k=8, tree_nodes=12, overlay_weight=4.0)
    sizer = model.for_request(params)
    for position, draft_s in enumerate([1e-3, 1e-3, 30.0, 1e-3]):  # a 30 s compile or stall
        sizer.plan(params, 8)
        draft = confident(4)
        cut = sizer.cut(draft, draft_s)
        seconds = (draft_s, 0.01, draft_s + 0.01)
        sizer.observe(draft, cut, VerifyResult(0, [7]), position, [7] * (position + 1), seconds)
    stall = STALL_STEPS * model.verify_seconds(0)
    for shape in sizer.shapes:
        assert model.round_seconds[shape].value < 2 * stall  # not 30 s over a few rounds
        per_call, per_node = model.draft_cost[shape].split()
        assert per_call + 4 * per_node < stall


@pytest.mark.parametrize(
    ("tree_nodes", "overlay_weight", "shapes"),
    [
        (12, 4.0, [Shape(True, True), CHAIN]),
        (12, 0.0, [Shape(True, False), CHAIN]),
        (0, 4.0, [Shape(False, True), CHAIN]),
        (0, 0.0, [CHAIN]),
    ],
)
def test_a_request_compares_the_richest_shape_it_allows_with_a_plain_chain(
    tree_nodes, overlay_weight, shapes
):
    params = DraftParams(k=8, tree_nodes=tree_nodes, overlay_weight=overlay_weight)
    assert SizingModel(CostProfile.flat(0.01)).for_request(params).shapes == shapes


def test_verify_cost_modes_and_files(tmp_path):
    seconds = [0.001 * (1 + n / 10) for n in range(MAX_FORWARD_TOKENS)]
    info = ModelInfo("m", "t", "fp", 10, [2], 512, "cpu", "float32", seconds)
    measured = verify_cost_profile("measured", info)
    assert measured.cost(10) == pytest.approx(seconds[9]) and measured.source == "measured"
    flat = verify_cost_profile("flat", info)
    assert flat.cost(1) == flat.cost(65) == pytest.approx(seconds[0])
    unknown = ModelInfo("m", "t", "fp", 10, [2], 512, "cpu", "float32")  # an older verifier
    assert verify_cost_profile("measured", unknown).source == "flat"
    # `speculant bench cost --json`: the model named like the verifier's, else the first
    bench = {
        "models": [
            {"model": "/x/other", "forward": {"1": {"median_ms": 9.0}, "2": {"median_ms": 9.0}}},
            {"model": "/y/m", "forward": {"1": {"median_ms": 2.0}, "9": {"median_ms": 4.0}}},
        ]
    }
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(bench))
    from_file = verify_cost_profile(str(path), info)
    assert from_file.cost(1) == pytest.approx(0.002) and from_file.cost(5) == pytest.approx(0.003)
    assert from_file.source == f"file:{path}"
    own = tmp_path / "own.json"
    own.write_text(json.dumps(measured.to_json()))
    assert CostProfile.load(own).cost(10) == pytest.approx(seconds[9])
    bad = tmp_path / "bad.json"
    for text in ("{", "[]", '{"models": [{"model": "m", "forward": {"1": {}}}]}'):
        bad.write_text(text)
        with pytest.raises(CostProfileError, match=str(bad)):
            CostProfile.load(bad)


# -- calibrated acceptance ---------------------------------------------------------------------


def tree(tokens, parents, probs, sources=None) -> DraftProposal:
    return DraftProposal(
        list(tokens),
        parents=list(parents),
        path_probs=list(probs),
        sources=list(sources or ["graph"] * len(tokens)),
    )


def test_node_features_take_each_nodes_own_confidence_and_group():
    draft = tree([5, 6, 7], [-1, 0, -1], [0.8, 0.4, 0.1], ["graph", "both", "overlay"])
    nodes = NodeFeatures.of(draft)
    assert nodes.parents == [-1, 0, -1]
    assert nodes.groups == [GRAPH, CONTEXT, CONTEXT]
    assert nodes.bins == [confidence_bin(0.8), confidence_bin(0.5), confidence_bin(0.1)]
    chain = NodeFeatures.of(DraftProposal([5, 6]))  # no path probabilities: an older server
    assert chain.parents == [-1, 0] and chain.bins == [confidence_bin(0.5)] * 2


def test_drafts_are_resolved_against_the_output_verified_or_not():
    """A tree's nodes are tried where the output reached their parent, and accepted where the
    output has their token; deeper nodes wait for later output."""
    acceptance = RequestAcceptance(SharedAcceptance())
    pending = PendingDrafts(acceptance)
    # after position 3: {5 -> {6, 9 -> 4}, 8}; the output continues 5, 9, 4, ...
    draft = tree([5, 8, 6, 9, 4], [-1, -1, 0, 0, 3], [0.9, 0.05, 0.5, 0.3, 0.2])
    nodes = NodeFeatures.of(draft)
    pending.add(draft, 3, nodes)
    pending.resolve([0, 1, 2, 5])  # one token known: 5 accepted, 8 rejected
    acceptance.share()
    tried = acceptance.shared.snapshot()["tried"][GRAPH]
    assert sum(tried) == 2
    pending.resolve([0, 1, 2, 5, 9, 4, 7])  # then 9 (not 6) and 4: every node resolved
    acceptance.share()
    snapshot = acceptance.shared.snapshot()
    assert sum(snapshot["tried"][GRAPH]) == 5 and sum(snapshot["accepted"][GRAPH]) == 3
    pending.resolve([0, 1, 2, 5, 9, 4, 7, 7])
    acceptance.share()
    assert sum(acceptance.shared.snapshot()["tried"][GRAPH]) == 5  # nothing counted twice


def test_a_request_hands_its_counts_to_the_shared_estimate_every_few_rounds():
    shared = SharedAcceptance()
    request = RequestAcceptance(shared)
    b = confidence_bin(0.95)
    for _ in range(SHARE_EVERY - 1):
        request.add({(GRAPH, b): [1, 0]})
    assert shared.snapshot()["tried"][GRAPH][b] == 0  # not yet: its own estimate has them
    assert request.rate(GRAPH, b) < shared.rate(GRAPH, b)
    request.add({(GRAPH, b): [1, 0]})
    assert shared.snapshot()["tried"][GRAPH][b] == SHARE_EVERY
    request.add({(GRAPH, b): [1, 0]})
    request.share()  # as when the request ends
    assert shared.snapshot()["tried"][GRAPH][b] == SHARE_EVERY + 1


def test_estimates_move_from_the_prior_to_what_was_observed():
    shared = SharedAcceptance()
    b = confidence_bin(0.95)
    prior = shared.rate(GRAPH, b)
    assert prior < 0.95  # corpus-only drafts start below their q
    for _ in range(50):
        shared.add({(GRAPH, b): [10, 10]})
    assert shared.rate(GRAPH, b) > 0.97  # the model accepts them all
    request = RequestAcceptance(shared)
    request.add({(GRAPH, b): [20, 0]})  # but never in this request
    assert request.rate(GRAPH, b) < 0.5 < shared.rate(GRAPH, b)
    assert all(0 <= shared.rate(g, x) < 1 for g in (GRAPH, CONTEXT) for x in range(BINS))


# -- the sizer's decisions ---------------------------------------------------------------------


def confident(n: int) -> DraftProposal:
    """A chain of n nodes the calibration (after teach) trusts."""
    return DraftProposal(list(range(10, 10 + n)), path_probs=[0.97**i for i in range(1, n + 1)])


def teach(model: SizingModel, accepted: bool, rounds: int = 200) -> None:
    b = confidence_bin(0.97)
    for _ in range(rounds):
        model.acceptance.add({(GRAPH, b): [10, 10 if accepted else 0]})


def test_with_flat_costs_every_trusted_node_is_verified_and_the_budget_grows():
    model = SizingModel(CostProfile.flat(0.05))
    teach(model, accepted=True)
    sizer = model.for_request(DraftParams(k=16, tree_nodes=0, overlay_weight=0.0))
    first = sizer.budget
    planned = sizer.plan(DraftParams(k=16, tree_nodes=0, overlay_weight=0.0), 16)
    draft = confident(planned.k)
    cut = sizer.cut(draft, 1e-4)
    assert cut.token_ids == draft.token_ids  # the verify cost does not grow: keep them all
    outcome = VerifyResult(len(draft.token_ids), [*draft.token_ids, 3])
    context = [1, 2, *draft.token_ids, 3]
    sizer.observe(draft, cut, outcome, 2, context, (1e-4, 0.05, 0.051))
    assert sizer.budget == min(16, 2 * first)


def test_where_verify_cost_grows_fast_untrusted_drafts_are_cut_and_drafting_pauses():
    steep = CostProfile.from_points({1: 0.010, 2: 0.030, 65: 1.0})
    model = SizingModel(steep)
    teach(model, accepted=False)
    params = DraftParams(k=8, tree_nodes=0, overlay_weight=0.0)
    sizer = model.for_request(params)
    skipped = 0
    for position in range(30):
        planned = sizer.plan(params, 8)
        if planned is None:
            skipped += 1
            context = list(range(position + 3))
            sizer.observe(None, DraftProposal(), VerifyResult(0, [1]), 0, context, (0, 0.01, 0.01))
            continue
        draft = confident(planned.k)
        cut = sizer.cut(draft, 0.002)  # drafting costs 20% of a plain step here
        assert cut.token_ids == []  # nothing pays: a plain decoding step
        context = [*range(position + 2), 99]
        sizer.observe(
            draft, cut, VerifyResult(0, [99]), position + 2, context, (0.002, 0.01, 0.012)
        )
    assert skipped > 0 and sizer.skip <= MAX_SKIP


def serve(
    model: SizingModel,
    params: DraftParams,
    depths: list[int],
    accepted: bool,
    draft_seconds: float = 1e-4,
) -> None:
    """One request of len(depths) rounds (depths: the draft positions left each round, as the
    end of an answer shortens them) drafting confident chains that are accepted whole, or not
    at all, each draft in draft_seconds."""
    sizer = model.for_request(params)
    context = [1, 2]
    for depth in depths:
        planned = sizer.plan(params, depth)
        draft = confident(planned.k) if planned is not None else DraftProposal()
        cut = sizer.cut(draft, 1e-4)
        emitted = [*cut.token_ids, 3] if accepted else [99]
        outcome = VerifyResult(len(emitted) - 1, emitted)
        start = len(context)
        context += emitted
        drafted = draft if planned is not None else None
        timings = (draft_seconds, 0.05, 0.05 + draft_seconds)
        sizer.observe(drafted, cut, outcome, start, context, timings)
    sizer.finish()


def test_a_fresh_request_starts_from_the_budget_earlier_requests_drafted():
    chain = DraftParams(k=16, tree_nodes=0, overlay_weight=0.0)
    model = SizingModel(CostProfile.flat(0.05))
    teach(model, accepted=True)  # the shared estimate: these drafts pay
    for _ in range(3):  # answers whose last rounds the end cuts short
        serve(model, chain, [16] * 20 + [2, 1, 1], accepted=True)
    fresh = model.for_request(chain)
    planned = fresh.plan(chain, 16)
    assert planned is not None and planned.k >= FIRST_BUDGET  # not a short answer's last 4
    draft = confident(planned.k)
    assert fresh.cut(draft, 1e-4).token_ids == draft.token_ids  # all verified, round one


def test_a_fresh_coordinator_probes_and_learns_where_drafts_do_not_pay():
    params = DraftParams(k=16, tree_nodes=64, overlay_weight=4.0)
    model = SizingModel(CostProfile.from_points({1: 0.010, 2: 0.030, 65: 1.0}))
    probe = model.for_request(params).plan(params, 16)
    assert probe is not None and probe.tree_nodes == FIRST_BUDGET and probe.overlay_weight > 0
    teach(model, accepted=False)
    chain = DraftParams(k=16, tree_nodes=0, overlay_weight=0.0)
    for _ in range(3):  # drafting costs a tenth of a plain step
        serve(model, chain, [16] * 20, False, draft_seconds=1e-3)
    assert model.for_request(params).budget <= MARGIN + 1  # later requests draft little


def test_where_drafting_is_cheap_next_to_a_step_the_cut_keeps_nodes_to_choose_from():
    """Drafts that did not pay still leave room: the nodes the drafter makes in a small share of
    a plain step, among which the cut finds the few that pay."""
    budgets = {}
    for draft_seconds in (1e-3, 1e-5):  # a tenth, a thousandth of a plain step
        model = SizingModel(CostProfile.from_points({1: 0.010, 2: 0.030, 65: 1.0}))
        teach(model, accepted=False)
        chain = DraftParams(k=16, tree_nodes=0, overlay_weight=0.0)
        serve(model, chain, [16] * 20, False, draft_seconds)
        budgets[draft_seconds] = model.for_request(chain).budget
    assert budgets[1e-5] > budgets[1e-3]


def test_a_sampled_or_fixed_size_request_is_not_sized(tokenizer):
    """Where a draft never pays, a sized request verifies none of its drafts; a fixed-size or
    a sampled-draft request verifies every draft it is given."""
    steep = CostProfile.from_points({1: 1e-3, 2: 5.0, 65: 9.0})  # a draft never pays
    coordinator, _, prompt, _ = scripted(tokenizer, steep)
    _, sized = run(coordinator, prompt, max_tokens=500, draft=DraftParams(k=4))
    assert sized.stats.draft_tokens == 0 and sized.stats.unverified_draft_tokens > 0
    for draft in (DraftParams(k=4, draft_size="fixed"), DraftParams(k=4, strategy="sampling")):
        coordinator, _, prompt, _ = scripted(tokenizer, steep)
        _, result = run(coordinator, prompt, max_tokens=500, draft=draft)
        assert result.stats.draft_tokens > 0, draft
        assert result.stats.unverified_draft_tokens == 0, draft


def test_the_shape_with_the_best_measured_rate_wins_and_the_others_stay_measured():
    model = SizingModel(CostProfile.flat(0.01))
    params = DraftParams(k=8, tree_nodes=12, overlay_weight=4.0)
    sizer = model.for_request(params)
    chosen = []
    for position in range(400):
        planned = sizer.plan(params, 8)
        shape = sizer.shape
        chosen.append(shape)
        draft = confident(4) if not shape.tree else tree([10, 11], [-1, 0], [0.9, 0.8])
        cut = sizer.cut(draft, 1e-4)
        # chains without the overlay emit 3 tokens a round here, trees with it 1
        tokens = 3 if shape == CHAIN else 1
        outcome = VerifyResult(tokens - 1, [7] * tokens)
        context = [*range(position + 2), 7]
        sizer.observe(draft, cut, outcome, position + 2, context, (1e-4, 0.01, 0.011))
        assert planned.tree_nodes == (planned.tree_nodes if shape.tree else 0)
        assert (planned.overlay_weight > 0) == shape.overlay
    late = chosen[200:]
    assert late.count(CHAIN) > 0.85 * len(late)
    assert set(late) == {CHAIN, Shape(True, True)}  # the other is still tried now and then


# -- the round loop ------------------------------------------------------------------------------


def scripted(tokenizer, profile: CostProfile | None = None):
    prompt = tokenizer("Hello").input_ids
    text = "Once upon a time, there was a little girl named Lily. She loved to play outside."
    script = [*tokenizer(text, add_special_tokens=False).input_ids, EOS]
    verifier = ScriptedVerifier(script)
    drafter = OracleDrafter(verifier, wrong_at=1)
    coordinator = Coordinator(
        drafter, verifier, tokenizer, draft_context_window=5, verify_cost=profile
    )
    return coordinator, verifier, prompt, script


def test_sized_rounds_give_the_same_output_and_count_what_they_cut(tokenizer):
    steep = CostProfile.from_points({1: 1e-3, 2: 5.0, 65: 9.0})  # a draft never pays
    coordinator, verifier, prompt, script = scripted(tokenizer, steep)
    _, result = run(coordinator, prompt, max_tokens=500, draft=DraftParams(k=4))
    assert result.token_ids == script[:-1]
    assert result.stats.draft_tokens == 0 and result.stats.unverified_draft_tokens > 0
    assert result.stats.rounds_without_draft == len(verifier.verify_calls)
    coordinator, verifier, prompt, script = scripted(tokenizer, CostProfile.flat(1e-3))
    _, flat = run(coordinator, prompt, max_tokens=500, draft=DraftParams(k=4))
    assert flat.token_ids == script[:-1]
    assert flat.stats.draft_tokens > 0 and flat.stats.accepted_tokens > 0
    assert flat.stats.rounds < result.stats.rounds


# -- a real verifier's profile -------------------------------------------------------------------


def test_the_verifier_measures_its_profile_and_reports_it(embedded_decoder):
    verifier = embedded_decoder.verifier
    profile = verifier.cost_profile
    assert profile.source == "measured" and profile.refresh
    assert all(0 < profile.cost(n) < 1.0 for n in (1, 2, 8, 65))
    reported = verifier.info.verify_cost_seconds
    assert len(reported) == MAX_FORWARD_TOKENS and all(math.isfinite(s) for s in reported)
