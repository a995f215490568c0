"""What the drafting core accepts: draft parameters out of their bounds (errors name the field),
token ids outside the vocabulary, numpy contexts, and mixing weights at their bounds, on the
hand-made graph of CORE_CHAINS."""

from __future__ import annotations

import numpy as np
import pytest

from draft_service.drafting import Drafter
from speculant.config import DraftParams
from speculant.errors import InvalidArgumentError
from tests.fixtures.graphs import CORE_VOCAB
from tests.seed_formula import SeedParams


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
def test_bad_params_name_the_field(core_drafter: Drafter, kwargs, field) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        core_drafter.propose([1, 2], SeedParams(**kwargs))
    assert info.value.field == field
    assert field in str(info.value)


@pytest.mark.parametrize("context", [[1, CORE_VOCAB], [-1, 2], [1, 2, 10**9], np.array([1, 100])])
def test_token_ids_outside_the_vocabulary_are_rejected(core_drafter: Drafter, context) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        core_drafter.propose(context, SeedParams())
    assert info.value.field == "context_token_ids"


def test_numpy_contexts_work(core_drafter: Drafter) -> None:
    params = SeedParams(k=8, attentive_mix=False)
    for dtype in (np.int32, np.int64, np.uint32):
        assert core_drafter.propose(np.array([7, 1], dtype=dtype), params).token_ids == [2, 3, 9]


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
def test_mixing_weights_beyond_their_bounds_are_invalid(core_drafter, field, value):
    with pytest.raises(InvalidArgumentError) as info:
        core_drafter.propose([1, 2, 3], DraftParams(k=4, **{field: value}))
    assert info.value.field == field


@pytest.mark.parametrize("strategy", ["greedy", "sampling"])
@pytest.mark.parametrize("tree_nodes", [0, 6])
def test_mixing_weights_at_their_bounds_still_draft(core_drafter, strategy, tree_nodes):
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
                proposal = core_drafter.propose(context, params, seed=1)
                assert proposal.token_ids and all(0 <= t < CORE_VOCAB for t in proposal.token_ids)


def test_request_params_read_each_set_as_the_codec_does_and_keep_no_bad_one() -> None:
    """The servicer's cache of parameter sets (RequestParams) answers what draft_params_from_pb
    answers, seed apart, and a bad set raises on every request (it is never kept)."""
    from draft_service.servicer import RequestParams
    from speculant.v1 import draft_pb2
    from speculant.wire import draft_params_from_pb, propose_request_to_pb

    params = RequestParams(DraftParams(), size=2)
    for seed, k in [(None, 8), (3, 8), (None, 4), (5, 2), (None, 8)]:
        request = propose_request_to_pb([1, 2], DraftParams(k=k), seed)
        assert params.read(request) == draft_params_from_pb(request, DraftParams())
    assert params.read(draft_pb2.ProposeRequest())[0] == DraftParams()
    for _ in range(2):
        with pytest.raises(InvalidArgumentError):
            params.read(draft_pb2.ProposeRequest(k=0))
        with pytest.raises(InvalidArgumentError):
            params.read(draft_pb2.ProposeRequest(order_bias=float("nan")))
