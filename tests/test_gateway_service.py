"""The gateway over real services on localhost: streaming, determinism, errors, degraded drafts."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import grpc
import pytest

from gateway.api.server import start_gateway
from gateway.backends import GrpcDraftClient, GrpcVerifierClient
from gateway.engine import GenerationEngine
from speculant.config import GenerationConfig
from speculant.errors import FailedPreconditionError
from speculant.health import health_status
from speculant.v1 import (
    common_pb2,
    draft_pb2,
    draft_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    verifier_pb2,
)
from tests.assets import STORIES_MODEL
from tests.fixtures.e2e import verifier_config

PROMPT = "Once upon a time, there was a little dog named"


def generate_request(**kwargs) -> gateway_pb2.GenerateRequest:
    kwargs.setdefault("prompt", PROMPT)
    kwargs.setdefault("max_tokens", 48)
    return gateway_pb2.GenerateRequest(**kwargs)


def test_health_and_reflection_on_every_service(services):
    for address in (services.draft_address, services.verifier_address, services.gateway_address):
        assert health_status(address) == "SERVING"


def test_stream_text_equals_unary_text(services):
    request = generate_request(temperature=0.8, seed=11, max_tokens=80)
    unary = services.gateway.Generate(request, timeout=60)
    messages = list(services.gateway.GenerateStream(request, timeout=60))
    final = messages[-1]
    assert final.finish_reason == unary.finish_reason != gateway_pb2.FINISH_REASON_UNSPECIFIED
    # (the rounds may differ: cost-aware sizing verifies what pays as the timings go)
    assert final.stats.generated_tokens == unary.stats.generated_tokens > 0
    assert "".join(m.text_delta for m in messages) == unary.text
    assert [t for m in messages for t in m.token_ids] == list(unary.token_ids)
    assert len(messages) > 3  # tokens were streamed as they were accepted


def test_seeded_requests_are_deterministic_embedded_and_over_grpc(services, embedded_decoder):
    request = generate_request(
        temperature=0.9,
        seed=1234,
        draft=common_pb2.DraftOptions(k=6, strategy=common_pb2.DRAFT_STRATEGY_SAMPLING),
    )
    first = services.gateway.Generate(request, timeout=60)
    second = services.gateway.Generate(request, timeout=60)
    assert list(first.token_ids) == list(second.token_ids)
    from speculant.config import DraftConfig

    generation = GenerationConfig(max_tokens=48, temperature=0.9, seed=1234)
    draft = DraftConfig(k=6, strategy="sampling")
    local_a = embedded_decoder.generate(PROMPT, generation_config=generation, draft_config=draft)
    local_b = embedded_decoder.generate(PROMPT, generation_config=generation, draft_config=draft)
    assert local_a.token_ids == local_b.token_ids
    # The same rounds run in one process or across three: the same tokens.
    assert local_a.token_ids == list(first.token_ids)
    other_seed = services.gateway.Generate(
        generate_request(temperature=0.9, seed=4321, draft=request.draft), timeout=60
    )
    assert list(other_seed.token_ids) != list(first.token_ids)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"prompt": ""}, "prompt"),
        ({"draft": common_pb2.DraftOptions(k=0)}, "draft.k"),
        ({"draft": common_pb2.DraftOptions(k=65)}, "draft.k"),
        ({"draft": common_pb2.DraftOptions(mix_temperature=0.0)}, "draft.mix_temperature"),
        ({"draft": common_pb2.DraftOptions(entropy_penalty=-0.5)}, "draft.entropy_penalty"),
        ({"messages": [gateway_pb2.ChatMessage(role="user", content="hi")]}, "messages"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_parameters_are_invalid_argument_naming_the_field(services, kwargs, field):
    if "prompt" not in kwargs and "messages" in kwargs:
        kwargs["prompt"] = ""
    with pytest.raises(grpc.RpcError) as info:
        services.gateway.Generate(generate_request(**kwargs), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()


def test_unknown_session_is_not_found(services):
    with pytest.raises(grpc.RpcError) as info:
        services.verifier.Verify(verifier_pb2.VerifyRequest(session_id="nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_sessions_are_released_after_each_request(services):
    services.gateway.Generate(generate_request(temperature=0.0), timeout=60)
    # The gateway ends the session stream as the request ends; the verifier frees the session
    # when the end of the stream reaches it, a moment later.
    deadline = time.monotonic() + 5.0
    while True:
        stats = services.verifier.GetStats(verifier_pb2.GetStatsRequest(), timeout=10)
        if stats.live_sessions == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert stats.live_sessions == 0
    assert stats.sessions_released >= 1


def test_draft_service_down_gives_identical_greedy_output(services, tinystories_graph):
    from draft_service.server import start_server as start_draft

    request = generate_request(temperature=0.0, max_tokens=64)
    reference = services.gateway.Generate(request, timeout=60)
    assert reference.stats.draft_failures == 0
    # A second gateway whose only draft service is stopped.
    draft = start_draft(tinystories_graph, port=0)
    gateway, _ = start_gateway([draft.address], services.verifier_address, port=0)
    draft.stop(0)
    try:
        with grpc.insecure_channel(gateway.address) as channel:
            degraded = gateway_pb2_grpc.GatewayServiceStub(channel).Generate(request, timeout=60)
    finally:
        gateway.stop(0)
    assert list(degraded.token_ids) == list(reference.token_ids)
    assert degraded.stats.draft_failures > 0
    assert degraded.stats.draft_tokens == 0


@pytest.fixture(scope="module")
def other_graph(tmp_path_factory, other_tokenizer):
    """A graph built with another tokenizer than the verifier's."""
    from builder import GraphBuilder

    corpus = tmp_path_factory.mktemp("other") / "corpus.txt"
    corpus.write_text("Once upon a time there was a little dog. " * 50, encoding="utf-8")
    out = corpus.parent / "graph"
    builder = GraphBuilder(tokenizer_name=str(other_tokenizer), max_order=3)
    builder.build_from_files([str(corpus)])
    builder.save(out)
    return out


