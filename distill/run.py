"""The distillation job: prompts -> the target model's continuations -> an append to the graph.

Checked before any generation: the graph is a finished graph, the model loads, and the model's
tokenizer has the graph's fingerprint (a graph's contexts are token ids of one tokenizer).
Continuations are counted as they come (only their n-grams, see
:meth:`~builder.graph_builder.GraphBuilder.build_from_token_documents`) and published at the end
as an append (:mod:`builder.append`: a new version, under the graph's append lock, atomic), so
an interrupted or killed run publishes nothing and the previous graph keeps being served.

Which prompts a job sends: their *kind* (a prompts file, corpus passages or corpus document
prefixes, see :mod:`distill.prompts`, :func:`prompt_kind`), the prompts themselves and the
description of their source that the graph's meta records (:func:`draw_prompts`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Any

from builder import GraphBuilder
from builder.append import read_base_meta
from builder.errors import BuildError
from distill import defaults
from distill.generation import (
    Generation,
    check_constraints,
    cut_loops,
    generate_continuations,
    model_fingerprint,
    prompt_token_ids,
    sample_seed,
)
from distill.options import DistillOptions, check_repeats
from distill.progress import Progress
from distill.prompts import (
    Prompt,
    corpus_passages,
    corpus_prompts,
    file_prompts,
    graph_corpus,
    write_prompts,
)
from speculant import termination
from speculant.constraint import Constraint
from speculant.graph_format import GraphMeta

log = logging.getLogger("distill")


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
    # per prompt: what its continuation is generated under (None: free; all None with
    # options.constraints off)
    constraints: list[Constraint | None] = field(default_factory=list)


def distill_graph(options: DistillOptions) -> DistillResult:
    """Run the job (see the module docstring); BuildError / ModelLoadError with one line."""
    begun = time.perf_counter()
    job = prepare(options)
    started = time.perf_counter()
    meta, tokens = append_generations(job, continuations(job), job.graph)
    return DistillResult(
        meta,
        len(job.prompt_ids) * (1 + options.samples),
        tokens,
        time.perf_counter() - started,
        time.perf_counter() - begun,
    )


def prepare(options: DistillOptions) -> Prepared:
    """Check the options and the graph, check the model's tokenizer against the graph's, draw
    the prompts, then load the model and tokenize them (nothing is generated yet)."""
    options.validate()
    records = None
    if options.prompts_file:  # before anything slow: a refusal comes at once
        records = file_prompts(options.prompts_file)
        check_repeats(options, len(records))
    graph = Path(options.graph).expanduser().absolute()
    meta = read_base_meta(graph)
    chat_template = _check_tokenizer(options, graph, meta)
    prompt_source, prompts = _checked_prompts(options, meta, chat_template, records)
    if options.save_prompts:
        write_prompts(options.save_prompts, prompts)
        log.info("wrote the %d prompts to %s", len(prompts), options.save_prompts)
    loaded = _load_model(options)
    room = loaded.max_context - options.max_tokens
    if room < 1:
        raise BuildError(
            f"--max-tokens {options.max_tokens} leaves no room for a prompt in the model's "
            f"context of {loaded.max_context} tokens"
        )
    prompt_ids = [
        prompt_token_ids(loaded.tokenizer, p, chat=options.chat, max_length=room) for p in prompts
    ]
    constraints = [p.constraint() if options.constraints else None for p in prompts]
    if any(c is not None for c in constraints):
        check_constraints(_grammars(loaded), constraints)
    return Prepared(options, graph, meta, loaded, prompt_source, prompt_ids, constraints)


def _grammars(loaded: Any) -> Any:
    """The compiled constraints of the model's tokenizer (speculant.grammar.Grammars)."""
    from speculant.grammar import grammars_for

    return grammars_for(loaded.tokenizer, loaded.vocab_size, loaded.eos_token_ids)


def _check_tokenizer(options: DistillOptions, graph: Path, meta: GraphMeta) -> bool:
    """BuildError unless the model's tokenizer is the graph's (checked before the weights load:
    cheap) and has a chat template where --chat needs one; whether it has one."""
    from speculant.tokenizer import load_tokenizer, tokenizer_fingerprint

    tokenizer = load_tokenizer(options.model, options.hf_token)
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
    return chat_template


