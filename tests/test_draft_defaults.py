"""Server-wide drafting defaults as flags (serve-draft, serve-gateway, up): a request that
leaves a field unset gets the server's value; a bad value is one usage line."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from launcher.cli import build_parser
from speculant.config import DraftConfig
from speculant.draft_flags import draft_default_argv, draft_defaults_from_args, given_draft_defaults
from speculant.errors import InvalidArgumentError
from speculant.v1 import draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_flags_set_only_what_is_given():
    args = parse("serve-gateway", "--draft", "d:1", "--verifier", "v:2", "--k", "3")
    config = draft_defaults_from_args(parse("serve-draft", "--graph", "g"))
    assert config.k == DraftConfig().k and "k" not in config.model_fields_set  # the default
    config = draft_defaults_from_args(args)
    assert config.k == 3 and config.model_fields_set == {"k"}
    args = parse("up", "--graph", "g", "--model", "m", "--tree-nodes", "0", "--no-attentive-mix")
    assert draft_default_argv(args) == ["--tree-nodes", "0", "--no-attentive-mix"]
    with pytest.raises(InvalidArgumentError, match="--k"):
        draft_defaults_from_args(parse("serve-draft", "--graph", "g", "--k", "0"))


def test_generate_sends_a_remote_gateway_only_the_drafting_flags_given():
    """generate's drafting flags are the same table as the servers': not given, a field is not
    sent, so a remote gateway's own defaults (its flags) apply."""
    assert given_draft_defaults(parse("generate", "--gateway", "g:1", "--prompt", "x")) == {}
    args = parse("generate", "--prompt", "x", "--k", "4", "--no-attentive-mix")
    assert given_draft_defaults(args) == {"k": 4, "attentive_mix": False}
    assert draft_defaults_from_args(args).k == 4


def test_a_bad_default_is_one_usage_line(tinystories_graph):
    command = [sys.executable, "-m", "launcher.cli", "serve-draft"]
    command += ["--graph", str(tinystories_graph), "--port", "0", "--escape-weight", "-1"]
    completed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2 and "Traceback" not in completed.stderr
    assert "speculant serve-draft: error: bad drafting default: --escape-weight" in (
        completed.stderr
    )


def test_the_servers_defaults_fill_unset_request_fields(services, tinystories_graph):
    from draft_service.server import start_server as start_draft
    from gateway.api.server import start_gateway
    from speculant.config import DraftParams

    chains_of_3 = draft_defaults_from_args(
        parse(
            "serve-gateway", "--draft", "d:1", "--verifier", "v:2", "--k", "3", "--tree-nodes", "0"
        )
    )
    gateway, _ = start_gateway(
        [services.draft_address], services.verifier_address, port=0, draft_defaults=chains_of_3
    )
    draft = start_draft(tinystories_graph, port=0, defaults=DraftParams.from_config(chains_of_3))
    try:
        with grpc.insecure_channel(gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            request = gateway_pb2.GenerateRequest(prompt="Once upon a time", max_tokens=40)
            stats = stub.Generate(request, timeout=60).stats
        assert 0 < len(stats.drafted_by_position) <= 3 and stats.draft_tokens > 0
        with grpc.insecure_channel(draft.address) as channel:
            propose = draft_pb2_grpc.DraftServiceStub(channel).Propose
            proposal = propose(draft_pb2.ProposeRequest(context_token_ids=[1, 403]), timeout=10)
        assert 0 < len(proposal.draft_token_ids) <= 3 and not proposal.draft_parents
    finally:
        gateway.stop(0)
        draft.stop(0)
