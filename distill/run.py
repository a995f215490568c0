"""The distillation job: prompts -> the target model's continuations -> an append to the graph.

Checked before any generation: the graph is a finished graph, the model loads, and the model's
tokenizer has the graph's fingerprint (a graph's contexts are token ids of one tokenizer).
Continuations are counted as they come (only their n-grams, see
:meth:`~builder.graph_builder.GraphBuilder.build_from_token_documents`) and published at the end
as an append (:mod:`builder.append`: a new version, under the graph's append lock, atomic), so
an interrupted or killed run publishes nothing and the previous graph keeps being served.
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder import GraphBuilder
from builder.append import read_base_meta
from builder.errors import BuildError
from distill import defaults
from distill.generation import (
    Generation,
    generate_continuations,
    model_fingerprint,
    prompt_token_ids,
)
from distill.prompts import (
    PASSAGE_TEMPLATES,
    Prompt,
    corpus_passages,
    corpus_prompts,
    file_prompts,
    graph_corpus,
    write_prompts,
)
from speculant import termination
from speculant.graph_format import GraphMeta

log = logging.getLogger("distill")


CORPUS_PROMPTS = ("auto", "prefixes", "passages")


class OptionsError(BuildError):
    """Options that do not go together, or a value out of range (a usage error: exit 2 from
    ``speculant distill``); found before any work starts."""


@dataclass
class DistillOptions:
    """What to distill into which graph (the ``speculant distill`` flags)."""

    graph: str
    model: str
    corpus: list[str] = field(default_factory=list)  # prompt source: the corpus
    prompts_file: str | None = None  # or: JSON lines with prompt / messages
    doc_separator: str | None = None
    text_field: str = "text"
    # None: one per prompt of prompts_file, else defaults.GENERATIONS
    generations: int | None = None
    weight: int = defaults.WEIGHT  # each continuation n-gram counts this many times
    max_tokens: int = defaults.MAX_TOKENS
    temperature: float = 0.0
    batch_size: int = defaults.BATCH_SIZE
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    chat: bool = False  # send text prompts as a chat user message (the model's chat template)
    # prompts from the corpus: document prefixes (text) or passage prompts (chat); auto:
    # passages when the tokenizer has a chat template (and not chat), else prefixes
    corpus_prompts: str = "auto"
    min_words: int = defaults.MIN_WORDS
    max_words: int = defaults.MAX_WORDS
    passage_min_words: int = defaults.PASSAGE_MIN_WORDS
    passage_max_words: int = defaults.PASSAGE_MAX_WORDS
    passage_templates: tuple[str, ...] = ()  # names of distill.prompts.PASSAGE_TEMPLATES; () all
    save_prompts: str | None = None  # also write the prompts used here (a prompts file)
    hf_token: str | None = None
    download_mode: str = "auto"
    torch_threads: int | None = None  # None: defaults.CPU_THREADS on a CPU, torch's on a GPU
    progress: bool | None = None  # None: a bar on a terminal, else log lines; False: neither
    progress_seconds: float = defaults.PROGRESS_SECONDS  # between two progress log lines

    def validate(self) -> DistillOptions:
        """OptionsError naming the first bad option."""
        unknown = [t for t in self.passage_templates if t not in PASSAGE_TEMPLATES]
        checks = [
            (
                self.generations is None or self.generations >= 1,
                f"--generations must be >= 1, got {self.generations}",
            ),
            (self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}"),
            (
                0 <= self.temperature < float("inf"),
                f"--temperature must be a finite number >= 0, got {self.temperature}",
            ),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.weight >= 1, f"--weight must be >= 1, got {self.weight}"),
            (self.seed >= 0, f"--seed must be >= 0, got {self.seed}"),
            (not (self.corpus and self.prompts_file), "give --corpus or --prompts, not both"),
            (
                self.corpus_prompts in CORPUS_PROMPTS,
                f"--corpus-prompts must be one of {', '.join(CORPUS_PROMPTS)}, got "
                f"{self.corpus_prompts!r}",
            ),
            (
                not (self.prompts_file and self.corpus_prompts != "auto"),
                f"--corpus-prompts {self.corpus_prompts} makes prompts from the corpus: not "
                "with --prompts",
            ),
            (
                1 <= self.passage_min_words <= self.passage_max_words,
                f"--passage-words must be MIN-MAX with 1 <= MIN <= MAX, got "
                f"{self.passage_min_words}-{self.passage_max_words}",
            ),
            (
                not unknown,
                f"unknown passage template {unknown[0] if unknown else ''!r} (known: "
                f"{', '.join(PASSAGE_TEMPLATES)})",
            ),
            (
                self.progress_seconds >= 0,
                f"--progress-every must be >= 0, got {self.progress_seconds}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise OptionsError(message)
        return self


@dataclass
class DistillResult:
    """What a distillation added, and the graph's new meta."""

    meta: GraphMeta
    generations: int
    tokens: int  # continuation tokens counted
    generate_seconds: float  # generating, counting and publishing (the model loaded)
    total_seconds: float  # everything, loading the model included