def _checked_prompts(
    options: DistillOptions, meta: GraphMeta, chat_template: bool, records: list[Prompt] | None
) -> tuple[dict[str, Any], list[Prompt]]:
    """draw_prompts, once the model's tokenizer can render them (BuildError if not)."""
    kind = prompt_kind(options, chat_template)
    if kind == "passages" and not chat_template:
        raise BuildError(
            f"--corpus-prompts passages: the tokenizer of {options.model!r} has no chat template "
            "(passage prompts are chat messages); use --corpus-prompts prefixes"
        )
    prompt_source, prompts = draw_prompts(options, meta, kind, records)
    if not chat_template and any(p.messages for p in prompts):
        raise BuildError(
            f"{options.prompts_file} has chat messages, but the tokenizer of {options.model!r} "
            "has no chat template to render them with"
        )
    return prompt_source, prompts


def _load_model(options: DistillOptions) -> Any:
    """The target model (a verifier_service.model.LoadedModel) with its torch threads."""
    from speculant.config import VerifierConfig
    from verifier_service.model import LoadedModel

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
    return loaded


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
        count = sampled = cut_answers = cut_tokens = 0
        ngram, repeats = loop_cut(options)

        def documents(run: Iterable[Generation]) -> Iterator[tuple[list[int], int]]:
            nonlocal count, sampled, cut_answers, cut_tokens
            for g in run:
                termination.check_interrupt()
                count += 1
                sampled += g.sample > 0
                kept = cut_loops(g.continuation_ids, ngram, repeats)
                cut_answers += len(kept) < len(g.continuation_ids)
                cut_tokens += len(g.continuation_ids) - len(kept)
                yield g.prompt_ids + kept, len(g.prompt_ids)

        # one count per run of generations of one weight (the main ones, then the samples)
        runs = groupby(generations, key=lambda g: generation_weight(options, g))
        for weight, run in runs:
            builder.build_from_token_documents(
                documents(run), source=f"distill:{options.model}", weight=weight
            )
        if not count:  # nothing generated: an append of nothing, as before
            builder.build_from_token_documents(
                iter(()), source=f"distill:{options.model}", weight=options.weight
            )
        extra: dict[str, Any] = {}
        if getattr(options, "samples", 0):
            extra["samples"] = {
                "per_prompt": options.samples,
                "generations": sampled,
                "temperature": options.sample_temperature,
                "weight": generation_weight(options, Generation(0, [], [], 1)),
            }
        if ngram and repeats:
            extra["loop_cut"] = {
                "ngram": ngram,
                "repeats": repeats,
                "answers": cut_answers,
                "tokens": cut_tokens,
            }
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
                "constrained_prompts": sum(c is not None for c in job.constraints),
                "chat": options.chat,
                "seed": options.seed,
                "device": str(loaded.device),
                "seconds": round(time.perf_counter() - started, 3),
            }
            | extra
        )
        return builder.save(graph, append=True), builder.stats.tokens
    finally:
        builder.close()


def generation_weight(options: Any, generation: Generation) -> int:
    """The weight a generation's n-grams count with: --weight for a prompt's main continuation,
    --sample-weight for its sampled ones (default: half of --weight, rounded up; measured in
    docs/learning.md, "More answers per prompt")."""
    if not generation.sample:
        return options.weight
    chosen = getattr(options, "sample_weight", None)
    return chosen if chosen is not None else sample_weight_default(options.weight)


