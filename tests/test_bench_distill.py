"""`speculant bench distill`: tau replayed against the model's greedy continuations equals tau of
real greedy generation with the embedded decoder (the default drafts, every drafted token
verified), chat prompt records are rendered with the model's chat template, every figure is
given per kind and adds up, and a bad prompts file is one error line with exit status 2."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

import bench.distill
from launcher.cli import main
from speculant.config import DraftConfig, GenerationConfig
from tests.assets import DEMO_PROMPTS, STORIES_MODEL
from tests.test_tune import expected_prompt_ids, spy_on_traces, write_chat_model, write_chat_prompts

COUNTS = ("prompts", "tokens", "rounds", "drafted", "accepted")


def bench_distill(graph: Path, model: Path, eval_prompts: Path, *extra: str) -> list[str]:
    """The command line of a small bench distill: 4 demo prompts distilled at most."""
    return [
        "bench", "distill", "--graph", str(graph), "--model", str(model),
        "--prompts", str(DEMO_PROMPTS), "--device", "cpu", "--max-tokens", "8",
        "--batch-size", "4", "--eval-prompts", str(eval_prompts), *extra,
    ]  # fmt: skip


def test_replayed_tau_equals_real_greedy_generation(
    graph_copy: Path, tmp_path: Path, embedded_decoder
) -> None:
    """budget 0 (the corpus graph): the replay's counts are those of the embedded decoder's own
    greedy runs with the default drafts, every drafted token verified, learning off."""
    out = tmp_path / "bench.json"
    argv = bench_distill(graph_copy, STORIES_MODEL, DEMO_PROMPTS, "--budgets", "0")
    assert main([*argv, "--limit", "4", "--eval-max-tokens", "24", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["rows"][0]
    prompts = [json.loads(line)["prompt"] for line in DEMO_PROMPTS.read_text().splitlines()][:4]
    fixed = {"draft_size": "fixed"} if "draft_size" in DraftConfig.model_fields else {}
    draft = DraftConfig(**fixed)
    taus, tokens, rounds, drafted, accepted = [], 0, 0, 0, 0
    for prompt in prompts:
        result = embedded_decoder.generate(
            prompt,
            generation_config=GenerationConfig(max_tokens=24, temperature=0),
            draft_config=draft,
        )
        stats = result.stats
        taus.append(len(result.token_ids) / stats.rounds)
        tokens, rounds = tokens + len(result.token_ids), rounds + stats.rounds
        drafted, accepted = drafted + stats.draft_tokens, accepted + stats.accepted_tokens
    assert accepted > 0  # the drafts do something to compare
    assert (row["tokens"], row["rounds"], row["drafted"], row["accepted"]) == (
        tokens,
        rounds,
        drafted,
        accepted,
    )
    assert row["tau_median"] == pytest.approx(statistics.median(taus))
    assert row["tau_all_tokens"] == pytest.approx(tokens / rounds)
    assert row["acceptance_rate"] == pytest.approx(accepted / drafted)


def test_chat_records_are_rendered_and_figures_are_given_per_kind(
    graph_copy: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    model = write_chat_model(tmp_path / "chat-model")
    records = write_chat_prompts(tmp_path / "chat.jsonl", 5)
    seen = spy_on_traces(monkeypatch, bench.distill)
    out = tmp_path / "bench.json"
    argv = bench_distill(graph_copy, model, tmp_path / "chat.jsonl", "--budgets", "0,4")
    assert main([*argv, "--eval-max-tokens", "16", "--json", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    assert [list(t.prompt_ids) for t in seen] == [
        expected_prompt_ids(tokenizer, r) for r in records
    ]
    result = json.loads(out.read_text())
    assert result["kinds"] == {"ask": 2, "tell": 2, "(none)": 1}
    assert [row["generations"] for row in result["rows"]] == [0, 4]
    for row in result["rows"]:
        assert row["tokens"] == sum(len(t.tokens) for t in seen)
        for count in COUNTS:
            per_kind = sum(row["by_kind"][kind][count] for kind in result["kinds"])
            assert per_kind == row[count], (row["generations"], count)
    printed = capsys.readouterr().out
    assert "tau median" in printed and "flat cost profile" in printed
    table = printed.splitlines()[3:]
    assert len(table) == 2 * 4  # per budget: all prompts, then each kind
    assert [line.split()[1] for line in table[:4]] == ["all", "ask", "tell", "(none)"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "a"}\nnot json\n', ":2: not JSON"),
        ('{"messages": []}\n', ":1: a record needs a non-empty 'prompt' string or 'messages'"),
        ('{"prompt": "a", "kind": ["x"]}\n', "'kind' must be a string"),
        (None, "cannot read prompts file"),
    ],
)
def test_a_bad_prompts_file_is_one_error_line_and_status_2(
    tmp_path: Path, capsys, content: str | None, message: str
) -> None:
    prompts = tmp_path / "eval.jsonl"
    if content is not None:
        prompts.write_text(content, encoding="utf-8")
    argv = bench_distill(tmp_path / "no-graph", STORIES_MODEL, prompts, "--budgets", "0")
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "speculant bench distill: error: --eval-prompts" in lines[0] and message in lines[0]


def test_chat_records_for_a_model_without_a_chat_template_are_one_error_line(
    tinystories_graph: Path, tmp_path: Path, capsys
) -> None:
    write_chat_prompts(tmp_path / "chat.jsonl", 2)
    argv = bench_distill(tinystories_graph, STORIES_MODEL, tmp_path / "chat.jsonl")
    assert main([*argv, "--budgets", "0"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "prompt 1" in errors[0] and "chat template" in errors[0]
    assert "Traceback" not in err


def test_the_saved_graph_is_what_distill_writes_for_that_budget(
    graph_copy: Path, tmp_path: Path
) -> None:
    """--save-graph keeps the largest budget's graph: the n-gram counts `speculant distill
    --generations 4` writes to another copy of the corpus graph, with the same options."""
    import shutil

    from tests.test_distill import meta_of

    other = tmp_path / "other"
    shutil.copytree(graph_copy, other)
    kept = tmp_path / "kept"
    argv = bench_distill(graph_copy, STORIES_MODEL, DEMO_PROMPTS, "--budgets", "0,4")
    assert main([*argv, "--limit", "2", "--eval-max-tokens", "8", "--save-graph", str(kept)]) == 0
    # not --quiet: in this process it would quieten the loggers of the tests that follow
    distill = [
        "distill", "--graph", str(other), "--model", str(STORIES_MODEL),
        "--prompts", str(DEMO_PROMPTS), "--device", "cpu", "--max-tokens", "8",
        "--batch-size", "4", "--generations", "4",
    ]  # fmt: skip
    assert main(distill) == 0
    assert meta_of(kept).orders == meta_of(other).orders
    assert meta_of(kept).orders != meta_of(graph_copy).orders  # the generations were appended
    assert main([*argv, "--save-graph", str(kept)]) == 2  # never over an existing directory


def test_bootstrap_interval_holds_the_estimate_and_narrows_with_more_prompts() -> None:
    """The bootstrap interval of tau over all tokens (prompts resampled) contains the point
    estimate, is the same for the same seed, and is narrower for more prompts alike."""
    import random

    rng = random.Random(7)
    counts = [(128, rng.randint(20, 60)) for _ in range(400)]
    few, many = counts[:25], counts
    for sample in (few, many):
        tau = sum(t for t, _ in sample) / sum(f for _, f in sample)
        low, high = bench.distill.bootstrap_tau(sample)
        assert low < tau < high
        assert bench.distill.bootstrap_tau(sample) == (low, high)
    few_low, few_high = bench.distill.bootstrap_tau(few)
    many_low, many_high = bench.distill.bootstrap_tau(many)
    assert many_high - many_low < few_high - few_low
    assert bench.distill.bootstrap_tau([]) == (0.0, 0.0)
    assert bench.distill.bootstrap_tau([(10, 5)] * 3) == (2.0, 2.0)