@dataclass
class Prepared:
    """A checked job: the graph's meta, the loaded model, the prompts as token ids."""

    options: DistillOptions
    graph: Path
    meta: GraphMeta
    loaded: Any  # verifier_service.model.LoadedModel
    prompt_source: dict[str, Any]
    prompt_ids: list[list[int]]


def distill_graph(options: DistillOptions) -> DistillResult:
    """Run the job (see the module docstring); BuildError / ModelLoadError with one line."""
    begun = time.perf_counter()
    job = prepare(options)
    started = time.perf_counter()
    meta, tokens = append_generations(job, continuations(job), job.graph)
    return DistillResult(
        meta,
        len(job.prompt_ids),
        tokens,
        time.perf_counter() - started,
        time.perf_counter() - begun,
    )


def prepare(options: DistillOptions) -> Prepared:
    """Check the options and the graph, check the model's tokenizer against the graph's, draw
    the prompts, then load the model and tokenize them (nothing is generated yet)."""
    from speculant.config import VerifierConfig
    from speculant.tokenizer import load_tokenizer, tokenizer_fingerprint
    from verifier_service.model import LoadedModel

    options.validate()
    records = None
    if options.prompts_file:  # before anything slow: a refusal comes at once
        records = file_prompts(options.prompts_file)
        _check_repeats(options, len(records))
    graph = Path(options.graph).expanduser().absolute()
    meta = read_base_meta(graph)
    tokenizer = load_tokenizer(options.model, options.hf_token)  # before the weights: cheap
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint != meta.tokenizer_fingerprint:
        raise BuildError(
            f"cannot distill {options.model!r} into {graph}: the graph was built with tokenizer "
            f"{meta.tokenizer_name!r} ({meta.tokenizer_fingerprint[:23]}...), the model's "
            f"tokenizer differs ({fingerprint[:23]}...); distill with the model the graph serves"
        )
    chat_template = bool(getattr(tokenizer, "chat_template", None))
    if options.chat and not chat_template:
        raise BuildError(f"--chat: the tokenizer of {options.model!r} has no chat template")
    kind = prompt_kind(options, chat_template)
    if kind == "passages" and not chat_template:
        raise BuildError(
            f"--corpus-prompts passages: the tokenizer of {options.model!r} has no chat template "
            "(passage prompts are chat messages); use --corpus-prompts prefixes"
        )
    prompt_source, prompts = _prompts(options, meta, kind, records)
    if not chat_template and any(p.messages for p in prompts):
        raise BuildError(
            f"{options.prompts_file} has chat messages, but the tokenizer of {options.model!r} "
            "has no chat template to render them with"
        )
    if options.save_prompts:
        write_prompts(options.save_prompts, prompts)
        log.info("wrote the %d prompts to %s", len(prompts), options.save_prompts)
    loaded = LoadedModel.load(
        VerifierConfig(
            model_name=options.model,
            device=options.device,
            dtype=options.dtype,
            hf_token=options.hf_token,
            download_mode=options.download_mode,
            torch_threads=options.torch_threads or _default_threads(options.device),
        )
    )
    if options.torch_threads is None:
        _use_every_core_for_a_large_model(loaded)
    room = loaded.max_context - options.max_tokens
    if room < 1:
        raise BuildError(
            f"--max-tokens {options.max_tokens} leaves no room for a prompt in the model's "
            f"context of {loaded.max_context} tokens"
        )
    prompt_ids = [
        prompt_token_ids(loaded.tokenizer, p, chat=options.chat, max_length=room) for p in prompts
    ]
    return Prepared(options, graph, meta, loaded, prompt_source, prompt_ids)


def prompt_kind(options: DistillOptions, chat_template: bool) -> str:
    """Where the prompts come from: "file" (--prompts), "passages" or "prefixes" (the corpus;
    auto: passages when the model's tokenizer has a chat template, unless --chat asks for
    prefixes sent as a user message)."""
    if options.prompts_file:
        return "file"
    if options.corpus_prompts == "auto":
        return "passages" if chat_template and not options.chat else "prefixes"
    return options.corpus_prompts


def _check_repeats(options: DistillOptions, records: int) -> None:
    """OptionsError when greedy generations would repeat a prompt of the file."""
    wanted = options.generations
    if wanted is not None and wanted > records and options.temperature == 0:
        raise OptionsError(
            f"{wanted:,} generations from the {records:,} prompts of {options.prompts_file} "
            "would repeat prompts at temperature 0, and greedy continuations of a repeated "
            f"prompt are identical (they add only time): ask for at most {records:,} "
            "(--generations; the default with --prompts is one per prompt) or sample distinct "
            "continuations with --temperature > 0"
        )


