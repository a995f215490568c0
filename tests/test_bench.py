"""`speculant bench generate`: the figures are all there and speculative outputs equal HF greedy.

Tiny runs (2 prompts x 16 tokens); no timing assertions: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import pytest

from bench.cost import (
    CostSettings,
    cost_settings_from_args,
    format_cost_table,
    load_cost_model,
    parse_counts,
    run_cost,
)
from bench.cost_projection import cost_at, format_projection, project_all
from bench.generate import rotated, run_benchmark
from bench.generate_cli import settings_from_args
from bench.plot import PlotUnavailable, require_matplotlib, write_plot
from bench.report import format_footer, format_table
from bench.round_breakdown import COLUMNS, format_round_table
from bench.settings import BenchSettings, Variant, variants_for
from launcher.cli import build_parser
from tests.assets import DEMO_PROMPTS, RANDOM_LLAMA, STORIES_MODEL, needs

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
    """Fixed draft sizes: every draft is verified whole, so tau and acceptance by position follow
    the graph alone (with the default cost-aware sizes they follow the machine's timings)."""
    return BenchSettings(
        graph=str(graph),
        model=str(STORIES_MODEL),
        prompts=str(DEMO_PROMPTS),
        max_tokens=16,
        temperature=0.0,
        ks=(4,),
        mixes=(True, False),
        systems=systems,
        limit=2,
        warmup=1,
        draft_sizes=("fixed",),
    )


def _check_speculative(figures: dict) -> None:
    for key in SPECULATIVE_FIGURES:
        assert key in figures, key
    assert figures["exact_mismatches"] == 0
    assert figures["prompt_length_mismatches"] == 0
    assert figures["tau_total"] > 1.0  # parallel verification: fewer forwards than tokens
    assert len(figures["acceptance_by_position"]) == 4
    rounds = figures["round_breakdown"]  # every Verify round's parts (not the prefill)
    assert rounds["verify_rounds"] == figures["rounds_total"] - figures["prompts"]
    for part in COLUMNS:
        assert 0.0 <= rounds[part]["p50_ms"] <= rounds[part]["p99_ms"], part


def test_variants_and_rotation() -> None:
    settings = BenchSettings(graph="g", model="m", ks=(4, 8), mixes=(True, False))
    names = [v.name for v in variants_for(settings)]
    assert names[:3] == ["hf", "hf-lookup k=8", "plain"]
    assert "embedded k=4 mix=off" in names and "services k=8 mix=on" in names
    assert len(names) == 3 + 2 * 4
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
    assert settings.services_as == "bench" and settings.dtype == "auto"
    args = build_parser().parse_args([*argv.split(), "--services-as", "up", "--dtype", "float32"])
    assert settings_from_args(args).services_as == "up"
    assert settings_from_args(args).dtype == "float32"
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["bench", "generate", "--graph", "g", "--model", "m", "--systems", "vllm"]
        )


