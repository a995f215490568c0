"""The ``speculant distill`` command (``speculant tune`` is :mod:`distill.tune`, ``speculant bench
distill`` is in :mod:`bench.cli`).

- ``speculant distill --graph G --model M [--corpus PATH... | --prompts FILE.jsonl]
  [--doc-separator S] [--text-field F] [--corpus-prompts auto|prefixes|passages]
  [--passage-words MIN-MAX] [--passage-templates NAME,...] [--save-prompts FILE.jsonl]
  [--generations N] [--max-tokens T] [--temperature T] [--samples N] [--sample-temperature T]
  [--batch-size B] [--weight W] [--sample-weight W] [--loop-cut N,K]
  [--device cpu|cuda|auto] [--seed S] [--chat] [--constraints on|off] [--progress-every S]
  [--quiet]``

Errors print one line to stderr (``speculant distill: error: ...``, see speculant.cli_errors)
and exit with status 1, or 2 for flags that do not go together (argparse's own errors, and
e.g. more greedy generations than a prompts file has prompts); nothing is published then, nor
on Ctrl-C (exit 130).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from builder.cli import parse_escapes
from distill import defaults
from speculant.cli_errors import fail, usage_error

TEMPLATE_NAMES = tuple(defaults.PASSAGE_TEMPLATES)


def _bounded(convert: Callable[[str], Any], low: float, *, above: bool, name: str) -> Callable:
    """An argparse type: convert(text), which must be finite and > low (above) or >= low; its
    error names the bound (argparse names `name` when convert itself fails)."""
    sign = ">" if above else ">="
    kind = "a finite number " if convert is float else ""

    def parse(text: str) -> Any:
        value = convert(text)
        if not ((value > low if above else value >= low) and value < float("inf")):
            raise argparse.ArgumentTypeError(f"must be {kind}{sign} {low:g}, got {text}")
        return value

    parse.__name__ = name
    return parse


positive = _bounded(int, 1, above=False, name="positive")
_non_negative_float = _bounded(float, 0, above=False, name="non-negative number")
_non_negative_int = _bounded(int, 0, above=False, name="non-negative integer")
_positive_float = _bounded(float, 0, above=True, name="positive number")


def loop_cut(text: str) -> tuple[int, int]:
    """N,K: cut a continuation before an N-token n-gram occurs for the K+1-th time (N 0: off;
    N alone: K 2)."""
    ngram, _, repeats = text.partition(",")
    try:
        values = (int(ngram), int(repeats or 2))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"N,K, e.g. 8,2 (or 0: off), got {text!r}") from exc
    if values[0] < 0 or values[1] < 1:
        raise argparse.ArgumentTypeError(f"need N >= 0 and K >= 1, got {text!r}")
    return values


def word_range(text: str) -> tuple[int, int]:
    """MIN-MAX (or N: exactly N) words, 1 <= MIN <= MAX."""
    low, _, high = text.partition("-")
    try:
        values = (int(low), int(high or low))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"MIN-MAX words, e.g. 40-120, got {text!r}") from exc
    if not 1 <= values[0] <= values[1]:
        raise argparse.ArgumentTypeError(f"need 1 <= MIN <= MAX, got {text!r}")
    return values


def template_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of passage template names."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in TEMPLATE_NAMES]
    if not names or unknown:
        raise argparse.ArgumentTypeError(f"names among {','.join(TEMPLATE_NAMES)}, got {text!r}")
    return names


def budgets(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"a comma-separated list of integers: {text}") from exc
    if not values or values[0] < 0:
        raise argparse.ArgumentTypeError(f"budgets must be integers >= 0, got {text}")
    return values


def add_source_args(p: argparse.ArgumentParser) -> None:
    """The model, the prompt source and the generation flags (distill and bench distill)."""
    p.add_argument("--graph", required=True, metavar="GRAPH_DIR", help="the graph to distill into")
    p.add_argument(
        "--model",
        required=True,
        metavar="NAME_OR_DIR",
        help="the target model (hub name or folder)",
    )
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--corpus",
        nargs="+",
        default=[],
        metavar="PATH",
        help="prompts are drawn from these documents (files, directories, globs; default: the "
        "graph's own corpus, where it is readable): see --corpus-prompts",
    )
    source.add_argument(
        "--prompts",
        default=None,
        metavar="FILE.jsonl",
        help="prompts: JSON lines, prompt or messages (one generation each by default)",
    )
    p.add_argument(
        "--doc-separator",
        type=parse_escapes,
        default=None,
        metavar="S",
        help="split plain-text corpus files into documents at S (e.g. '\\n\\n\\n'; default: "
        "the graph's, for its own corpus)",
    )
    p.add_argument("--text-field", default="text", metavar="F", help="JSON-lines text field")
    p.add_argument(
        "--corpus-prompts",
        choices=["auto", "prefixes", "passages"],
        default="auto",
        help="prompts from the corpus: document prefixes, continued as text (or with --chat "
        "sent as a user message), or passages: a corpus passage with an instruction (explain "
        "it, summarize it, ...) as a chat user message; auto (default): passages when the "
        "model's tokenizer has a chat template and --chat is not given, else prefixes",
    )
    p.add_argument(
        "--passage-words",
        type=word_range,
        default=(defaults.PASSAGE_MIN_WORDS, defaults.PASSAGE_MAX_WORDS),
        metavar="MIN-MAX",
        help="words of corpus text in a passage prompt (default "
        f"{defaults.PASSAGE_MIN_WORDS}-{defaults.PASSAGE_MAX_WORDS})",
    )
    p.add_argument(
        "--passage-templates",
        type=template_names,
        default=(),
        metavar="NAME,...",
        help="the instructions of passage prompts, in turn (default all: "
        f"{','.join(TEMPLATE_NAMES)}; see distill/defaults.py)",
    )
    p.add_argument(
        "--save-prompts",
        default=None,
        metavar="FILE.jsonl",
        help="also write the prompts drawn to FILE (a prompts file, each with its kind), before "
        "generating",
    )
    _add_count(p, "--max-tokens", "T", defaults.MAX_TOKENS, "tokens per continuation")
    p.add_argument(
        "--temperature",
        type=_non_negative_float,
        default=0.0,
        metavar="T",
        help="0 = greedy (default); > 0 samples, e.g. at the temperature you serve",
    )
    p.add_argument(
        "--samples",
        type=_non_negative_int,
        default=defaults.SAMPLES,
        metavar="N",
        help="also generate N sampled continuations of each prompt (at --sample-temperature, "
        "seeded by --seed), appended like the main one, at --sample-weight (default "
        f"{defaults.SAMPLES}: the main one only)",
    )
    p.add_argument(
        "--sample-temperature",
        type=_positive_float,
        default=defaults.SAMPLE_TEMPERATURE,
        metavar="T",
        help=f"of the --samples continuations (default {defaults.SAMPLE_TEMPERATURE:g})",
    )
    _add_count(p, "--batch-size", "B", defaults.BATCH_SIZE, "continuations generated together")
    _add_count(p, "--weight", "W", defaults.WEIGHT, "each continuation n-gram counts W times")
    p.add_argument(
        "--sample-weight",
        type=positive,
        default=None,
        metavar="W",
        help="each n-gram of a sampled continuation (--samples) counts W times (default: half "
        "of --weight, rounded up)",
    )
    p.add_argument(
        "--loop-cut",
        type=loop_cut,
        default=(defaults.LOOP_NGRAM, defaults.LOOP_REPEATS),
        metavar="N,K",
        help="cut a continuation where it loops: before an N-token n-gram occurs for the "
        "K+1-th time (its first K kept); N 0 = off (default "
        f"{defaults.LOOP_NGRAM},{defaults.LOOP_REPEATS}"
        f"{'' if defaults.LOOP_NGRAM else ': off'})",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="default auto")
    p.add_argument(
        "--dtype",
        choices=["auto", "float32", "bfloat16", "float16"],
        default="auto",
        help="default auto",
    )
    p.add_argument(
        "--torch-threads",
        type=positive,
        default=None,
        metavar="N",
        help="torch threads (default on a CPU: every usable core for a model of 50M parameters "
        "or more, else 1; torch's own on a GPU)",
    )
    p.add_argument(
        "--seed", type=int, default=0, metavar="S", help="prompts and sampling (default 0)"
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="send each prompt as a chat user message (the model's chat template)",
    )
    on_off = "on" if defaults.CONSTRAINTS else "off"
    p.add_argument(
        "--constraints",
        choices=["on", "off"],
        default=on_off,
        help="--prompts records with response_format or tools: generate their continuations "
        f"under that constraint (on) or as free text (off; default {on_off})",
    )
    p.add_argument("--hf-token", default=None, help="for gated or private hub models (or HF_TOKEN)")
    p.add_argument(
        "--download-mode", choices=["auto", "offline", "force"], default="auto", help="default auto"
    )


def _add_count(
    p: argparse.ArgumentParser, flag: str, metavar: str, default: int, what: str
) -> None:
    """A flag taking a count >= 1, its default in its help."""
    p.add_argument(
        flag, type=positive, default=default, metavar=metavar, help=f"{what} (default {default})"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``distill`` and ``bench distill``."""
    p = subparsers.add_parser(
        "distill",
        help="add the target model's continuations of corpus prompts to a graph",
        description="Let the target model continue prompts (corpus document prefixes, or a "
        "prompts file), batched, and append the continuations to the graph as a new version "
        "(atomic; running draft services reload it). Drafts then predict the model, not only "
        "its corpus.",
    )
    add_source_args(p)
    p.add_argument(
        "--generations",
        type=positive,
        default=None,
        metavar="N",
        help="continuations to generate (default: one per prompt with --prompts, else "
        f"{defaults.GENERATIONS}); more than the prompts file has needs --temperature > 0 "
        "(greedy repeats are identical)",
    )
    p.add_argument(
        "--progress-every",
        type=_non_negative_float,
        default=defaults.PROGRESS_SECONDS,
        metavar="S",
        help="when stderr is not a terminal, log a progress line every S seconds (default "
        f"{defaults.PROGRESS_SECONDS:g}); on a terminal a progress bar shows instead",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines")
    p.set_defaults(handler=run_distill)


def options_from_args(args: argparse.Namespace, generations: int | None):
    """The job's options from add_source_args's flags; generations None: the default (one per
    prompt of --prompts, else defaults.GENERATIONS)."""
    from distill.options import DistillOptions

    passage_words = args.passage_words
    return DistillOptions(
        graph=args.graph,
        model=args.model,
        corpus=list(args.corpus),
        prompts_file=args.prompts,
        doc_separator=args.doc_separator,
        text_field=args.text_field,
        generations=generations,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        samples=args.samples,
        sample_temperature=args.sample_temperature,
        sample_weight=args.sample_weight,
        loop_ngram=args.loop_cut[0],
        loop_repeats=args.loop_cut[1],
        batch_size=args.batch_size,
        weight=args.weight,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        chat=args.chat,
        corpus_prompts=args.corpus_prompts,
        passage_min_words=passage_words[0],
        passage_max_words=passage_words[1],
        passage_templates=tuple(args.passage_templates),
        save_prompts=args.save_prompts,
        hf_token=args.hf_token,
        download_mode=args.download_mode,
        torch_threads=args.torch_threads,
        progress=False if getattr(args, "quiet", False) else None,
        progress_seconds=getattr(args, "progress_every", defaults.PROGRESS_SECONDS),
        constraints=args.constraints == "on",
    )


def distill_errors() -> tuple[type[BaseException], ...]:
    from builder.errors import BuildError
    from speculant.errors import FailedPreconditionError
    from speculant.graph_format import GraphFormatError

    return (BuildError, GraphFormatError, FailedPreconditionError, OSError)


def run_distill(args: argparse.Namespace) -> int:
    import logging

    from speculant import termination

    termination.catch_interrupt()  # Ctrl-C stops it between two generations, never lost
    if args.quiet:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # "Loading weights" bars
        for name in ("builder", "distill", "verifier_service"):
            logging.getLogger(name).setLevel(logging.WARNING)
    from distill.options import OptionsError
    from distill.run import distill_graph, sample_weight_default

    try:
        result = distill_graph(options_from_args(args, args.generations))
    except OptionsError as exc:
        return usage_error(exc)
    except distill_errors() as exc:
        return fail(exc)
    if not args.quiet:
        meta = result.meta
        weights = f"weight {args.weight}"
        if args.samples:
            weights += (
                f"; {args.samples} sampled per prompt at weight "
                f"{args.sample_weight or sample_weight_default(args.weight)}"
            )
        print(
            f"distilled {result.generations:,} continuations ({result.tokens:,} tokens, "
            f"{weights}) of {args.model} into {args.graph}: version {meta.version}, "
            f"{result.generate_seconds:.1f} s generating and counting, "
            f"{result.total_seconds:.1f} s in all",
            file=sys.stderr,
        )
    return 0