def append_generations(
    job: Prepared, generations: Iterable[Generation], graph: Path
) -> tuple[GraphMeta, int]:
    """Count the continuations (as they come) and publish them as an append to graph (the
    job's graph, or a copy of it); (the new meta, continuation tokens counted)."""
    options, loaded = job.options, job.loaded
    builder = GraphBuilder(
        tokenizer_name=job.meta.tokenizer_name,
        max_order=job.meta.max_order,
        tokenizer=loaded.tokenizer,
        progress=False,
    )
    try:
        builder.check_append(graph)
        started = time.perf_counter()
        count = 0

        def documents() -> Iterator[tuple[list[int], int]]:
            nonlocal count
            for g in generations:
                termination.check_interrupt()
                count += 1
                yield g.prompt_ids + g.continuation_ids, len(g.prompt_ids)

        builder.build_from_token_documents(
            documents(), source=f"distill:{options.model}", weight=options.weight
        )
        builder.note_distilled(
            {
                "model": options.model,
                "model_fingerprint": model_fingerprint(loaded.model),
                "generations": count,
                "tokens": builder.stats.tokens,
                "weight": options.weight,
                "max_tokens": options.max_tokens,
                "temperature": options.temperature,
                "prompt_source": job.prompt_source,
                "chat": options.chat,
                "seed": options.seed,
                "device": str(loaded.device),
                "seconds": round(time.perf_counter() - started, 3),
            }
        )
        return builder.save(graph, append=True), builder.stats.tokens
    finally:
        builder.close()


def _default_threads(device: str) -> int | None:
    import torch

    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    return defaults.CPU_THREADS if on_cpu else None


def _use_every_core_for_a_large_model(loaded: Any) -> None:
    """On a CPU, a model of LARGE_MODEL_PARAMETERS or more gets every usable core: its batched
    steps are large matrix products that threads share well (a small model's steps are not,
    and spinning threads slow them down; see distill.defaults)."""
    import os

    import torch

    parameters = sum(p.numel() for p in loaded.model.parameters())
    if loaded.device.type != "cpu" or parameters < defaults.LARGE_MODEL_PARAMETERS:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, cores or 1))
    log.info("%s: %.0fM parameters, %d torch threads", loaded.name, parameters / 1e6, cores)


def _prompts(
    options: DistillOptions, meta: GraphMeta, kind: str, records: list[Prompt] | None
) -> tuple[dict[str, Any], list[Prompt]]:
    """(a description of the prompt source for the meta, the prompts)."""
    if kind == "file":
        assert records is not None and options.prompts_file
        count = options.generations or len(records)
        prompts = [records[i % len(records)] for i in range(count)]
        source: dict[str, Any] = {
            "type": "file",
            "prompts_file": str(Path(options.prompts_file).resolve()),
            "records": len(records),
        }
        kinds = Counter(p.kind for p in prompts if p.kind)
        if kinds:
            source["kinds"] = dict(kinds)
        return source, prompts
    count = options.generations or defaults.GENERATIONS
    inputs = list(options.corpus)
    separator, text_field = options.doc_separator, options.text_field
    if not inputs:  # the graph's own corpus, as it was built
        inputs, recorded_separator, text_field = graph_corpus(meta.build_params)
        separator = recorded_separator if separator is None else separator
    corpus = [str(Path(i).resolve()) for i in inputs]
    if kind == "passages":
        prompts = corpus_passages(
            inputs,
            count,
            seed=options.seed,
            doc_separator=separator,
            text_field=text_field,
            min_words=options.passage_min_words,
            max_words=options.passage_max_words,
            templates=options.passage_templates,
        )
        source = {
            "type": "passages",
            "corpus": corpus,
            "doc_separator": separator,
            "passage_words": [options.passage_min_words, options.passage_max_words],
            "templates": dict(Counter(p.kind for p in prompts)),
        }
        return source, prompts
    prompts = corpus_prompts(
        inputs,
        count,
        seed=options.seed,
        doc_separator=separator,
        text_field=text_field,
        min_words=options.min_words,
        max_words=options.max_words,
    )
    source = {
        "type": "prefixes",
        "corpus": corpus,
        "doc_separator": separator,
        "prefix_words": [options.min_words, options.max_words],
    }
    return source, prompts