def test_tokenizer_mismatch_is_failed_precondition(services, other_graph):
    from draft_service.server import start_server as start_draft

    draft = start_draft(other_graph, port=0)
    try:
        # Started without the start-up check, the gateway refuses every request.
        engine = GenerationEngine(
            GrpcDraftClient([draft.address]), GrpcVerifierClient(services.verifier_address)
        )
        with pytest.raises(FailedPreconditionError, match="other-tokenizer"):
            engine.coordinator()
        gateway, _ = start_gateway(
            [draft.address], services.verifier_address, port=0, check_backends=False
        )
        try:
            with grpc.insecure_channel(gateway.address) as channel:
                stub = gateway_pb2_grpc.GatewayServiceStub(channel)
                with pytest.raises(grpc.RpcError) as info:
                    stub.Generate(generate_request(), timeout=30)
        finally:
            gateway.stop(0)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        details = info.value.details()
        assert "other-tokenizer" in details and "stories260K" in details
        # The command refuses to start at all.
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "launcher.cli",
                "serve-gateway",
                "--port",
                "0",
                "--draft",
                draft.address,
                "--verifier",
                services.verifier_address,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert completed.returncode == 1
        assert "tokenizer mismatch" in completed.stderr and "Traceback" not in completed.stderr
    finally:
        draft.stop(0)


def test_tokenizer_mismatch_embedded(other_graph):
    from gateway import SpeculativeDecoder

    with pytest.raises(FailedPreconditionError, match="stories260K"):
        SpeculativeDecoder(graph_path=other_graph, verifier_config=verifier_config())


def test_generate_cli_embedded_json(tinystories_graph):
    import json

    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "generate",
            "--prompt",
            PROMPT,
            "--graph",
            str(tinystories_graph),
            "--model",
            str(STORIES_MODEL),
            "--max-tokens",
            "20",
            "--temperature",
            "0",
            "--k",
            "4",
            # every round drafts (cost-aware sizes may skip drafts on a loaded machine)
            "--draft-size",
            "fixed",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    output = json.loads(completed.stdout)
    assert set(output) >= {"text", "token_ids", "finish_reason", "stats"}
    assert len(output["token_ids"]) == 20 and output["finish_reason"] == "max_tokens"
    assert output["stats"]["rounds"] < 20


