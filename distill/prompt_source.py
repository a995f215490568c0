"""Which prompts a distillation sends: their *kind* (a prompts file, corpus passages or corpus
document prefixes, see :mod:`distill.prompts`), the prompts themselves, and the description of
their source that the graph's meta records."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from distill import defaults
from distill.options import DistillOptions
from distill.prompts import Prompt, corpus_passages, corpus_prompts, graph_corpus
from speculant.graph_format import GraphMeta


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