def sample_weight_default(weight: int) -> int:
    """The weight of sampled continuations without --sample-weight: half of weight, rounded up."""
    return max(1, -(-int(weight) // 2))


def loop_cut(options: Any) -> tuple[int, int]:
    """(n-gram, repeats) of the loop cut (distill.generation.cut_loops; n-gram 0: off)."""
    return getattr(options, "loop_ngram", 0), getattr(options, "loop_repeats", 0)


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


def continuations(job: Prepared) -> Iterator[Generation]:
    """The model's continuations of the job's prompts, in batch order (see distill.generation):
    the main ones (at --temperature), then --samples rounds of sampled ones (round j: each
    prompt's j-th sample at --sample-temperature, seeded by sample_seed), with their progress
    (generations/s, tokens/s, ETA, the samples counted): a bar on a terminal, else a log line
    every progress_seconds and at the end."""
    options, loaded, prompt_ids = job.options, job.loaded, job.prompt_ids
    terminal = sys.stderr.isatty()
    mode = {None: "bar" if terminal else "log", True: "bar", False: "off"}[options.progress]
    progress = Progress(
        total=len(prompt_ids) * (1 + options.samples),
        batch_size=options.batch_size,
        max_tokens=options.max_tokens,
        mode=mode,
        every=options.progress_seconds,
        label=f"distilling ({loaded.device})",
    )
    log.info(
        "distilling %d prompts (%s) on %s: batches of up to %d (within a %d MiB KV cache), up to "
        "%d tokens each, temperature %g%s",
        len(prompt_ids),
        job.prompt_source.get("type", "?"),
        loaded.device,
        options.batch_size,
        defaults.KV_CACHE_BUDGET_BYTES >> 20,
        options.max_tokens,
        options.temperature,
        f", and {options.samples} sampled per prompt at temperature {options.sample_temperature:g}"
        if options.samples
        else "",
    )
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = loaded.eos_token_ids[0] if loaded.eos_token_ids else 0
    grammars = _grammars(loaded) if any(job.constraints) else None
    try:
        for sample in range(1 + options.samples):
            yield from generate_continuations(
                loaded.model,
                prompt_ids,
                max_tokens=options.max_tokens,
                temperature=options.sample_temperature if sample else options.temperature,
                batch_size=options.batch_size,
                eos_token_ids=loaded.eos_token_ids,
                pad_token_id=int(pad),
                seed=sample_seed(options.seed, sample, len(prompt_ids)),
                on_batch=progress.batch_done,
                on_step=progress.step if mode == "log" else None,
                constraints=job.constraints,
                grammars=grammars,
                sample=sample,
            )
    finally:
        progress.close()


# -- which prompts a job sends --


def prompt_kind(options: DistillOptions, chat_template: bool) -> str:
    """Where the prompts come from: "file" (--prompts), "passages" or "prefixes" (the corpus;
    auto: passages when the model's tokenizer has a chat template, unless --chat asks for
    prefixes sent as a user message)."""
    if options.prompts_file:
        return "file"
    if options.corpus_prompts == "auto":
        return "passages" if chat_template and not options.chat else "prefixes"
    return options.corpus_prompts


def draw_prompts(
    options: DistillOptions, meta: GraphMeta, kind: str, records: list[Prompt] | None
) -> tuple[dict[str, Any], list[Prompt]]:
    """(a description of the prompt source for the meta, the prompts) of a kind (see
    prompt_kind); records: the prompts file's, for kind "file"."""
    if kind == "file":
        assert records is not None and options.prompts_file
        return _file_prompts(options, options.prompts_file, records)
    return _corpus_prompts(options, meta, kind)


def _file_prompts(
    options: DistillOptions, prompts_file: str, records: list[Prompt]
) -> tuple[dict[str, Any], list[Prompt]]:
    """The prompts file's records, cycled to --generations (default: each once)."""
    count = options.generations or len(records)
    prompts = [records[i % len(records)] for i in range(count)]
    source: dict[str, Any] = {
        "type": "file",
        "prompts_file": str(Path(prompts_file).resolve()),
        "records": len(records),
    }
    kinds = Counter(p.kind for p in prompts if p.kind)
    if kinds:
        source["kinds"] = dict(kinds)
    return source, prompts


def _corpus_prompts(
    options: DistillOptions, meta: GraphMeta, kind: str
) -> tuple[dict[str, Any], list[Prompt]]:
    """Passages or document prefixes drawn from --corpus, else from the graph's own corpus."""
    count = options.generations or defaults.GENERATIONS
    inputs = list(options.corpus)
    separator, text_field = options.doc_separator, options.text_field
    if not inputs:  # the graph's own corpus, as it was built
        inputs, recorded_separator, text_field = graph_corpus(meta.build_params)
        separator = recorded_separator if separator is None else separator
    source: dict[str, Any] = {
        "type": kind,
        "corpus": [str(Path(i).resolve()) for i in inputs],
        "doc_separator": separator,
    }
    drawing: dict[str, Any] = {
        "seed": options.seed,
        "doc_separator": separator,
        "text_field": text_field,
    }
    if kind == "passages":
        words = [options.passage_min_words, options.passage_max_words]
        prompts = corpus_passages(
            inputs,
            count,
            min_words=words[0],
            max_words=words[1],
            templates=options.passage_templates,
            **drawing,
        )
        source["passage_words"] = words
        source["templates"] = dict(Counter(p.kind for p in prompts))
        return source, prompts
    words = [options.min_words, options.max_words]
    prompts = corpus_prompts(inputs, count, min_words=words[0], max_words=words[1], **drawing)
    source["prefix_words"] = words
    return source, prompts