def test_generate_cli_via_gateway(services):
    import json

    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "generate",
            "--prompt",
            PROMPT,
            "--gateway",
            services.gateway_address,
            "--max-tokens",
            "12",
            "--temperature",
            "0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    output = json.loads(completed.stdout)
    assert len(output["token_ids"]) == 12 and output["finish_reason"] == "max_tokens"
    direct = services.gateway.Generate(generate_request(max_tokens=12, temperature=0.0))
    assert output["token_ids"] == list(direct.token_ids)


def generate_when_back(stub, request, within_s: float = 10.0):
    """Generate, retrying UNAVAILABLE while the gateway's channel reconnects."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return stub.Generate(request, timeout=30)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_gateway_rechecks_backends_after_the_verifier_restarts(services, tinystories_graph, caplog):
    from draft_service.server import start_server as start_draft
    from verifier_service.server import start_server as start_verifier

    def checks() -> int:
        """The backend checks so far (tokenizers compared, "backends ready" logged)."""
        return sum("backends ready" in r.getMessage() for r in caplog.records)

    caplog.set_level(logging.INFO, logger="gateway.engine")
    draft = start_draft(tinystories_graph, port=0)
    verifier_server, verifier = start_verifier(verifier_config(), port=0)
    address = verifier_server.address
    gateway, _ = start_gateway([draft.address], address, port=0)
    try:
        with grpc.insecure_channel(gateway.address) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            request = generate_request(max_tokens=8, temperature=0.0)
            before = stub.Generate(request, timeout=30)
            checked = checks()
            assert checked >= 1
            verifier_server.stop(0)
            with pytest.raises(grpc.RpcError) as info:
                stub.Generate(request, timeout=30)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            port = int(address.rsplit(":", 1)[1])
            verifier_server, _ = start_verifier(verifier_config(), port=port, verifier=verifier)
            after = generate_when_back(stub, request)
        assert list(after.token_ids) == list(before.token_ids)
        assert checks() > checked  # the tokenizer check ran again
    finally:
        gateway.stop(0)
        verifier_server.stop(0)
        draft.stop(0)


class HangingDraftService(draft_pb2_grpc.DraftServiceServicer):
    """A draft service that never answers in time (a stuck replica)."""

    def ProposeStream(self, requests, context):
        for _ in requests:
            time.sleep(2.0)
            yield draft_pb2.ProposeResponse()

    def GetGraphInfo(self, request, context):
        return self.info


def test_draft_timeout_never_fails_the_request(services):
    from concurrent import futures

    with grpc.insecure_channel(services.draft_address) as channel:
        info = draft_pb2_grpc.DraftServiceStub(channel).GetGraphInfo(
            draft_pb2.GetGraphInfoRequest(), timeout=10
        )
    hanging = HangingDraftService()
    hanging.info = info
    server = grpc.server(futures.ThreadPoolExecutor(4))
    draft_pb2_grpc.add_DraftServiceServicer_to_server(hanging, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    gateway, _ = start_gateway(
        [f"127.0.0.1:{port}"], services.verifier_address, port=0, draft_timeout_s=0.05
    )
    try:
        request = generate_request(temperature=0.0, max_tokens=12)
        reference = services.gateway.Generate(request, timeout=60)
        with grpc.insecure_channel(gateway.address) as channel:
            started = time.monotonic()
            slow = gateway_pb2_grpc.GatewayServiceStub(channel).Generate(request, timeout=60)
            elapsed = time.monotonic() - started
    finally:
        gateway.stop(0)
        server.stop(0)
    assert list(slow.token_ids) == list(reference.token_ids)
    assert slow.stats.draft_failures > 0
    assert elapsed < 10  # each stuck draft cost about its 50 ms timeout, not 2 s
