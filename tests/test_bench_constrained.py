"""`speculant bench generate` with constrained prompts (response_format, tools): every system
generates under the prompt's constraint, greedy outputs stay token-identical to Hugging Face
`generate` with the grammar's logits processor, and the figures only constrained runs have
(forced share, answers finished and valid) are there, per kind and in the JSON.

Prompt records carry the constraint (speculant.prompt_records); the kit's stories260K answers
the tight schemas below in a few dozen tokens. No timing assertions: the machine is shared.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.constrained import check_systems
from bench.generate import run_benchmark
from bench.generate_cli import default_systems
from bench.report import format_table
from bench.settings import SYSTEMS, BenchSettings
from speculant.prompt_records import PromptsError, load_prompts
from tests.assets import STORIES_MODEL
from tests.constrained_prompts import PLAY, constrained_rows, write_rows


def test_prompt_records_carry_their_constraints(tmp_path: Path) -> None:
    records = load_prompts(write_rows(tmp_path / "p.jsonl", constrained_rows()))
    assert [r.kind for r in records[:3]] == ["extract", "card", "tool"]
    assert records[0].constraint().kind == "json_schema"
    assert records[4].constraint().kind == "json_object"
    calling = records[2].tool_calling()
    assert calling is not None and calling.mode == "required" and not calling.parallel
    assert records[2].openai_tools()[0]["function"]["name"] == "play"
    assert records[0].answer_is_valid('{"name":"Lily","happy":true}')
    assert not records[0].answer_is_valid('{"name":"Li')
    assert records[2].answer_is_valid('[{"name":"play","parameters":{"toy":"ball"}}]')
    assert not records[2].answer_is_valid('[{"toy":"ball"}]')
    plain = load_prompts(write_rows(tmp_path / "q.jsonl", [{"prompt": "Hi"}]))[0]
    assert plain.constraint() is None and plain.answer_is_valid("x") is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tool_choice": "required"}, "tool_choice: needs 'tools'"),
        ({"response_format": {"type": "json_object"}, "tools": [PLAY]}, "not both"),
    ],
)
def test_a_bad_structured_field_names_the_line(tmp_path: Path, extra: dict, message: str) -> None:
    path = write_rows(tmp_path / "p.jsonl", [{"prompt": "Hi"}, {"prompt": "Hello"} | extra])
    with pytest.raises(PromptsError, match=r"p\.jsonl:2: .*") as caught:
        load_prompts(path)
    assert message in str(caught.value)


def test_prompt_lookup_is_refused_for_constrained_prompts(tmp_path: Path) -> None:
    records = load_prompts(write_rows(tmp_path / "p.jsonl", constrained_rows()))
    with pytest.raises(ValueError, match="hf-lookup"):
        check_systems(("hf", "hf-lookup"), records)
    check_systems(("hf", "plain", "embedded", "services"), records)
    assert "hf-lookup" not in default_systems(records)
    assert default_systems(load_prompts(write_rows(tmp_path / "q.jsonl", [{"prompt": "H"}])))
    assert default_systems(records) == tuple(s for s in SYSTEMS if s != "hf-lookup")


def test_bench_generate_constrained_per_kind(tinystories_graph, tmp_path: Path) -> None:
    prompts = write_rows(tmp_path / "p.jsonl", constrained_rows())
    settings = BenchSettings(
        graph=str(tinystories_graph),
        model=str(STORIES_MODEL),
        prompts=str(prompts),
        max_tokens=48,
        temperature=0.0,
        systems=("hf", "plain", "embedded"),
        verify_costs=("measured", "flat"),
        warmup=1,
    )
    result = run_benchmark(settings)
    json.dumps(result)  # the figures go to --json as they are
    names = {"hf", "plain", "embedded k=16 mix=on", "embedded k=16 mix=on cost=flat"}
    assert set(result["summary"]) == names
    assert set(result["by_kind"]) == {"extract", "card", "tool"}
    for name, figures in result["summary"].items():
        assert figures["exact_mismatches"] == 0, name  # greedy: identical to hf + the mask
        assert figures["constrained_prompts"] == 6
        assert figures["answers_valid"] <= figures["answers_finished"] <= 6
        assert figures["answers_finished"] >= 4  # the tight schemas end within 48 tokens
        for kind in ("extract", "card", "tool"):
            assert result["by_kind"][kind][name]["constrained_prompts"] == 2
    assert result["summary"]["hf"]["forced_share_total"] is None  # hf does not draft
    assert result["summary"]["plain"]["forced_share_total"] == 0.0  # plain only masks
    for name in ("hf", "plain"):  # a forward per token, and one for each answer's EOS
        figures = result["summary"][name]
        assert figures["rounds_total"] == figures["tokens_total"] + figures["answers_finished"]
    flat = result["summary"]["embedded k=16 mix=on cost=flat"]
    assert 0.0 < flat["forced_share_total"] < 1.0 and flat["tau_total"] > 1.0
    assert flat["speedup_over_plain_total"] is not None
    rows = result["per_prompt"]["embedded k=16 mix=on"]
    assert all(r["constrained"] and "accepted_from_grammar" in r for r in rows)
    table = format_table(result)
    assert "kind 'tool' (2 prompts)" in table and "forced" in table and "valid" in table


@pytest.mark.slow
def test_bench_services_constrained(tinystories_graph, tmp_path: Path) -> None:
    """Over the services the constraint travels in GenerateRequest.constraint (a prompt with
    tools as its token ids, rendered with them): the same tokens as hf with the mask."""
    settings = BenchSettings(
        graph=str(tinystories_graph),
        model=str(STORIES_MODEL),
        prompts=str(write_rows(tmp_path / "p.jsonl", constrained_rows()[:3])),
        max_tokens=48,
        temperature=0.0,
        systems=("hf", "services"),
        warmup=1,
    )
    result = run_benchmark(settings)
    figures = result["summary"]["services k=16 mix=on"]
    assert figures["exact_mismatches"] == 0 and figures["constrained_prompts"] == 3
    assert figures["forced_share_total"] > 0.0
