"""Online learning in the draft tier, over real services on localhost ports.

- the Learn RPC refuses bad input with INVALID_ARGUMENT naming the field, and a service started
  with learning off answers learning = false (and shows no live layer);
- a gateway reports each finished generation to every draft replica it knows (both learn it) and
  has exactly one of them persist it; a replica started later replays the learn log;
- learning pays and changes nothing else: a prompt generated again drafts what was learned
  (more accepted tokens), with the same output; seeded sampled outputs with the default drafts
  are identical with learning on and off, embedded and over the services;
- the CLI flags reach the service (``serve-draft --no-learn``) and bad values are refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from draft_service.learning import MAX_LEARN_TOKENS, LearningConfig
from draft_service.server import start_server as start_draft
from gateway import GenerationConfig, SpeculativeDecoder
from gateway.api.server import start_gateway
from speculant.v1 import common_pb2, draft_pb2, draft_pb2_grpc, gateway_pb2, gateway_pb2_grpc
from tests.assets import ROOT
from tests.fixtures.e2e import DRAFT_TIMEOUT_S, verifier_config

PROMPT = "Once upon a time, there was a little girl named"


def draft_stub(address: str) -> tuple[grpc.Channel, draft_pb2_grpc.DraftServiceStub]:
    channel = grpc.insecure_channel(address)
    return channel, draft_pb2_grpc.DraftServiceStub(channel)


def live_documents(stub, at_least: int = 0, timeout_s: float = 30.0) -> int:
    """The replica's learned documents, waiting up to timeout_s for at least `at_least` (the
    gateway reports in the background)."""
    deadline = time.monotonic() + timeout_s
    while True:
        live = stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=5).live
        if live.learned_documents >= at_least or time.monotonic() > deadline:
            return live.learned_documents
        time.sleep(0.05)


@pytest.fixture
def learn_log(tmp_path: Path) -> Path:
    return tmp_path / "tier.learned.jsonl"


@pytest.fixture
def replicas(tinystories_graph, learn_log) -> Iterator[list]:
    """Two learning draft replicas on one graph and one learn log."""
    config = LearningConfig(log_path=str(learn_log))
    servers = [start_draft(tinystories_graph, port=0, learning=config) for _ in range(2)]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop(0)


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"token_ids": [1]}, "token_ids"),
        ({"token_ids": [1, 512]}, "token_ids"),
        ({"token_ids": [1, -3]}, "token_ids"),
        ({"token_ids": [1] * (MAX_LEARN_TOKENS + 1)}, "token_ids"),
        ({"token_ids": [1, 2], "generation_id": "has space"}, "generation_id"),
        ({"token_ids": [1, 2], "generation_id": "x" * 129}, "generation_id"),
    ],
)
def test_bad_learn_requests_name_the_field(replicas, request_fields, field) -> None:
    channel, stub = draft_stub(replicas[0].address)
    with channel, pytest.raises(grpc.RpcError) as caught:
        stub.Learn(draft_pb2.LearnRequest(**request_fields), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details().startswith(field)


def test_a_service_that_does_not_learn_says_so(tinystories_graph) -> None:
    server = start_draft(tinystories_graph, port=0, learning=None)
    channel, stub = draft_stub(server.address)
    try:
        with channel:
            answer = stub.Learn(draft_pb2.LearnRequest(token_ids=[1, 2, 3], persist=True))
            assert not answer.learning and answer.learned_tokens == 0
            info = stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=5)
            assert not info.HasField("live")
    finally:
        server.stop(0)


def test_every_replica_learns_and_one_persists(services, replicas, learn_log, tinystories_graph):
    """Two generations through a gateway with two replicas: both replicas learn both, the log
    has each once; a third replica started afterwards replays them."""
    gateway, engine = start_gateway(
        [r.address for r in replicas],
        services.verifier_address,
        port=0,
        draft_timeout_s=DRAFT_TIMEOUT_S,
    )
    try:
        with grpc.insecure_channel(gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            for prompt in (PROMPT, "Tom had a red ball. One day"):
                stub.Generate(
                    gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=24, temperature=0),
                    timeout=60,
                )
        assert engine.learner.wait_idle(30)
        assert engine.learner.counts.sent == 2
    finally:
        gateway.stop(0)
    for replica in replicas:
        channel, stub = draft_stub(replica.address)
        with channel:
            assert live_documents(stub, 2) == 2
    lines = learn_log.read_text().splitlines()
    assert json.loads(lines[0])["format"] == "speculant-learn-log"
    assert len(lines) == 3  # the header and each generation once
    later = start_draft(tinystories_graph, port=0, learning=LearningConfig(log_path=str(learn_log)))
    try:
        channel, stub = draft_stub(later.address)
        with channel:
            assert stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest()).live.documents == 2
    finally:
        later.stop(0)


def test_a_prompt_generated_again_drafts_what_was_learned(services, replicas):
    gateway, engine = start_gateway(
        [replicas[0].address], services.verifier_address, port=0, draft_timeout_s=DRAFT_TIMEOUT_S
    )
    # fixed sizes: every draft is verified (cost-aware sizes follow the machine's timings)
    fixed = common_pb2.DraftOptions(draft_size="fixed")
    request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=96, temperature=0, draft=fixed)
    try:
        with grpc.insecure_channel(gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            first = stub.Generate(request, timeout=60)
            assert engine.learner.wait_idle(30)
            second = stub.Generate(request, timeout=60)
    finally:
        gateway.stop(0)
    assert list(second.token_ids) == list(first.token_ids)
    # the whole output was learned: nearly every draft token is now accepted
    assert second.stats.rounds < first.stats.rounds
    assert second.stats.accepted_tokens > first.stats.accepted_tokens


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_outputs_are_the_same_with_learning_on_and_off(tinystories_graph, temperature) -> None:
    """Default drafts (greedy trees) spend one draw of the seed per emitted token, so what the
    decoder learned changes its speed, never its tokens."""
    learning = SpeculativeDecoder(tinystories_graph, verifier_config())
    plain = SpeculativeDecoder(tinystories_graph, verifier_config(), learn=False)
    prompts = [PROMPT, "Tom had a red ball. One day", "The sun was hot. Lily and her mom"]
    for warm_up in prompts:  # learning has seen these generations before the measured ones
        learning.generate(warm_up, generation_config=GenerationConfig(max_tokens=64, seed=1))
    for seed, prompt in enumerate(prompts * 2):
        config = GenerationConfig(max_tokens=64, temperature=temperature, seed=seed)
        with_learning = learning.generate(prompt, generation_config=config)
        without = plain.generate(prompt, generation_config=config)
        assert with_learning.token_ids == without.token_ids, prompt
    assert learning.live.stats().learned_documents == 3 + 6


def test_serve_draft_learning_flags(tinystories_graph) -> None:
    command = [sys.executable, "-m", "launcher.cli", "serve-draft"]
    command += ["--graph", str(tinystories_graph), "--port", "0", "--learn-weight", "0"]
    bad = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert bad.returncode != 0 and "--learn-weight" in bad.stderr
    assert "Traceback" not in bad.stderr
