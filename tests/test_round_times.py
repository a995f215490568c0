"""Where a round's time goes (gateway.generation.RoundTimes): every Verify round's parts are
reported, embedded and over the three services, on stories260K; and `bench generate` reports
their p50 / p99 and what the services add (its runs: tests/test_bench.py). No timing is asserted
beyond the parts' own consistency: the machine is shared."""

from __future__ import annotations

import pytest

from bench.round_breakdown import COLUMNS, breakdown, format_round_table, services_overhead
from bench.settings import Variant
from gateway.generation import FIELDS, PARTS
from speculant.config import GenerationConfig
from speculant.v1 import gateway_pb2

PROMPT = "Once upon a time, there was a little girl named Lily."
MAX_TOKENS = 32


def check_round_times(times: dict[str, list[float]], rounds: int) -> None:
    """One value a Verify round (the prefill is not one) in every field; no part negative, and
    the parts of a round add up to at most its wall time; the verifier reports its forward."""
    assert set(times) == set(FIELDS)
    assert all(len(values) == rounds - 1 for values in times.values())
    assert rounds > 2  # a few Verify rounds to look at
    for i, wall in enumerate(times["round"]):
        parts = [times[name][i] for name in PARTS]
        assert min(parts) >= 0.0
        assert sum(parts) <= wall + 1e-9
        assert times["forward"][i] > 0.0


def test_embedded_rounds_are_broken_down(embedded_decoder) -> None:
    config = GenerationConfig(max_tokens=MAX_TOKENS, temperature=0.0)
    result = embedded_decoder.generate(PROMPT, generation_config=config)
    check_round_times(result.stats.round_times.as_dict(), result.stats.rounds)
    assert "round_times" not in result.stats.as_dict()  # not in the HTTP answers
    assert result.stats.as_dict(round_times=True)["round_times"]["round"]


def test_services_rounds_are_broken_down(services) -> None:
    request = gateway_pb2.GenerateRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0.0)
    stats = services.gateway.Generate(request, timeout=60).stats
    times = {name: list(getattr(stats.round_times, name)) for name in FIELDS}
    check_round_times(times, stats.rounds)
    # the draft service reports its drafting: a round that drafted has its draft seconds
    assert any(seconds > 0.0 for seconds in times["draft"])


def test_breakdown_figures_and_the_services_overhead() -> None:
    def row(scale: float) -> dict:
        rounds = [1.0, 2.0, 3.0, 10.0]
        times = {name: [scale * r / len(PARTS) for r in rounds] for name in PARTS}
        return {"round_times": {"round": [scale * r for r in rounds], **times}}

    embedded, served = breakdown([row(1e-3)]), breakdown([row(1e-3), row(2e-3)])
    assert embedded is not None and served is not None
    assert set(embedded) == {"verify_rounds", *COLUMNS}
    assert embedded["verify_rounds"] == 4 and served["verify_rounds"] == 8
    assert embedded["round"]["p50_ms"] == pytest.approx(2.5)
    assert embedded["round"]["mean_ms"] == pytest.approx(4.0)
    assert embedded["round"]["p50_ms"] <= embedded["round"]["p99_ms"] <= 10.0
    assert breakdown([{"round_times": {}}]) is None
    variants = [Variant("embedded", 4, True), Variant("services", 4, True)]
    summary = {
        variants[0].name: {"round_breakdown": embedded},
        variants[1].name: {"round_breakdown": served},
    }
    (extra,) = services_overhead(variants, summary).values()
    assert extra["embedded"] == variants[0].name
    assert extra["round_p50_ms"] == pytest.approx(served["round"]["p50_ms"] - 2.5)
    assert sum(extra["mean_ms"][name] for name in PARTS) == pytest.approx(extra["mean_ms"]["round"])
    table = format_round_table({"summary": summary, "round_overhead": {variants[1].name: extra}})
    assert "verify hop" in table and f"against {variants[0].name}" in table
