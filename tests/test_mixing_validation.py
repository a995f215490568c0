"""Validation of the mixing options (mixing, escape_weight): errors name the
field in the core, the draft service and the gateway; request fields, gateway options and the
environment reach the params."""

from __future__ import annotations

import math
from pathlib import Path

import grpc
import pytest

from draft_service.server import start_server
from gateway.engine import RequestDefaults
from gateway.generation import GenerationRequest
from speculant.config import DraftConfig, DraftParams
from speculant.errors import InvalidArgumentError
from speculant.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from speculant.wire import draft_fields_from_pb, draft_params_from_pb
from tests.witten_bell_reference import ClassicParams


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"mixing": "kneser-ney"}, "mixing"),
        ({"mixing": ""}, "mixing"),
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
        context_token_ids=[1], mixing="witten-bell", escape_weight=8.0
    )
    params, _ = draft_params_from_pb(request, ClassicParams())
    assert (params.mixing, params.escape_weight) == ("witten-bell", 8)
    unset, _ = draft_params_from_pb(
        draft_pb2.ProposeRequest(context_token_ids=[1]), ClassicParams()
    )
    assert (unset.mixing, unset.escape_weight) == ("seed", ClassicParams().escape_weight)


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"mixing": "bogus"}, "mixing"),
        ({"escape_weight": math.nan}, "escape_weight"),
        ({"escape_weight": 0.0}, "escape_weight"),
    ],
)
def test_bad_propose_fields_are_invalid_argument(
    mixing_graph_dir: Path, request_fields: dict, field: str
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        draft_params_from_pb(
            draft_pb2.ProposeRequest(context_token_ids=[1], **request_fields), ClassicParams()
        )
    assert info.value.field == field
    server = start_server(mixing_graph_dir, port=0)
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
                ),
                timeout=5,
            )
            assert list(ok.draft_token_ids)[:1] == [8]
    finally:
        server.stop(0)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"mixing": "bogus"}, "draft.mixing"),
        ({"escape_weight": -1.0}, "draft.escape_weight"),
    ],
)
def test_gateway_draft_options_name_the_field(options: dict, field: str) -> None:
    params = RequestDefaults(DraftConfig()).draft_params(
        draft_fields_from_pb(common_pb2.DraftOptions(**options))
    )
    with pytest.raises(InvalidArgumentError) as info:
        GenerationRequest(prompt_ids=[1], draft=params).validate()
    assert info.value.field == field


def test_gateway_draft_options_pass_through() -> None:
    options = common_pb2.DraftOptions(mixing="witten-bell", escape_weight=8)
    params = RequestDefaults(DraftConfig()).draft_params(draft_fields_from_pb(options))
    assert (params.mixing, params.escape_weight) == ("witten-bell", 8)
    defaults = RequestDefaults(DraftConfig(mixing="backoff", escape_weight=2.0)).draft_params(
        draft_fields_from_pb(common_pb2.DraftOptions())
    )
    assert (defaults.mixing, defaults.escape_weight) == ("backoff", 2.0)


def test_config_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECULANT_DRAFT__MIXING", "witten-bell")
    monkeypatch.setenv("SPECULANT_DRAFT__ESCAPE_WEIGHT", "4")
    config = DraftConfig()
    assert (config.mixing, config.escape_weight) == ("witten-bell", 4.0)
    params = DraftParams.from_config(config)
    assert (params.mixing, params.escape_weight) == ("witten-bell", 4.0)
