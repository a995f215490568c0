"""`speculant tune`: the greedy replay matches real runs, the tuned parameters land in the graph's
meta (atomically, with a valid manifest) and become the drafter's defaults, explicit settings
win, chat prompt records are rendered with the model's chat template, figures are given per
kind and add up, and bad input is a one-line error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from builder.meta_update import update_meta
from distill.replay import GreedyTrace, simulate, verify_all
from draft_service.drafting import Drafter
from draft_service.servicer import DraftServicer
from gateway.generation import GenerationRequest
from launcher.cli import main
from speculant.config import DraftParams
from speculant.graph_format import GraphFormatError
from speculant.graph_manifest import DATA_FILE, verify_manifest, write_manifest
from speculant.graph_reader import NGramGraph
from speculant.v1 import draft_pb2
from speculant.wire import draft_params_from_pb
from tests.assets import DEMO_PROMPTS, STORIES_MODEL, load_dev_prompts
from tests.exactness_checks import plain_greedy_outputs

MAX_TOKENS = 48


def test_the_replay_gives_the_rounds_of_a_real_run(embedded_decoder):
    """simulate() against HF's greedy continuation == the coordinator's own counts, for chains
    and trees."""
    prompts = load_dev_prompts(6)
    references = plain_greedy_outputs(embedded_decoder, prompts, MAX_TOKENS)
    coordinator = embedded_decoder.coordinator
    drafter = coordinator.drafter
    for params in map(
        verify_all,  # the replay verifies every drafted token (draft_size "fixed")
        (
            DraftParams(k=8),
            DraftParams(k=3, mixing="backoff"),
            DraftParams(k=5, tree_nodes=12),
            DraftParams(k=4, tree_nodes=6),
        ),
    ):
        for prompt, expected in zip(prompts, references, strict=True):
            ids = list(embedded_decoder.tokenizer(prompt).input_ids)
            request = GenerationRequest(ids, MAX_TOKENS, temperature=0.0, seed=0, draft=params)
            real = coordinator.generate(request).stats
            trace = GreedyTrace(tuple(ids), tuple(expected), len(expected) < MAX_TOKENS)
            replay = simulate(drafter, params, trace, MAX_TOKENS, coordinator.draft_context_window)
            assert (replay.forwards, replay.drafted, replay.accepted, replay.tokens) == (
                real.rounds,
                real.draft_tokens,
                real.accepted_tokens,
                real.generated_tokens,
            ), f"{params} on {prompt[:30]!r}"


def _prompt_file(path: Path, count: int) -> Path:
    lines = DEMO_PROMPTS.read_text(encoding="utf-8").splitlines()[:count]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_tune_writes_the_meta_and_the_drafter_uses_it(graph_copy: Path, tmp_path: Path, capsys):
    prompts = _prompt_file(tmp_path / "prompts.jsonl", 4)
    out = tmp_path / "tune.json"
    argv = ["tune", "--graph", str(graph_copy), "--model", str(STORIES_MODEL)]
    argv += ["--prompts", str(prompts), "--max-prompts", "4", "--max-tokens", "16"]
    assert main([*argv, "--json", str(out), "--write"]) == 0
    printed = capsys.readouterr().out
    assert "held-out" in printed and "witten-bell" in printed and "wrote" in printed
    result = json.loads(out.read_text())
    assert result["prompts"] == {"train": 2, "heldout": 2}
    assert sum(row["chosen"] for row in result["rows"]) == 1
    assert {row["name"] for row in result["rows"]} == {
        "default",
        "backoff",
        "witten-bell",
        "seed built-in",
        "seed",
    }
    assert verify_manifest(graph_copy)  # the manifest matches the rewritten data file
    graph = NGramGraph.open(graph_copy)
    try:
        assert graph.meta.tuned["params"] == result["best"] == result["written"]["params"]
        assert graph.meta.tuned["train_prompts"] == 2
        resolved = Drafter(graph).resolve(DraftParams(k=8))
        for name, value in result["best"].items():
            assert getattr(resolved, name) == value
    finally:
        graph.close()


def _contexts(count: int = 8) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(STORIES_MODEL))
    return [list(tokenizer(p).input_ids) for p in load_dev_prompts(count)]


def test_graph_defaults_fill_unset_parameters_and_explicit_ones_win(graph_copy: Path):
    """Tuned "backoff" drafts like an explicit backoff; an explicit mode is kept."""
    contexts = _contexts()
    before = NGramGraph.open(graph_copy)
    try:
        drafter = Drafter(before)
        backoff = [
            drafter.propose(c, DraftParams(k=8, mixing="backoff")).token_ids for c in contexts
        ]
        default = [drafter.propose(c, DraftParams(k=8)).token_ids for c in contexts]
    finally:
        before.close()
    assert backoff != default, "need contexts where the modes draft differently"
    meta = update_meta(
        graph_copy,
        lambda m: m.__class__(**{**m.__dict__, "tuned": {"params": {"mixing": "backoff"}}}),
    )
    assert meta.tuned["params"] == {"mixing": "backoff"}
    assert verify_manifest(graph_copy)
    graph = NGramGraph.open(graph_copy)
    try:
        drafter = Drafter(graph)
        assert [drafter.propose(c, DraftParams(k=8)).token_ids for c in contexts] == backoff
        explicit = DraftParams(k=8, mixing="witten-bell")
        assert [drafter.propose(c, explicit).token_ids for c in contexts] == default
        # over gRPC: an unset field stays unset until the draft service's drafter fills it
        servicer = DraftServicer()
        servicer.load(graph)
        params, _ = draft_params_from_pb(
            draft_pb2.ProposeRequest(context_token_ids=[1], k=8), servicer.defaults
        )
        assert params.mixing is None
        assert servicer.drafter.resolve(params).mixing == "backoff"
    finally:
        graph.close()


def test_bad_tuned_parameters_are_refused_at_open(graph_copy: Path):
    update_meta(
        graph_copy,
        lambda m: m.__class__(**{**m.__dict__, "tuned": {"params": {"escape_weight": -1}}}),
    )
    with pytest.raises(GraphFormatError, match="tuned"):
        NGramGraph.open(graph_copy)
    update_meta(graph_copy, lambda m: m.__class__(**{**m.__dict__, "tuned": {"params": {"k": 3}}}))
    with pytest.raises(GraphFormatError, match="not mixing parameters"):
        NGramGraph.open(graph_copy)


def test_a_damaged_graph_is_not_rewritten(graph_copy: Path):
    write_manifest(graph_copy)
    with open(graph_copy / DATA_FILE, "r+b") as f:
        f.seek(4096 + 100)
        byte = f.read(1)
        f.seek(4096 + 100)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(GraphFormatError, match="checksum"):
        update_meta(graph_copy, lambda m: m)


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        (None, [], "cannot read"),
        ('{"prompt": "a"}\nnot json\n', [], ":2: not JSON"),
        ('{"text": "a"}\n{"prompt": "b"}\n', [], ":1: a record needs a non-empty 'prompt'"),
        ('{"prompt": "only one"}\n', [], "at least 2"),
        ('{"prompt": "a"}\n{"prompt": "b"}\n', ["--max-prompts", "1"], "--max-prompts"),
        ('{"prompt": "a"}\n{"prompt": "b"}\n', ["--train-fraction", "1"], "--train-fraction"),
        ('{"prompt": "a"}\n{"prompt": "b"}\n', ["--k", "0"], "k: must be in 1..64"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path: Path, capsys, content, extra, message):
    prompts = tmp_path / "prompts.jsonl"
    if content is not None:
        prompts.write_text(content, encoding="utf-8")
    argv = ["tune", "--graph", str(tmp_path / "no-graph"), "--model", str(STORIES_MODEL)]
    assert main([*argv, "--prompts", str(prompts), *extra]) != 0
    err = capsys.readouterr().err
    assert "error:" in err and message in err and "Traceback" not in err


def test_a_missing_graph_is_a_one_line_error(tmp_path: Path, capsys):
    prompts = _prompt_file(tmp_path / "prompts.jsonl", 2)
    argv = ["tune", "--graph", str(tmp_path / "no-graph"), "--model", str(STORIES_MODEL)]
    assert main([*argv, "--prompts", str(prompts)]) != 0
    err = capsys.readouterr().err
    assert "error: graph not found" in err and "Traceback" not in err


def test_only_explicit_mixing_settings_override_the_graph(monkeypatch: pytest.MonkeyPatch):
    from launcher.cli import build_parser
    from speculant.config import DraftConfig
    from speculant.draft_flags import given_draft_defaults

    assert DraftParams.from_config(DraftConfig(k=8)).mixing is None
    assert DraftParams.from_config(DraftConfig(k=8)).escape_weight is None
    assert DraftParams.from_config(DraftConfig(mixing="seed")).mixing == "seed"
    monkeypatch.setenv("SPECULANT_DRAFT__ESCAPE_WEIGHT", "3")
    assert DraftParams.from_config(DraftConfig()).escape_weight == 3.0
    options = given_draft_defaults(build_parser().parse_args(["generate", "--prompt", "x"]))
    assert "mixing" not in options and "escape_weight" not in options
    options = given_draft_defaults(
        build_parser().parse_args(["generate", "--prompt", "x", "--mixing", "seed", "--k", "4"])
    )
    assert options["mixing"] == "seed" and options["k"] == 4


# --- prompt records: chat messages, kinds, bad files ------------------------------------------

# A simple chat template for a copy of the demo model (stories260K has none).
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def write_chat_model(dest: Path) -> Path:
    """A copy of the demo model whose tokenizer has CHAT_TEMPLATE (the same vocabulary: the
    tinystories graph serves it)."""
    shutil.copytree(STORIES_MODEL, dest)
    config_file = dest / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return dest


def write_chat_prompts(path: Path, count: int) -> list[dict]:
    """`count` records of the demo prompts, in turn: a user message ("ask"), a system and a
    user message ("tell"), and a text prompt without a kind; the records written."""
    texts = [json.loads(line)["prompt"] for line in DEMO_PROMPTS.read_text().splitlines()]
    records: list[dict] = []
    for i, text in enumerate(texts[:count]):
        if i % 3 == 0:
            records.append({"messages": [{"role": "user", "content": text}], "kind": "ask"})
        elif i % 3 == 1:
            system = {"role": "system", "content": "Tell a story."}
            user = {"role": "user", "content": text}
            records.append({"messages": [system, user], "kind": "tell"})
        else:
            records.append({"prompt": text})
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


def expected_prompt_ids(tokenizer, record: dict) -> list[int]:
    """The ids a server gives a record: CHAT_TEMPLATE rendered by hand, or the text with BOS."""
    if "messages" not in record:
        return list(tokenizer(record["prompt"]).input_ids)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in record["messages"]) + "assistant:"
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def spy_on_traces(monkeypatch: pytest.MonkeyPatch, module) -> list[GreedyTrace]:
    """The traces module.prompt_traces returns, as the command runs."""
    seen: list[GreedyTrace] = []
    real = module.prompt_traces

    def spy(*args, **kwargs):
        traces = real(*args, **kwargs)
        seen.extend(traces)
        return traces

    monkeypatch.setattr(module, "prompt_traces", spy)
    return seen


COUNTS = ("tokens", "forwards", "drafted", "accepted")


def test_tune_takes_chat_records_and_reports_every_figure_per_kind(
    tinystories_graph: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    from transformers import AutoTokenizer

    import distill.tune

    model = write_chat_model(tmp_path / "chat-model")
    records = write_chat_prompts(tmp_path / "chat.jsonl", 4)
    seen = spy_on_traces(monkeypatch, distill.tune)
    out = tmp_path / "tune.json"
    argv = ["tune", "--graph", str(tinystories_graph), "--model", str(model)]
    argv += ["--prompts", str(tmp_path / "chat.jsonl"), "--max-prompts", "4", "--max-tokens", "8"]
    assert main([*argv, "--json", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    expected = [expected_prompt_ids(tokenizer, r) for r in records]
    assert [list(t.prompt_ids) for t in seen] == expected
    assert expected[0] != list(tokenizer(records[0]["messages"][0]["content"]).input_ids)
    result = json.loads(out.read_text())
    assert list(result["kinds"]) == ["ask", "tell", "(none)"]  # in order of appearance
    for part in ("train", "heldout"):
        assert sum(c[part] for c in result["kinds"].values()) == result["prompts"][part]
    generated = sum(len(t.tokens) for t in seen)
    for row in result["rows"]:
        assert row["train"]["tokens"] + row["heldout"]["tokens"] == generated
        for part in ("train", "heldout"):
            for count in COUNTS:
                per_kind = sum(row["by_kind"][k][part][count] for k in result["kinds"])
                assert per_kind == row[part][count], (row["name"], part, count)
    printed = capsys.readouterr().out
    assert "per kind, tau (train / held-out)" in printed
    assert all(kind in printed for kind in result["kinds"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"messages": [{"role": "user"}]}\n{"prompt": "b"}\n', "messages[0] needs string"),
        ('{"prompt": "a", "kind": 3}\n{"prompt": "b"}\n', "'kind' must be a string"),
        ('[1, 2]\n{"prompt": "b"}\n', ":1: a record must be a JSON object"),
        ("\n\n", "has no prompts"),
    ],
)
def test_a_bad_prompts_file_is_one_error_line_and_status_2(
    tmp_path: Path, capsys, content: str, message: str
):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(content, encoding="utf-8")
    argv = ["tune", "--graph", str(tmp_path / "no-graph"), "--model", str(STORIES_MODEL)]
    assert main([*argv, "--prompts", str(prompts)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "speculant tune: error: --prompts" in lines[0], lines
    assert message in lines[0]


def test_chat_records_for_a_model_without_a_chat_template_are_one_error_line(
    tinystories_graph: Path, tmp_path: Path, capsys
):
    write_chat_prompts(tmp_path / "chat.jsonl", 2)
    argv = ["tune", "--graph", str(tinystories_graph), "--model", str(STORIES_MODEL)]
    assert main([*argv, "--prompts", str(tmp_path / "chat.jsonl")]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "prompt 1" in errors[0] and "chat template" in errors[0]
    assert "Traceback" not in err
