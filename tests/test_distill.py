"""speculant distill: the model's continuations appended to a graph, exactly and atomically.

- a distill run appends a new version that counts exactly the continuations' n-grams (weight
  times), records what was distilled in the meta, and graph-info shows it;
- greedy speculative output with a distilled graph equals Hugging Face greedy decoding;
- a model whose tokenizer differs from the graph's, and a hub name offline, fail with one line;
- a SIGKILL or a Ctrl-C mid-distill publishes nothing: the previous graph stays as it was;
- ``bench distill`` reports tau against the budget;
- a prompts file gets one generation per prompt by default; more greedy generations than it has
  prompts are refused in one line (the repeats would be identical), sampled repeats differ;
- a model with a chat template distills passage prompts (corpus passages with an instruction)
  by default, recorded in the meta;
- without a terminal, progress goes to log lines (generations done, rates, ETA);
- --samples N adds N seeded sampled answers per prompt at --sample-weight (progress counts
  them), --samples 0 appends exactly what one answer per prompt did; --loop-cut cuts real
  looping answers before an n-gram's K+1-th occurrence.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from graph_factory import write_graph

from builder import GraphBuilder
from builder.errors import BuildError
from builder.info import distilled_line
from distill.cli import loop_cut
from distill.generation import cut_loops
from distill.options import DistillOptions, OptionsError
from distill.progress import Progress
from distill.prompts import PASSAGE_TEMPLATES, corpus_passages, file_prompts
from distill.run import continuations, distill_graph, generation_weight, prepare, prompt_kind
from gateway import DraftConfig, GenerationConfig, SpeculativeDecoder
from gateway.launch.baseline import PlainDecoder
from speculant.graph_format import open_graph_env, read_meta
from speculant.graph_manifest import verify_manifest
from tests.assets import ROOT, STORIES_MODEL, STORY_SEPARATOR
from tests.fixtures.e2e import verifier_config

DEMO_CORPUS = ROOT / "demo" / "tinystories-slice.txt"
PROMPTS = ["Once upon a time, there was a little dog", "Tom and Sue went to the park. They"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
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


@pytest.fixture
def chat_model(tmp_path: Path) -> Path:
    """stories260K with a chat template in its tokenizer config (the same tokenizer: the graph's
    fingerprint), standing in for a chat model."""
    out = tmp_path / "stories260K-chat"
    shutil.copytree(STORIES_MODEL, out)
    config_file = out / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["chat_template"] = CHAT_TEMPLATE
    config_file.write_text(json.dumps(config), encoding="utf-8")
    return out


@pytest.fixture
def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": p}) for p in [*PROMPTS, "The sun was hot and the"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


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
    fixed = DraftConfig(draft_size="fixed")  # every draft is verified (not sized by timings)
    for prompt in PROMPTS:
        expected = plain.generate(decoder.tokenizer(prompt).input_ids, 64).token_ids
        result = decoder.generate(prompt, generation_config=config, draft_config=fixed)
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
    command = [sys.executable, "-m", "launcher.cli", "distill", "--graph", str(graph_copy)]
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


def test_a_prompts_file_gets_one_generation_per_prompt_and_logs_progress(
    graph_copy: Path, prompts_file: Path
) -> None:
    done = cli(
        "distill", "--graph", str(graph_copy), "--model", str(STORIES_MODEL),
        "--prompts", str(prompts_file), "--max-tokens", "8", "--batch-size", "2",
        "--device", "cpu", "--progress-every", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    record = meta_of(graph_copy).sources[-1]["distilled"][0]
    assert record["generations"] == 3  # no --generations: one per prompt of the file
    source = record["prompt_source"]
    assert source["type"] == "file" and source["records"] == 3
    assert source["prompts_file"] == str(prompts_file.resolve())
    # stderr is a pipe, not a terminal: progress lines instead of a bar (a line at every step
    # with --progress-every 0), then the end line
    lines = [line for line in done.stderr.splitlines() if "progress: " in line]
    assert lines and all("/3 generations" in line and "ETA" in line for line in lines)
    assert any("tokens/s" in line and "(batch 1 at token" in line for line in lines)
    assert "generated 3/3 continuations" in done.stderr


def test_more_greedy_generations_than_prompts_are_refused(
    graph_copy: Path, prompts_file: Path
) -> None:
    done = cli(
        "distill", "--graph", str(graph_copy), "--model", str(STORIES_MODEL),
        "--prompts", str(prompts_file), "--generations", "5",
    )  # fmt: skip
    assert done.returncode == 2  # flags that do not go together: a usage error
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("speculant distill: error: "), done.stderr
    assert "temperature 0" in lines[0] and "--temperature > 0" in lines[0]
    assert "Traceback" not in done.stderr
    assert meta_of(graph_copy).version == 1


def test_sampled_repeats_of_a_prompt_differ(graph_copy: Path, prompts_file: Path) -> None:
    options = small_options(
        graph_copy,
        corpus=[],
        prompts_file=str(prompts_file),
        generations=7,
        temperature=1.0,
        batch_size=3,
        max_tokens=12,
    )
    job = prepare(options)
    assert job.prompt_source["type"] == "file" and len(job.prompt_ids) == 7
    by_prompt: dict[int, list[tuple[int, ...]]] = {}
    for generation in continuations(job):
        by_prompt.setdefault(generation.index % 3, []).append(tuple(generation.continuation_ids))
    assert sorted(len(v) for v in by_prompt.values()) == [2, 2, 3]
    for repeats in by_prompt.values():  # each repeat is a sample of its own
        assert len(set(repeats)) == len(repeats), repeats
    with pytest.raises(OptionsError, match="--temperature > 0"):
        prepare(small_options(graph_copy, corpus=[], prompts_file=str(prompts_file), generations=4))


def test_a_chat_model_distills_passage_prompts(
    graph_copy: Path, chat_model: Path, tmp_path: Path
) -> None:
    saved = tmp_path / "saved.jsonl"
    options = small_options(
        graph_copy, model=str(chat_model), generations=12, max_tokens=8, seed=3,
        save_prompts=str(saved),
    )  # fmt: skip
    result = distill_graph(options)
    assert result.generations == 12
    record = meta_of(graph_copy).sources[-1]["distilled"][0]
    source = record["prompt_source"]
    assert source["type"] == "passages" and source["passage_words"] == [40, 120]
    assert source["corpus"] == [str(DEMO_CORPUS.resolve())]
    assert source["templates"] == {name: 2 for name in PASSAGE_TEMPLATES}  # 12 in turn
    # the prompts used: passage prompts of the corpus for the seed (saved before generating)
    expected = corpus_passages(
        [str(DEMO_CORPUS)], 12, seed=3, doc_separator=STORY_SEPARATOR, min_words=40,
        max_words=120,
    )  # fmt: skip
    assert file_prompts(saved) == expected
    assert all(p.messages[0][0] == "user" and len(p.messages) == 1 for p in expected)
    assert "40-120 word passages of" in distilled_line(record)  # graph-info's text


def test_which_prompts_a_model_gets(graph_copy: Path, chat_model: Path, tmp_path: Path) -> None:
    options = small_options(graph_copy)
    assert prompt_kind(options, chat_template=False) == "prefixes"  # stories260K, as before
    assert prompt_kind(options, chat_template=True) == "passages"
    chat = small_options(graph_copy, chat=True)  # --chat: prefixes as a user message
    assert prompt_kind(chat, chat_template=True) == "prefixes"
    prefixes = small_options(graph_copy, corpus_prompts="prefixes")
    assert prompt_kind(prefixes, chat_template=True) == "prefixes"
    with pytest.raises(BuildError, match="no chat template"):
        prepare(small_options(graph_copy, corpus_prompts="passages"))
    with pytest.raises(OptionsError, match="not with --prompts"):
        small_options(
            graph_copy, corpus=[], prompts_file="x.jsonl", corpus_prompts="passages"
        ).validate()
    job = prepare(small_options(graph_copy, model=str(chat_model), corpus_prompts="prefixes"))
    assert job.prompt_source["type"] == "prefixes" and job.prompt_source["prefix_words"] == [5, 40]


def test_progress_lines_come_every_so_often(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="distill")

    def lines(every: float) -> list[str]:
        caplog.clear()
        progress = Progress(
            total=10, batch_size=4, max_tokens=8, mode="log", every=every, label="distilling"
        )
        for batch in (4, 4, 2):
            for step in range(1, 9):
                progress.step(step, lambda: 3)
            progress.batch_done(batch, 20)
        progress.close()
        return [r.getMessage() for r in caplog.records]

    often = lines(0)
    assert len(often) == 3 * 8 + 2 + 1  # every step, after the first two batches, the end
    assert often[0].startswith("progress: 0/10 generations (0%)")
    assert "(batch 1 at token 1/8)" in often[0] and "ETA" in often[0]
    assert often[-1].startswith("generated 10/10 continuations (60 tokens)")
    rarely = lines(3600)  # none due within the hour: the end line only
    assert len(rarely) == 1 and rarely[0].startswith("generated 10/10 continuations")


LOOPING_ANSWERS = Path(__file__).parent / "fixtures" / "looping_answers.json"


def test_cut_loops_keeps_the_first_occurrences_of_real_loops() -> None:
    """SmolLM2-135M-Instruct's greedy answers: "1, 1, 1, ...", a sentence said over and over,
    "stat stat stat ..." are cut before an 8-gram's third occurrence; an answer that does not
    loop is kept whole."""
    answers = json.loads(LOOPING_ANSWERS.read_text(encoding="utf-8"))["answers"]
    kept = [len(cut_loops(a["ids"], 8, 2)) for a in answers]
    assert kept == [a["kept_8_2"] for a in answers] == [58, 94, 40, 12]
    for answer in answers:
        ids = answer["ids"]
        cut = cut_loops(ids, 8, 2)
        assert ids[: len(cut)] == cut  # a prefix
        grams = [tuple(cut[i : i + 8]) for i in range(len(cut) - 7)]
        assert all(grams.count(g) <= 2 for g in grams)  # no 8-gram a third time
        if len(cut) < len(ids):  # cut at the first position that starts a third occurrence
            loop = tuple(ids[len(cut) : len(cut) + 8])
            started = [tuple(ids[i : i + 8]) for i in range(len(cut))]  # may reach past the cut
            assert started.count(loop) == 2
            assert all(started.count(g) <= 2 for g in started)
        assert cut_loops(ids, 8, 2) == cut  # deterministic
        assert cut_loops(ids, 0, 2) == ids  # 0: off
    looped = answers[2]["ids"]  # "It is used to convert a Python object into a JSON-RPC ..."
    assert (
        len(cut_loops(looped, 8, 1)) < len(cut_loops(looped, 8, 2)) < len(cut_loops(looped, 8, 3))
    )
    assert cut_loops([7] * 5, 8, 1) == [7] * 5  # shorter than the n-gram


def test_samples_add_seeded_sampled_answers_at_their_weight(
    graph_copy: Path, tmp_path: Path
) -> None:
    """--samples 2: each prompt's greedy continuation, then two sampled ones (distinct from each
    other, the same for a seed), counted at --sample-weight."""
    options = small_options(
        graph_copy, generations=6, max_tokens=12, samples=2, sample_temperature=1.0,
        sample_weight=1, weight=3, seed=4, loop_ngram=0,
    )  # fmt: skip
    job = prepare(options)
    generations = list(continuations(job))
    assert [g.sample for g in generations] == [0] * 6 + [1] * 6 + [2] * 6
    main = {g.index: g.continuation_ids for g in generations if g.sample == 0}
    alone = small_options(graph_copy, generations=6, max_tokens=12, seed=4)
    greedy = list(continuations(prepare(alone)))
    assert main == {g.index: g.continuation_ids for g in greedy}  # the main ones: as before
    rounds = [{g.index: g.continuation_ids for g in generations if g.sample == j} for j in (1, 2)]
    assert sorted(rounds[0]) == sorted(rounds[1]) == list(range(6))
    assert all(rounds[0][i] != rounds[1][i] for i in range(6))  # a prompt's samples differ
    again = list(continuations(prepare(options)))
    assert [g.continuation_ids for g in again] == [g.continuation_ids for g in generations]

    before = meta_of(graph_copy)
    result = distill_graph(options)
    after = meta_of(graph_copy)
    assert result.generations == 18
    main_tokens = sum(len(g.continuation_ids) for g in generations if g.sample == 0)
    sampled_tokens = sum(len(g.continuation_ids) for g in generations if g.sample > 0)
    assert result.tokens == main_tokens + sampled_tokens
    for old, new in zip(before.orders, after.orders, strict=True):
        assert new.total_count - old.total_count == 3 * main_tokens + sampled_tokens
    record = after.sources[-1]["distilled"][0]
    assert record["generations"] == 18 and record["weight"] == 3
    assert record["samples"] == {
        "per_prompt": 2,
        "generations": 12,
        "temperature": 1.0,
        "weight": 1,
    }
    assert "loop_cut" not in record
    sampled = generations[-1]
    assert generation_weight(small_options(graph_copy, weight=4), sampled) == 2  # the default
    assert generation_weight(small_options(graph_copy, weight=3), sampled) == 2  # rounded up
    assert generation_weight(small_options(graph_copy, weight=1), sampled) == 1
    assert generation_weight(small_options(graph_copy, weight=4), generations[0]) == 4


def test_no_samples_appends_exactly_the_documents_of_before(
    graph_copy: Path, tmp_path: Path
) -> None:
    """--samples 0 (the default; the loop cut off, as before it existed): the one builder call of
    before, with the same documents and weight, gives the same counts, and the meta records no
    samples."""
    options = small_options(graph_copy, samples=0, weight=2, loop_ngram=0)
    job = prepare(options)
    generations = list(continuations(job))
    assert len(generations) == 24 and all(g.sample == 0 for g in generations)
    reference = tmp_path / "reference"
    shutil.copytree(graph_copy, reference)
    builder = GraphBuilder(
        tokenizer_name=job.meta.tokenizer_name,
        max_order=job.meta.max_order,
        tokenizer=job.loaded.tokenizer,
        progress=False,
    )
    try:
        builder.check_append(reference)
        documents = [(g.prompt_ids + g.continuation_ids, len(g.prompt_ids)) for g in generations]
        builder.build_from_token_documents(iter(documents), source="distill:x", weight=2)
        builder.save(reference, append=True)
    finally:
        builder.close()
    result = distill_graph(options)
    assert meta_of(graph_copy).orders == meta_of(reference).orders
    assert result.tokens == sum(len(g.continuation_ids) for g in generations)
    record = meta_of(graph_copy).sources[-1]["distilled"][0]
    assert "samples" not in record and "loop_cut" not in record


def test_the_loop_cut_is_applied_and_recorded(graph_copy: Path) -> None:
    options = small_options(graph_copy, max_tokens=32, loop_ngram=2, loop_repeats=1)
    generations = list(continuations(prepare(options)))
    kept = [cut_loops(g.continuation_ids, 2, 1) for g in generations]
    cut = sum(len(g.continuation_ids) - len(k) for g, k in zip(generations, kept, strict=True))
    assert cut > 0  # stories260K repeats a bigram within 32 tokens
    before = meta_of(graph_copy)
    result = distill_graph(options)
    assert result.tokens == sum(len(k) for k in kept)
    after = meta_of(graph_copy)
    for old, new in zip(before.orders, after.orders, strict=True):
        assert new.total_count - old.total_count == 4 * result.tokens
    record = after.sources[-1]["distilled"][0]
    answers = sum(len(k) < len(g.continuation_ids) for g, k in zip(generations, kept, strict=True))
    assert record["loop_cut"] == {"ngram": 2, "repeats": 1, "answers": answers, "tokens": cut}


def test_sample_and_loop_options_are_checked(graph_copy: Path) -> None:
    for changes, message in [
        ({"samples": -1}, "--samples must be >= 0"),
        ({"sample_temperature": 0.0}, "--sample-temperature must be"),
        ({"sample_weight": 0}, "--sample-weight must be in 1..255"),
        ({"loop_ngram": -1}, "--loop-cut must be"),
        ({"loop_repeats": 0}, "--loop-cut must be"),
    ]:
        with pytest.raises(OptionsError, match=message):
            small_options(graph_copy, **changes).validate()
    assert loop_cut("8,2") == (8, 2) and loop_cut("8") == (8, 2) and loop_cut("0") == (0, 2)
    for bad in ("x", "8,0", "-1,2"):
        with pytest.raises(argparse.ArgumentTypeError):
            loop_cut(bad)


def test_progress_counts_the_samples(graph_copy: Path, prompts_file: Path) -> None:
    done = cli(
        "distill", "--graph", str(graph_copy), "--model", str(STORIES_MODEL),
        "--prompts", str(prompts_file), "--max-tokens", "8", "--batch-size", "2",
        "--device", "cpu", "--progress-every", "0", "--samples", "2", "--sample-weight", "1",
        "--loop-cut", "8,2",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "progress: " in line]
    assert lines and all("/9 generations" in line and "ETA" in line for line in lines)
    assert "generated 9/9 continuations" in done.stderr
    assert "distilled 9 continuations" in done.stderr and "2 sampled per prompt at weight 1" in (
        done.stderr
    )
    record = meta_of(graph_copy).sources[-1]["distilled"][0]
    assert record["generations"] == 9 and record["samples"]["generations"] == 6
    assert record["loop_cut"]["ngram"] == 8
    line = distilled_line(record)
    assert "9 continuations" in line and "6 of them sampled (2 a prompt at temperature 1.0" in line
    assert "loops cut (8-grams past 2:" in line