def continuations(job: Prepared) -> Iterator[Generation]:
    """The model's continuations of the job's prompts, in batch order (see distill.generation),
    with their progress (generations/s, tokens/s, ETA): a bar on a terminal, else a log line
    every progress_seconds and at the end."""
    options, loaded, prompt_ids = job.options, job.loaded, job.prompt_ids
    terminal = sys.stderr.isatty()
    mode = {None: "bar" if terminal else "log", True: "bar", False: "off"}[options.progress]
    progress = Progress(
        total=len(prompt_ids),
        batch_size=options.batch_size,
        max_tokens=options.max_tokens,
        mode=mode,
        every=options.progress_seconds,
        label=f"distilling ({loaded.device})",
    )
    log.info(
        "distilling %d prompts (%s) on %s: batches of up to %d (within a %d MiB KV cache), up to "
        "%d tokens each, temperature %g",
        len(prompt_ids),
        job.prompt_source.get("type", "?"),
        loaded.device,
        options.batch_size,
        defaults.KV_CACHE_BUDGET_BYTES >> 20,
        options.max_tokens,
        options.temperature,
    )
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = loaded.eos_token_ids[0] if loaded.eos_token_ids else 0
    try:
        yield from generate_continuations(
            loaded.model,
            prompt_ids,
            max_tokens=options.max_tokens,
            temperature=options.temperature,
            batch_size=options.batch_size,
            eos_token_ids=loaded.eos_token_ids,
            pad_token_id=int(pad),
            seed=options.seed,
            on_batch=progress.batch_done,
            on_step=progress.step if mode == "log" else None,
        )
    finally:
        progress.close()


class Progress:
    """The progress of a distillation: generations and tokens done, their rates and an ETA;
    shown as a tqdm bar (mode "bar"), or logged (mode "log": a line when `every` seconds have
    passed since the last one, checked at each decoding step, and one at the end), or not
    ("off": the end line only)."""

    def __init__(
        self, *, total: int, batch_size: int, max_tokens: int, mode: str, every: float, label: str
    ) -> None:
        from tqdm import tqdm

        self.total, self.batch_size, self.max_tokens = total, batch_size, max_tokens
        self.last_rows = 0  # rows of the last batch (batches shrink for long prompts)
        self.mode, self.every = mode, every
        self.begun = self.last_line = time.perf_counter()
        self.done = self.tokens = self.batches_done = 0
        self.bar = tqdm(
            total=total,
            desc=label,
            unit="gen",
            file=sys.stderr,
            disable=mode != "bar",
            dynamic_ncols=True,
        )

    def batch_done(self, generations: int, tokens: int) -> None:
        self.done += generations
        self.tokens += tokens
        self.batches_done += 1
        self.last_rows = generations
        elapsed = max(time.perf_counter() - self.begun, 1e-9)
        self.bar.update(generations)
        self.bar.set_postfix_str(
            f"{self.done / elapsed:,.1f} gen/s, {self.tokens / elapsed:,.0f} tokens/s",
            refresh=False,
        )
        if self.mode == "log" and self.done < self.total and self._due():
            log.info("%s", self.line())

    def step(self, step: int, batch_tokens: Callable[[], int]) -> None:
        """A decoding step of the batch in progress: `step` tokens generated per row so far;
        batch_tokens() counts those kept (up to each row's EOS)."""
        if self._due():
            log.info("%s", self.line(step, batch_tokens()))

    def _due(self) -> bool:
        now = time.perf_counter()
        if now - self.last_line < self.every:
            return False
        self.last_line = now
        return True

    def line(self, step: int = 0, batch_tokens: int = 0) -> str:
        """generations done / total, rates, elapsed time and ETA (with the batch in progress
        at its step-th token)."""
        elapsed = max(time.perf_counter() - self.begun, 1e-9)
        rows = min(self.total - self.done, self.last_rows or self.batch_size)  # in progress
        equivalent = self.done + rows * min(step / self.max_tokens, 1.0)
        rate = equivalent / elapsed
        eta = (self.total - equivalent) / rate if rate > 0 else None
        text = (
            f"progress: {self.done:,}/{self.total:,} generations "
            f"({100 * self.done / max(self.total, 1):.0f}%), {self.done / elapsed:,.1f} gen/s, "
            f"{(self.tokens + batch_tokens) / elapsed:,.0f} tokens/s, {duration(elapsed)} "
            f"elapsed, ETA {duration(eta) if eta is not None else '?'}"
        )
        if step:
            text += f" (batch {self.batches_done + 1} at token {step}/{self.max_tokens})"
        return text

    def close(self) -> None:
        self.bar.close()
        elapsed = max(time.perf_counter() - self.begun, 1e-9)
        log.info(
            "generated %s/%s continuations (%s tokens) in %.1f s: %.1f gen/s, %s tokens/s",
            f"{self.done:,}",
            f"{self.total:,}",
            f"{self.tokens:,}",
            elapsed,
            self.done / elapsed,
            f"{self.tokens / elapsed:,.0f}",
        )


def duration(seconds: float) -> str:
    """A duration for a log line: "42 s", "3m05s", "2h07m"."""
    seconds = max(round(seconds), 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
