"""`speculant bench generate`: the figures are all there and speculative outputs equal HF greedy.

Tiny runs (2 prompts x 16 tokens); no timing assertions: the machine is shared.
"""

from __future__ import annotations

import json

import pytest

from gateway.bench import (
    BenchSettings,
    Variant,
    format_footer,
    format_table,
    rotated,
    run_benchmark,
    settings_from_args,
    variants_for,
)
from speculant.cli import build_parser
from tests.conftest import DEV_PROMPTS, STORIES_MODEL

SPECULATIVE_FIGURES = (
    "tokens_per_second_median",
    "tokens_per_second_total",
    "speedup_median",
    "speedup_total",
    "tau_median",
    "tau_total",
    "acceptance_rate_median",
    "acceptance_rate_total",
    "acceptance_by_position",
    "draft_seconds_median",
    "verify_seconds_median",
    "other_seconds_median",
    "client_overhead_seconds_median",
    "exact_mismatches",
)


def _settings(graph: object, systems: tuple[str, ...]) -> BenchSettings:
    return BenchSettings(
        graph=str(graph),
        model=str(STORIES_MODEL),
        prompts=str(DEV_PROMPTS),
        max_tokens=16,
        temperature=0.0,
        ks=(4,),
        mixes=(True, False),
        systems=systems,
        limit=2,
        warmup=1,
    )


def _check_speculative(figures: dict) -> None:
    for key in SPECULATIVE_FIGURES:
        assert key in figures, key
    assert figures["exact_mismatches"] == 0
    assert figures["prompt_length_mismatches"] == 0
    assert figures["tau_total"] > 1.0  # parallel verification: fewer forwards than tokens
    assert len(figures["acceptance_by_position"]) == 4


def test_variants_and_rotation() -> None:
    settings = BenchSettings(graph="g", model="m", ks=(4, 8), mixes=(True, False))
    names = [v.name for v in variants_for(settings)]
    assert names[:2] == ["hf", "hf-lookup k=8"]
    assert "embedded k=4 mix=off" in names and "services k=8 mix=on" in names
    assert len(names) == 2 + 2 * 4
    items = [Variant("hf"), Variant("hf-lookup", 8), Variant("embedded", 4, True)]
    assert rotated(items, 1) == [items[1], items[2], items[0]]
    assert rotated(items, 3) == items


def test_cli_arguments() -> None:
    argv = "bench generate --graph g --model m --k 4,8 --mix off --systems hf,embedded"
    args = build_parser().parse_args([*argv.split(), "--limit", "3", "--torch-threads", "2"])
    settings = settings_from_args(args)
    assert settings.ks == (4, 8) and settings.mixes == (False,)
    assert settings.systems == ("hf", "embedded") and settings.limit == 3
    assert settings.torch_threads == 2 and settings.max_tokens == 128
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["bench", "generate", "--graph", "g", "--model", "m", "--systems", "vllm"]
        )


def test_bench_in_process(tinystories_graph, tmp_path) -> None:
    result = run_benchmark(_settings(tinystories_graph, ("hf", "hf-lookup", "embedded")))
    json.dumps(result)  # everything serialisable for --json
    summary = result["summary"]
    assert set(summary) == {
        "hf",
        "hf-lookup k=4",
        "embedded k=4 mix=on",
        "embedded k=4 mix=off",
    }
    assert summary["hf"]["tau_total"] == pytest.approx(1.0)
    assert summary["hf"]["speedup_total"] == pytest.approx(1.0)
    assert summary["hf-lookup k=4"]["exact_mismatches"] == 0
    for name in ("embedded k=4 mix=on", "embedded k=4 mix=off"):
        _check_speculative(summary[name])
        assert len(result["per_prompt"][name]) == 2
    assert result["machine"]["torch_threads"] == 1
    assert result["machine"]["load_average_start"] is not None
    assert result["memory"]["bench_process_peak_rss_bytes"] > 0
    assert result["settings"]["max_tokens"] == 16
    table = format_table(result)
    assert "embedded k=4 mix=off" in table and "speedup" in table
    assert "peak RSS" in format_footer(result)


@pytest.mark.slow
def test_bench_services(tinystories_graph) -> None:
    result = run_benchmark(_settings(tinystories_graph, ("hf", "services")))
    for name in ("services k=4 mix=on", "services k=4 mix=off"):
        _check_speculative(result["summary"][name])
    services = result["memory"]["services"]
    assert set(services) == {"draft", "verifier", "gateway"}
    for info in services.values():
        assert info["omp_num_threads"] == "1"
        assert info["peak_rss_bytes"] or info["rss_bytes"]
