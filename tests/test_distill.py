"""speculant distill: the model's continuations appended to a graph, exactly and atomically.

- a distill run appends a new version that counts exactly the continuations' n-grams (weight
  times), records what was distilled in the meta, and graph-info shows it;
- greedy speculative output with a distilled graph equals Hugging Face greedy decoding;
- a model whose tokenizer differs from the graph's, and a hub name offline, fail with one line;
- a SIGKILL or a Ctrl-C mid-distill publishes nothing: the previous graph stays as it was;
- ``bench distill`` reports tau against the budget.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from graph_factory import write_graph

from distill.run import DistillOptions, distill_graph
from gateway import GenerationConfig, SpeculativeDecoder
from gateway.baseline import PlainDecoder
from speculant.graph_format import open_graph_env, read_meta, verify_manifest
from tests.conftest import ROOT, STORIES_MODEL, STORY_SEPARATOR
from tests.fixtures.e2e import verifier_config

DEMO_CORPUS = ROOT / "demo" / "tinystories-slice.txt"
PROMPTS = ["Once upon a time, there was a little dog", "Tom and Sue went to the park. They"]


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "speculant.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,
    )


def meta_of(graph: Path):
    env = open_graph_env(graph)
    try:
        return read_meta(env, graph)
    finally:
        env.close()


def small_options(graph: Path, **changes) -> DistillOptions:
    options = {
        "graph": str(graph),
        "model": str(STORIES_MODEL),
        "corpus": [str(DEMO_CORPUS)],
        "doc_separator": STORY_SEPARATOR,
        "generations": 24,
        "max_tokens": 16,
        "batch_size": 8,
        "device": "cpu",
        "progress": False,
    }
    return DistillOptions(**(options | changes))


def test_distill_appends_exactly_the_continuations(graph_copy: Path) -> None:
    before = meta_of(graph_copy)
    result = distill_graph(small_options(graph_copy, weight=3))
    after = meta_of(graph_copy)
    assert after.version == before.version + 1 and result.generations == 24
    assert 0 < result.tokens <= 24 * 16
    # every continuation token is the successor of exactly one context of each order (prompts
    # are >= 5 words: more than max_order tokens), counted weight times; prompts add nothing
    for old, new in zip(before.orders, after.orders, strict=True):
        assert new.total_count - old.total_count == 3 * result.tokens, f"order {new.order}"
    record = after.sources[-1]["distilled"][0]
    assert record["model"] == str(STORIES_MODEL)
    assert record["model_fingerprint"].startswith("sha256:")
    assert (record["generations"], record["tokens"], record["weight"]) == (24, result.tokens, 3)
    assert record["temperature"] == 0.0 and record["max_tokens"] == 16
    assert record["prompt_source"]["corpus"] == [str(DEMO_CORPUS.resolve())]
    assert verify_manifest(graph_copy)
    shown = cli("graph-info", str(graph_copy))
    assert shown.returncode == 0, shown.stderr
    assert "distilled: 24 continuations of up to 16 tokens" in shown.stdout


def test_sampled_distill_is_reproducible_and_recorded(graph_copy: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(graph_copy, other)
    first = distill_graph(small_options(graph_copy, temperature=0.9, seed=5))
    second = distill_graph(small_options(other, temperature=0.9, seed=5))
    assert meta_of(graph_copy).orders == meta_of(other).orders  # same seed: the same counts
    assert first.tokens == second.tokens
    assert meta_of(graph_copy).sources[-1]["distilled"][0]["temperature"] == 0.9


def test_greedy_output_with_a_distilled_graph_is_plain_greedy(graph_copy: Path) -> None:
    distill_graph(small_options(graph_copy, generations=64, max_tokens=48))
    decoder = SpeculativeDecoder(graph_copy, verifier_config())
    plain = PlainDecoder.load(str(STORIES_MODEL), decoder.verifier.info.eos_token_ids)
    config = GenerationConfig(max_tokens=64, temperature=0)
    for prompt in PROMPTS:
        expected = plain.generate(decoder.tokenizer(prompt).input_ids, 64).token_ids
        result = decoder.generate(prompt, generation_config=config)
        assert result.token_ids == expected
        assert result.stats.rounds < len(expected)  # drafts were accepted


def test_a_model_with_another_tokenizer_is_refused_in_one_line(tmp_path: Path) -> None:
    graph = write_graph(tmp_path / "g", {1: {(1,): {2: 1}}}, vocab_size=512, fingerprint="x")
    done = cli(
        "distill", "--graph", str(graph), "--model", str(STORIES_MODEL), "--quiet",
        "--corpus", str(DEMO_CORPUS),
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speculant distill: error: ")
    assert "tokenizer differs" in lines[0] and "Traceback" not in done.stderr
    assert meta_of(graph).version == 1


def test_a_hub_name_offline_fails_clearly(graph_copy: Path) -> None:
    done = cli("distill", "--graph", str(graph_copy), "--model", "no-such-org/no-such-model")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("speculant distill: error: ") and "no-such-org/no-such-model" in last
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_an_interrupted_distill_publishes_nothing(graph_copy: Path, how: signal.Signals) -> None:
    data = (graph_copy / "data.mdb").read_bytes()
    command = [sys.executable, "-m", "speculant.cli", "distill", "--graph", str(graph_copy)]
    command += ["--model", str(STORIES_MODEL), "--generations", "100000", "--batch-size", "8"]
    command += ["--corpus", str(DEMO_CORPUS), "--doc-separator", "\\n\\n\\n", "--device", "cpu"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        assert process.stderr is not None
        for line in process.stderr:  # wait until the model is loaded and generating
            if "loaded" in line:
                break
        time.sleep(1.5)
        process.send_signal(how)
        code = process.wait(60)
    finally:
        process.kill()
    assert code == (-signal.SIGKILL if how == signal.SIGKILL else 130)
    assert meta_of(graph_copy).version == 1
    assert (graph_copy / "data.mdb").read_bytes() == data
    assert verify_manifest(graph_copy)
    leftovers = [p.name for p in graph_copy.parent.iterdir() if p.name.startswith(".graph.tmp-")]
    assert leftovers == []  # nothing was being published yet


def test_bench_distill_reports_tau_against_the_budget(graph_copy: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = cli(
        "bench", "distill", "--graph", str(graph_copy), "--model", str(STORIES_MODEL),
        "--corpus", str(DEMO_CORPUS), "--doc-separator", "\\n\\n\\n", "--device", "cpu",
        "--budgets", "0,16", "--max-tokens", "16", "--batch-size", "8",
        "--eval-prompts", str(ROOT / "demo" / "prompts.jsonl"), "--limit", "3",
        "--eval-max-tokens", "24", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert [row["generations"] for row in result["rows"]] == [0, 16]
    assert all(row["tau_median"] >= 1.0 for row in result["rows"])
    assert "tau median" in done.stdout
    assert meta_of(graph_copy).version == 1  # the bench works on copies
