"""The checked-in stubs in speculant/v1/ are what scripts/generate_protos.py makes of protos/."""

from __future__ import annotations

import subprocess
import sys

from tests.assets import ROOT


def test_generated_stubs_are_current(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "generate_protos.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    generated = sorted(p.name for p in (tmp_path / "speculant" / "v1").iterdir())
    checked_in = sorted(
        p.name
        for p in (ROOT / "speculant" / "v1").iterdir()
        if p.name != "__init__.py" and p.suffix in (".py", ".pyi")
    )
    assert generated == checked_in
    stale = [
        name
        for name in generated
        if (tmp_path / "speculant" / "v1" / name).read_bytes()
        != (ROOT / "speculant" / "v1" / name).read_bytes()
    ]
    assert not stale, f"stale stubs {stale}: run `python scripts/generate_protos.py`"


def test_public_names_exist():
    """The names users and tests rely on (DESIGN.md) are in the generated descriptors."""
    from speculant.v1 import common_pb2, draft_pb2, gateway_pb2, verifier_pb2

    assert common_pb2.DESCRIPTOR.package == "speculant.v1"
    services = {
        **gateway_pb2.DESCRIPTOR.services_by_name,
        **draft_pb2.DESCRIPTOR.services_by_name,
        **verifier_pb2.DESCRIPTOR.services_by_name,
    }
    assert set(services["GatewayService"].methods_by_name) == {"Generate", "GenerateStream"}
    assert set(services["DraftService"].methods_by_name) == {
        "Propose",
        "ProposeStream",
        "GetGraphInfo",
        "Learn",
    }
    assert set(services["VerifierService"].methods_by_name) == {
        "Prefill",
        "Verify",
        "Release",
        "Session",
        "GetModelInfo",
        "GetStats",
    }
    fields = lambda message: set(message.DESCRIPTOR.fields_by_name)  # noqa: E731
    assert {"prompt", "max_tokens", "temperature", "seed", "draft"} <= fields(
        gateway_pb2.GenerateRequest
    )
    assert {
        "k",
        "strategy",
        "attentive_mix",
        "order_bias",
        "mix_temperature",
        "reliability_weight",
        "entropy_penalty",
    } <= fields(common_pb2.DraftOptions)
    assert {"text", "token_ids", "finish_reason", "stats"} <= fields(gateway_pb2.GenerateResponse)
    assert {
        "rounds",
        "draft_tokens",
        "accepted_tokens",
        "acceptance_rate",
        "accepted_by_position",
        "tokens_per_second",
    } <= fields(gateway_pb2.GenerationStats)
    assert {"context_token_ids", "k", "strategy", "attentive_mix", "seed"} <= fields(
        draft_pb2.ProposeRequest
    )
    assert {"draft_token_ids", "distributions", "matched_orders"} <= fields(
        draft_pb2.ProposeResponse
    )
    assert "live_sessions" in fields(verifier_pb2.GetStatsResponse)
    # Fields whose default is not zero are `optional` (explicit presence), so 0 means 0.
    for name in ("max_tokens", "temperature", "seed"):
        assert gateway_pb2.GenerateRequest.DESCRIPTOR.fields_by_name[name].has_presence
    for enum in (common_pb2.DraftStrategy, gateway_pb2.FinishReason):
        assert enum.Name(0).endswith("_UNSPECIFIED")
