"""speculant.v1.VerifierService over real gRPC on localhost, and the serve-verifier command."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from speculant.config import VerifierConfig
from speculant.ports import free_port
from speculant.tokenizer import load_tokenizer, tokenizer_fingerprint
from speculant.v1 import common_pb2, verifier_pb2, verifier_pb2_grpc
from tests.assets import STORIES_MODEL
from tests.fixtures.models import hf_greedy
from verifier_service import server as server_module
from verifier_service.model import LoadedModel
from verifier_service.server import SERVICE_NAME, start_server
from verifier_service.verifier import LocalVerifier

PROMPT = [1, 403, 407, 261, 378]  # "Once upon a time"


@pytest.fixture(scope="module")
def served(loaded: LoadedModel):
    """(server, verifier, stub) with a cap of 3 sessions of each kind."""
    config = VerifierConfig(model_name=str(STORIES_MODEL), max_sessions=3, max_unary_sessions=3)
    verifier = LocalVerifier(config, model=loaded, model_thread=True)
    server, _ = start_server(config, "127.0.0.1", 0, verifier=verifier)
    channel = grpc.insecure_channel(server.address)
    yield server, verifier, verifier_pb2_grpc.VerifierServiceStub(channel)
    channel.close()
    server.stop(grace=0)
    verifier.close()


@pytest.fixture
def stub(served):
    _, verifier, stub = served
    yield stub
    for sid in list(verifier.sessions._sessions):
        verifier.release(sid)


def prefill(stub, sid: str = "", prompt=PROMPT, **kwargs) -> verifier_pb2.PrefillResponse:
    return stub.Prefill(
        verifier_pb2.PrefillRequest(session_id=sid, prompt_token_ids=prompt, **kwargs)
    )


def verify(stub, sid: str, drafts, dists=()) -> verifier_pb2.VerifyResponse:
    return stub.Verify(
        verifier_pb2.VerifyRequest(
            session_id=sid, draft_token_ids=drafts, draft_distributions=list(dists)
        )
    )


def assert_status(code: grpc.StatusCode, field: str | None, call) -> None:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    if field is not None:
        assert err.value.details().startswith(f"{field}:"), err.value.details()


def test_greedy_over_grpc_matches_hf(stub, loaded) -> None:
    ref = hf_greedy(loaded, PROMPT, 30)
    first = prefill(stub, "g", temperature=0.0)
    assert first.session_id == "g" and first.token_id == ref[0]
    out = [first.token_id]
    good = verify(stub, "g", ref[1:7])
    assert good.accepted_count == 6
    out += good.token_ids
    bad = verify(stub, "g", [(ref[len(out)] + 1) % 512, 3])
    assert bad.accepted_count == 0
    out += bad.token_ids
    while len(out) < 30:
        out += verify(stub, "g", [*ref[len(out) : len(out) + 3], 9]).token_ids
    assert out[:30] == ref


def test_empty_session_id_gets_one(stub) -> None:
    response = prefill(stub, "", temperature=0.0)
    assert len(response.session_id) == 32
    assert verify(stub, response.session_id, []).token_ids


def test_sampled_q_and_seeded_determinism(stub) -> None:
    q = common_pb2.SparseDistribution(token_ids=[383, 300], probs=[0.7, 0.3])

    def run(seed: int, sid: str) -> list[int]:
        out = [prefill(stub, sid, seed=seed, temperature=1.0).token_id]
        for _ in range(6):
            response = verify(stub, sid, [383, 286], [q, _pm(286)])
            assert len(response.token_ids) == response.accepted_count + 1
            out += response.token_ids
        stub.Release(verifier_pb2.ReleaseRequest(session_id=sid))
        return out

    assert run(11, "a") == run(11, "b")
    assert run(11, "a") != run(12, "b")


def _pm(token: int) -> common_pb2.SparseDistribution:
    return common_pb2.SparseDistribution(token_ids=[token], probs=[1.0])


def test_invalid_arguments_name_the_field(stub) -> None:
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    assert_status(invalid, "prompt_token_ids", lambda: prefill(stub, "x", prompt=[]))
    assert_status(invalid, "prompt_token_ids[1]", lambda: prefill(stub, "x", prompt=[1, -5]))
    assert_status(invalid, "prompt_token_ids[0]", lambda: prefill(stub, "x", prompt=[4096]))
    assert_status(invalid, "prompt_token_ids", lambda: prefill(stub, "x", prompt=[1] * 600))
    assert_status(invalid, "temperature", lambda: prefill(stub, "x", temperature=-0.5))
    prefill(stub, "x", seed=3)
    assert_status(invalid, "draft_token_ids[0]", lambda: verify(stub, "x", [-1]))
    assert_status(invalid, "draft_token_ids[1]", lambda: verify(stub, "x", [4, 512]))
    assert_status(invalid, "draft_distributions", lambda: verify(stub, "x", [4, 5], [_pm(4)]))
    bad_sum = common_pb2.SparseDistribution(token_ids=[4, 5], probs=[0.2, 0.2])
    assert_status(
        invalid, "draft_distributions[0].probs", lambda: verify(stub, "x", [4], [bad_sum])
    )
    assert_status(grpc.StatusCode.NOT_FOUND, None, lambda: verify(stub, "missing", [4]))
    assert verify(stub, "x", [4]).token_ids  # the session survived the bad calls


def test_session_cap_stats_and_release(stub) -> None:
    for sid in ("c1", "c2", "c3"):
        prefill(stub, sid)
    assert_status(grpc.StatusCode.RESOURCE_EXHAUSTED, None, lambda: prefill(stub, "c4"))
    stats = stub.GetStats(verifier_pb2.GetStatsRequest())
    assert stats.live_sessions == 3
    assert stub.Release(verifier_pb2.ReleaseRequest(session_id="c2")).released is True
    assert stub.Release(verifier_pb2.ReleaseRequest(session_id="c2")).released is False
    assert stub.GetStats(verifier_pb2.GetStatsRequest()).live_sessions == 2
    prefill(stub, "c4")
    before = stub.GetStats(verifier_pb2.GetStatsRequest())
    verify(stub, "c4", [5, 6, 7])
    after = stub.GetStats(verifier_pb2.GetStatsRequest())
    assert after.forward_passes - before.forward_passes == 1
    assert after.draft_tokens - before.draft_tokens == 3
    assert after.sessions_released >= 1


def test_model_info(stub) -> None:
    info = stub.GetModelInfo(verifier_pb2.GetModelInfoRequest())
    assert info.model_name == str(STORIES_MODEL)
    assert info.tokenizer_fingerprint == tokenizer_fingerprint(load_tokenizer(str(STORIES_MODEL)))
    assert (info.vocab_size, list(info.eos_token_ids), info.max_context_length) == (
        512,
        [2],
        512,
    )
    assert (info.device, info.dtype) == ("cpu", "float32")


def test_health_and_reflection(served) -> None:
    server, _, _ = served
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", SERVICE_NAME):
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            assert status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        response = next(reflection.ServerReflectionInfo(iter([request])))
        names = {s.name for s in response.list_services_response.service}
        assert SERVICE_NAME == "speculant.v1.VerifierService"
        assert SERVICE_NAME in names


def test_not_serving_until_model_loaded(loaded, monkeypatch) -> None:
    release = threading.Event()
    config = VerifierConfig(model_name=str(STORIES_MODEL))

    def slow_verifier(config: VerifierConfig, model_thread: bool = False) -> LocalVerifier:
        release.wait(10)
        return LocalVerifier(config, model=loaded, model_thread=model_thread)

    monkeypatch.setattr(server_module, "LocalVerifier", slow_verifier)
    port = free_port()
    result: dict[str, object] = {}
    thread = threading.Thread(
        target=lambda: result.update(
            zip(("server", "verifier"), start_server(config, port=port), strict=True)
        )
    )
    thread.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            status = health.Check(health_pb2.HealthCheckRequest(), wait_for_ready=True, timeout=10)
            assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            assert_status(
                grpc.StatusCode.UNAVAILABLE,
                None,
                lambda: stub.GetModelInfo(verifier_pb2.GetModelInfoRequest()),
            )
            release.set()
            thread.join(10)
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            assert stub.GetModelInfo(verifier_pb2.GetModelInfoRequest()).vocab_size == 512
    finally:
        release.set()
        thread.join(10)
        if "server" in result:
            result["server"].stop(grace=0)  # type: ignore[attr-defined]
            result["verifier"].close()  # type: ignore[attr-defined]


def _run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_cli_missing_model_is_one_line_error(tmp_path) -> None:
    result = _run_cli(
        "serve-verifier",
        "--model",
        "speculant-test/no-such-model",
        "--port",
        "0",
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)},
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    prefix = "speculant serve-verifier: error:"
    errors = [line for line in result.stderr.splitlines() if line.startswith(prefix)]
    assert len(errors) == 1
    assert "speculant-test/no-such-model" in errors[0]
    assert "offline" in errors[0]


def test_cli_serves_and_stops_on_sigterm() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "launcher.cli", "serve-verifier"),
            *("--model", str(STORIES_MODEL), "--port", str(port)),
            *("--max-unary-sessions", "2", "--session-ttl", "5"),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    status = health.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.RpcError:
                    time.sleep(0.2)
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            assert prefill(stub, "a", temperature=0).token_id == 432
            prefill(stub, "b")
            assert_status(grpc.StatusCode.RESOURCE_EXHAUSTED, None, lambda: prefill(stub, "c"))
        proc.terminate()
        assert proc.wait(15) == 0
        assert proc.stderr is not None
        # the torch threads chosen for this host are in the start-up log
        assert "INFO verifier_service.cli: torch threads: " in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_get_model_info_reports_the_cost_profile(served):
    _, verifier, stub = served
    info = stub.GetModelInfo(verifier_pb2.GetModelInfoRequest(), timeout=10)
    assert len(info.verify_cost_seconds) == 65  # a forward over 1..65 new tokens
    assert all(s > 0 for s in info.verify_cost_seconds)
    assert list(info.verify_cost_seconds) == pytest.approx(
        verifier.cost_profile.copy().seconds, rel=0.5
    )
