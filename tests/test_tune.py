"""`speculant tune`: the greedy replay matches real runs, the tuned parameters land in the graph's
meta (atomically, with a valid manifest) and become the drafter's defaults, explicit settings
win, and bad input is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.greedy_sim import GreedyTrace, simulate
from builder.meta_update import update_meta
from draft_service.drafting import Drafter
from draft_service.server import DraftServicer
from gateway.coordinator import GenerationRequest
from speculant.cli import main
from speculant.graph_format import DATA_FILE, GraphFormatError, verify_manifest, write_manifest
from speculant.graph_reader import NGramGraph
from speculant.types import DraftParams
from speculant.v1 import draft_pb2
from speculant.wire import draft_params_from_pb
from tests.conftest import DEMO_PROMPTS, STORIES_MODEL, load_dev_prompts
from tests.exactness_checks import plain_greedy_outputs

MAX_TOKENS = 48


def test_the_replay_gives_the_rounds_of_a_real_run(embedded_decoder):
    """simulate() against HF's greedy continuation == the coordinator's own counts, for chains
    and trees."""
    prompts = load_dev_prompts(6)
    references = plain_greedy_outputs(embedded_decoder, prompts, MAX_TOKENS)
    coordinator = embedded_decoder.coordinator
    drafter = coordinator.drafter
    for params in (
        DraftParams(k=8),
        DraftParams(k=8, adaptive_k=True),
        DraftParams(k=3, mixing="backoff"),
        DraftParams(k=5, tree_nodes=12),
        DraftParams(k=4, tree_nodes=6, adaptive_k=True),
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
        ('{"prompt": "a"}\nnot json\n', [], "line 2"),
        ('{"text": "a"}\n{"prompt": "b"}\n', [], 'line 1: needs a non-empty string field "prompt"'),
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
    from gateway.cli import _draft_options
    from speculant.cli import build_parser
    from speculant.config import DraftConfig

    assert DraftParams.from_config(DraftConfig(k=8)).mixing is None
    assert DraftParams.from_config(DraftConfig(k=8)).escape_weight is None
    assert DraftParams.from_config(DraftConfig(mixing="seed")).mixing == "seed"
    monkeypatch.setenv("SPECULANT_DRAFT__ESCAPE_WEIGHT", "3")
    assert DraftParams.from_config(DraftConfig()).escape_weight == 3.0
    options = _draft_options(build_parser().parse_args(["generate", "--prompt", "x"]))
    assert "mixing" not in options and "escape_weight" not in options
    options = _draft_options(
        build_parser().parse_args(["generate", "--prompt", "x", "--mixing", "seed", "--adaptive-k"])
    )
    assert options["mixing"] == "seed" and options["adaptive_k"] is True
