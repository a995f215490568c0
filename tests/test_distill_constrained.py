"""`speculant distill --prompts` with constrained records (response_format, tools): each
continuation is generated under its record's constraint (distill.generation), rows with and
without one batched together; --constraints off generates free text; a constraint that does not
compile is refused in one line before any generation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.errors import BuildError
from distill.generation import generate_continuations
from distill.options import DistillOptions
from distill.prompts import file_prompts, write_prompts
from distill.run import distill_graph
from speculant.grammar import grammars_for
from speculant.graph_format import open_graph_env, read_meta
from tests.assets import STORIES_MODEL
from tests.constrained_prompts import constrained_rows, write_rows


def meta_of(graph: Path):
    env = open_graph_env(graph)
    try:
        return read_meta(env, graph)
    finally:
        env.close()


def options(graph: Path, prompts: Path, **changes) -> DistillOptions:
    values = {
        "graph": str(graph),
        "model": str(STORIES_MODEL),
        "prompts_file": str(prompts),
        "max_tokens": 32,
        "batch_size": 4,
        "device": "cpu",
        "progress": False,
    }
    return DistillOptions(**(values | changes))


def test_batched_rows_keep_to_their_own_constraints(loaded, tmp_path: Path) -> None:
    rows = [*constrained_rows()[:3], {"prompt": "Once upon a time, there was a cat"}]
    records = file_prompts(write_rows(tmp_path / "p.jsonl", rows))
    constraints = [r.constraint() for r in records]
    assert constraints[-1] is None
    grammars = grammars_for(loaded.tokenizer, loaded.vocab_size, loaded.eos_token_ids)
    generations = list(
        generate_continuations(
            loaded.model,
            [r.token_ids(loaded.tokenizer) for r in records],
            max_tokens=40,
            temperature=0.0,
            batch_size=4,  # one batch: constrained and free rows together
            eos_token_ids=loaded.eos_token_ids,
            pad_token_id=loaded.eos_token_ids[0],
            constraints=constraints,
            grammars=grammars,
        )
    )
    by_index = {g.index: g.continuation_ids for g in generations}
    for i, record in enumerate(records[:3]):
        tokens = by_index[i]
        assert grammars.matcher(constraints[i]).valid_prefix(tokens) == len(tokens)
        if len(tokens) < 40:  # it ended: the answer reads back
            assert record.answer_is_valid(loaded.tokenizer.decode(tokens)), tokens
    free = loaded.tokenizer.decode(by_index[3])
    assert not free.lstrip().startswith(("{", "["))  # the free row was not masked


def test_distill_constrained_records(graph_copy: Path, tmp_path: Path) -> None:
    prompts = write_rows(tmp_path / "p.jsonl", constrained_rows())
    saved = tmp_path / "saved.jsonl"
    result = distill_graph(options(graph_copy, prompts, save_prompts=str(saved)))
    assert result.generations == 6 and result.tokens > 0
    record = meta_of(graph_copy).sources[-1]["distilled"][0]
    assert record["constrained_prompts"] == 6
    # the prompts written back carry their structured fields as they were
    assert [r.constraint() for r in file_prompts(saved)] == [
        r.constraint() for r in file_prompts(prompts)
    ]
    other = tmp_path / "saved2.jsonl"
    write_prompts(other, file_prompts(saved))
    assert other.read_text() == saved.read_text()


def test_constraints_off_distills_free_text(graph_copy: Path, tmp_path: Path) -> None:
    prompts = write_rows(tmp_path / "p.jsonl", constrained_rows()[:2])
    distill_graph(options(graph_copy, prompts, constraints=False))
    record = meta_of(graph_copy).sources[-1]["distilled"][0]
    assert record["constrained_prompts"] == 0


def test_a_constraint_that_does_not_compile_is_refused(graph_copy: Path, tmp_path: Path) -> None:
    bad = {"type": "object", "properties": {"a": 3}}
    row = {"prompt": "Hi there", "response_format": {"type": "json_schema", "json_schema": {}}}
    row["response_format"]["json_schema"]["schema"] = bad
    prompts = write_rows(tmp_path / "p.jsonl", [{"prompt": "Once upon a time"}, row])
    with pytest.raises(BuildError, match="prompt 2: its constraint does not compile"):
        distill_graph(options(graph_copy, prompts))
    assert meta_of(graph_copy).version == 1  # nothing published
    assert json.loads(prompts.read_text().splitlines()[1])["response_format"]
