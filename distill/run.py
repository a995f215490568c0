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
from collections.abc import Iterable, Iterator
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
from distill.prompts import Prompt, corpus_prompts, file_prompts, graph_corpus
from speculant import termination
from speculant.graph_format import GraphMeta

log = logging.getLogger("distill")


@dataclass
class DistillOptions:
    """What to distill into which graph (the ``speculant distill`` flags)."""

    graph: str
    model: str
    corpus: list[str] = field(default_factory=list)  # prompt source: document prefixes
    prompts_file: str | None = None  # or: JSON lines with prompt / messages
    doc_separator: str | None = None
    text_field: str = "text"
    generations: int = defaults.GENERATIONS
    weight: int = defaults.WEIGHT  # each continuation n-gram counts this many times
    max_tokens: int = defaults.MAX_TOKENS
    temperature: float = 0.0
    batch_size: int = defaults.BATCH_SIZE
    device: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    chat: bool = False  # send text prompts as a chat user message (the model's chat template)
    min_words: int = defaults.MIN_WORDS
    max_words: int = defaults.MAX_WORDS
    hf_token: str | None = None
    download_mode: str = "auto"
    torch_threads: int | None = None  # None: defaults.CPU_THREADS on a CPU, torch's on a GPU
    progress: bool | None = None  # None: when stderr is a terminal

    def validate(self) -> DistillOptions:
        """BuildError naming the first bad option."""
        checks = [
            (self.generations >= 1, f"--generations must be >= 1, got {self.generations}"),
            (self.max_tokens >= 1, f"--max-tokens must be >= 1, got {self.max_tokens}"),
            (
                0 <= self.temperature < float("inf"),
                f"--temperature must be a finite number >= 0, got {self.temperature}",
            ),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (self.weight >= 1, f"--weight must be >= 1, got {self.weight}"),
            (self.seed >= 0, f"--seed must be >= 0, got {self.seed}"),
            (not (self.corpus and self.prompts_file), "give --corpus or --prompts, not both"),
        ]
        for ok, message in checks:
            if not ok:
                raise BuildError(message)
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
    """Check the options and the graph, load the model, check its tokenizer against the
    graph's, and draw the prompts (nothing is generated yet)."""
    from speculant.config import VerifierConfig
    from speculant.tokenizer import load_tokenizer, tokenizer_fingerprint
    from verifier_service.model import LoadedModel

    options.validate()
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
    if options.chat and not getattr(loaded.tokenizer, "chat_template", None):
        raise BuildError(f"--chat: the tokenizer of {options.model!r} has no chat template")
    prompt_source, prompts = _prompts(options, meta)
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


def _prompts(options: DistillOptions, meta: GraphMeta) -> tuple[dict[str, Any], list[Prompt]]:
    """(a description of the prompt source for the meta, the prompts)."""
    if options.prompts_file:
        prompts = file_prompts(options.prompts_file, options.generations)
        return {"prompts_file": str(Path(options.prompts_file).resolve())}, prompts
    inputs = list(options.corpus)
    separator, text_field = options.doc_separator, options.text_field
    if not inputs:  # the graph's own corpus, as it was built
        inputs, recorded_separator, text_field = graph_corpus(meta.build_params)
        separator = recorded_separator if separator is None else separator
    prompts = corpus_prompts(
        inputs,
        options.generations,
        seed=options.seed,
        doc_separator=separator,
        text_field=text_field,
        min_words=options.min_words,
        max_words=options.max_words,
    )
    source = {
        "corpus": [str(Path(i).resolve()) for i in inputs],
        "doc_separator": separator,
        "prefix_words": [options.min_words, options.max_words],
    }
    return source, prompts


def continuations(job: Prepared) -> Iterator[Generation]:
    """The model's continuations of the job's prompts, with a progress bar (generations/s and
    tokens/s), in batch order (see distill.generation)."""
    from tqdm import tqdm

    options, loaded, prompt_ids = job.options, job.loaded, job.prompt_ids
    progress = sys.stderr.isatty() if options.progress is None else options.progress
    bar = tqdm(
        total=len(prompt_ids),
        desc=f"distilling ({loaded.device})",
        unit="gen",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    begun = time.perf_counter()
    tokens = done = 0

    def on_batch(generations: int, batch_tokens: int) -> None:
        nonlocal tokens, done
        tokens += batch_tokens
        done += generations
        bar.update(generations)
        elapsed = max(time.perf_counter() - begun, 1e-9)
        bar.set_postfix_str(
            f"{done / elapsed:,.1f} gen/s, {tokens / elapsed:,.0f} tokens/s", refresh=False
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
            on_batch=on_batch,
        )
    finally:
        bar.close()
        log.info(
            "generated %d continuations (%d tokens) in %.1f s",
            done,
            tokens,
            time.perf_counter() - begun,
        )