@pytest.mark.parametrize("missing", ["graph", "model"])
def test_a_graph_or_model_that_does_not_load_is_one_error_line(
    missing, tinystories_graph, tmp_path, capsys
):
    from launcher.cli import main

    graph, model = str(tinystories_graph), str(STORIES_MODEL)
    if missing == "graph":
        graph = str(tmp_path / "no-graph")
    else:
        model = str(tmp_path / "no-model")
    argv = ["bench", "generate", "--graph", graph, "--model", model, "--limit", "1"]
    assert main([*argv, "--prompts", str(DEMO_PROMPTS), "--systems", "plain,embedded"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "speculant bench generate: error:" in err
    assert ("graph not found" if missing == "graph" else "no-model") in err


@pytest.mark.parametrize("folder", ["missing", "not-a-model"])
def test_bench_cost_of_a_model_that_does_not_load_is_one_error_line(folder, tmp_path, capsys):
    from launcher.cli import main

    model = tmp_path / folder
    if folder == "not-a-model":
        model.mkdir()
        (model / "notes.txt").write_text("no config, no tokenizer")
    assert main(["bench", "cost", "--models", str(model), "--new-tokens", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "speculant bench cost: error:" in err and folder in err


def test_bench_in_process(tinystories_graph, tmp_path) -> None:
    systems = ("hf", "hf-lookup", "plain", "embedded")
    result = run_benchmark(_settings(tinystories_graph, systems))
    json.dumps(result)  # everything serialisable for --json
    summary = result["summary"]
    assert set(summary) == {
        "hf",
        "hf-lookup k=4",
        "plain",
        "embedded k=4 mix=on fixed",
        "embedded k=4 mix=off fixed",
    }
    assert summary["hf"]["tau_total"] == pytest.approx(1.0)
    assert summary["hf"]["speedup_total"] == pytest.approx(1.0)
    assert summary["hf-lookup k=4"]["exact_mismatches"] == 0
    # plain: one token per forward through the verifier's own path, the same tokens as hf
    assert summary["plain"]["exact_mismatches"] == 0
    assert summary["plain"]["tau_total"] == pytest.approx(1.0)
    for name in ("embedded k=4 mix=on fixed", "embedded k=4 mix=off fixed"):
        _check_speculative(summary[name])
        assert len(result["per_prompt"][name]) == 2
    assert result["machine"]["torch_threads"] == 1
    assert result["machine"]["load_average_start"] is not None
    assert result["memory"]["bench_process_peak_rss_bytes"] > 0
    assert result["settings"]["max_tokens"] == 16
    table = format_table(result)
    assert "embedded k=4 mix=off fixed" in table and "speedup" in table
    assert "peak RSS" in format_footer(result)
    assert "embedded k=4 mix=off fixed" in format_round_table(result)


def test_bench_sizes_costs_and_kinds(tinystories_graph, tmp_path) -> None:
    """--draft-size cost,fixed and --verify-cost measured,flat give a row each; prompts with a
    kind get a table per kind, whose counts add up to the whole run's."""
    prompts = tmp_path / "prompts.jsonl"
    texts = [json.loads(line)["prompt"] for line in DEMO_PROMPTS.read_text().splitlines()][:4]
    prompts.write_text(
        "".join(json.dumps({"prompt": t, "kind": "ab"[i % 2]}) + "\n" for i, t in enumerate(texts))
    )
    settings = BenchSettings(
        graph=str(tinystories_graph),
        model=str(STORIES_MODEL),
        prompts=str(prompts),
        max_tokens=16,
        temperature=0.0,
        ks=(4,),
        mixes=(True,),
        systems=("hf", "embedded"),
        draft_sizes=("cost", "fixed"),
        verify_costs=("measured", "flat"),
        warmup=1,
    )
    result = run_benchmark(settings)
    names = {"hf", "embedded k=4 mix=on", "embedded k=4 mix=on cost=flat"}
    names.add("embedded k=4 mix=on fixed")
    assert set(result["summary"]) == names
    assert set(result["by_kind"]) == {"a", "b"}
    for name, figures in result["summary"].items():
        assert figures["exact_mismatches"] == 0
        kinds = [result["by_kind"][k][name] for k in ("a", "b")]
        assert [k["prompts"] for k in kinds] == [2, 2]
        assert sum(k["tokens_total"] for k in kinds) == figures["tokens_total"]
        assert sum(k["rounds_total"] for k in kinds) == figures["rounds_total"]
    table = format_table(result)
    assert "kind 'a' (2 prompts)" in table and "kind 'b' (2 prompts)" in table


@pytest.mark.slow
@pytest.mark.parametrize("services_as", ["bench", "up", "serve"])
def test_bench_services(tinystories_graph, services_as) -> None:
    settings = _settings(tinystories_graph, ("hf", "services"))
    settings.services_as = services_as
    if services_as != "bench":  # up / serve start one stack: one services variant
        settings.mixes = (True,)
    result = run_benchmark(settings)
    for mix in ("on", "off") if services_as == "bench" else ("on",):
        _check_speculative(result["summary"][f"services k=4 mix={mix} fixed"])
    services = result["memory"]["services"]
    assert set(services) == {"draft", "verifier", "gateway"}
    for info in services.values():
        # bench: the bench's threads everywhere; up and serve: the user's environment
        expected = "1" if services_as == "bench" else os.environ.get("OMP_NUM_THREADS")
        assert info["omp_num_threads"] == expected
        assert info["peak_rss_bytes"] or info["rss_bytes"]
    chosen = " ".join(result["services_chosen"])
    assert ("torch thread" in chosen) == (services_as != "bench")
    assert "services started as: " + services_as in format_footer(result)


# --- cost, projection and plot -------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PROJECTION_FIELDS = (
    "variant",
    "model",
    "tau",
    "mean_draft_length",
    "overhead_ms_per_round",
    "cost_next_ms",
    "cost_one_ms",
    "projected_tokens_per_second",
    "baseline_tokens_per_second",
    "projected_speedup",
)


@pytest.fixture(scope="module")
def small_run(tinystories_graph) -> dict:
    """2 prompts x 8 tokens through hf and embedded (k 4 and 8, mixing on)."""
    settings = _settings(tinystories_graph, ("hf", "embedded"))
    settings.max_tokens, settings.ks, settings.mixes = 8, (4, 8), (True,)
    return run_benchmark(settings)


def test_parse_counts_and_interpolation() -> None:
    assert parse_counts("1-3,31, 2") == (1, 2, 3, 31)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_counts("0-2")
    forward = {"1": {"median_ms": 1.0}, "3": {"median_ms": 2.0}, "5": {"median_ms": 4.0}}
    assert cost_at(forward, 2.0) == (pytest.approx(1.5e-3), False)
    assert cost_at(forward, 4.5) == (pytest.approx(3.5e-3), False)
    assert cost_at(forward, 6.0) == (pytest.approx(5.0e-3), True)  # extrapolated


def test_cli_cost_arguments() -> None:
    args = build_parser().parse_args(
        ["bench", "cost", "--models", "a,b", "--new-tokens", "1-3,31", "--repeats", "2"]
    )
    settings = cost_settings_from_args(args)
    assert settings.models == ("a", "b") and settings.new_tokens == (1, 2, 3, 31)
    assert settings.repeats == 2 and settings.cache_tokens == 128 and settings.device == "auto"
    argv = "bench generate --graph g --model m --cost --cost-new-tokens 1,9 --plot x.png"
    args = build_parser().parse_args(argv.split())
    assert args.cost and args.plot == "x.png"
    settings = cost_settings_from_args(args, prefix="cost-", models=("m",))
    assert settings.models == ("m",) and settings.new_tokens == (1, 9)


def test_bench_cost_and_projection(small_run) -> None:
    settings = CostSettings(models=(str(STORIES_MODEL),), new_tokens=(1, 2, 9), repeats=3, warmup=1)
    cost = run_cost(settings)
    json.dumps(cost)
    assert cost["device"] in ("cpu", "cuda") and cost["device_name"]
    assert cost["dtype"] == "float32"
    (model,) = cost["models"]
    assert not model["random_weights"] and model["vocab_size"] == 512
    assert set(model["forward"]) == {"1", "2", "9"}
    for figures in model["forward"].values():
        assert figures["median_ms"] > 0 and figures["p10_ms"] <= figures["p90_ms"]
    rows = project_all(small_run["summary"], cost, small_run["settings"]["model"])
    assert {r["variant"] for r in rows} == {
        "embedded k=4 mix=on fixed",
        "embedded k=8 mix=on fixed",
    }
    for row in rows:
        for key in PROJECTION_FIELDS:
            assert key in row, key
        assert row["projected_tokens_per_second"] > 0 and row["projected_speedup"] > 0
        assert row["baseline_tokens_per_second"] == pytest.approx(1e3 / row["cost_one_ms"])
        assert 0 <= row["mean_draft_length"] <= 8
        assert row["measured_tokens_per_second"] > 0  # the run's own model
    text = format_cost_table(cost) + format_projection(rows)
    assert "stories260K" in text and "tau / (cost_M(L+1) + overhead)" in text


@needs(RANDOM_LLAMA)
def test_random_weights_model_builds_from_config() -> None:
    import torch

    loaded, random_weights = load_cost_model(str(RANDOM_LLAMA), torch.device("cpu"), "float32")
    assert random_weights and loaded.vocab_size == 32064


def test_plot_without_matplotlib(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(PlotUnavailable, match="matplotlib"):
        require_matplotlib()


def test_plot_is_a_png(small_run, tmp_path) -> None:
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (the 'bench' extra)")
    out = write_plot(small_run, tmp_path / "bench.png")
    assert out.read_bytes()[:8] == PNG_MAGIC
