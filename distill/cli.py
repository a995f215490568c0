"""The ``speculant distill`` command (``speculant bench distill`` is in :mod:`bench.cli`).

- ``speculant distill --graph G --model M [--corpus PATH... | --prompts FILE.jsonl]
  [--doc-separator S] [--text-field F] [--generations N] [--max-tokens T] [--temperature T]
  [--batch-size B] [--weight W] [--device cpu|cuda|auto] [--seed S] [--chat]``

Errors print one line to stderr (``speculant distill: error: ...``, see speculant.cli_errors)
and exit with status 1; nothing is published then, nor on Ctrl-C (exit 130).
"""

from __future__ import annotations

import argparse
import sys

from builder.cli import parse_escapes
from distill import defaults
from speculant.cli_errors import fail


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


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
        help="prompts are prefixes of these documents (files, directories, globs; default: the "
        "graph's own corpus, where it is readable)",
    )
    source.add_argument(
        "--prompts",
        default=None,
        metavar="FILE.jsonl",
        help="prompts: JSON lines, prompt or messages",
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
        "--max-tokens",
        type=positive,
        default=defaults.MAX_TOKENS,
        metavar="T",
        help=f"tokens per continuation (default {defaults.MAX_TOKENS})",
    )
    p.add_argument(
        "--temperature",
        type=_non_negative_float,
        default=0.0,
        metavar="T",
        help="0 = greedy (default); > 0 samples, e.g. at the temperature you serve",
    )
    p.add_argument(
        "--batch-size",
        type=positive,
        default=defaults.BATCH_SIZE,
        metavar="B",
        help=f"continuations generated together (default {defaults.BATCH_SIZE})",
    )
    p.add_argument(
        "--weight",
        type=positive,
        default=defaults.WEIGHT,
        metavar="W",
        help=f"each continuation n-gram counts W times (default {defaults.WEIGHT})",
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
        help="torch threads (default: 1 on a CPU, torch's own on a GPU)",
    )
    p.add_argument(
        "--seed", type=int, default=0, metavar="S", help="prompts and sampling (default 0)"
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="send each prompt as a chat user message (the model's chat template)",
    )
    p.add_argument("--hf-token", default=None, help="for gated or private hub models (or HF_TOKEN)")
    p.add_argument(
        "--download-mode", choices=["auto", "offline", "force"], default="auto", help="default auto"
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
        default=defaults.GENERATIONS,
        metavar="N",
        help=f"continuations to generate (default {defaults.GENERATIONS})",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines")
    p.set_defaults(handler=run_distill)


def options_from_args(args: argparse.Namespace, generations: int):
    from distill.run import DistillOptions

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
        batch_size=args.batch_size,
        weight=args.weight,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        chat=args.chat,
        hf_token=args.hf_token,
        download_mode=args.download_mode,
        torch_threads=args.torch_threads,
        progress=False if getattr(args, "quiet", False) else None,
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
    try:
        from distill.run import distill_graph

        result = distill_graph(options_from_args(args, args.generations))
    except distill_errors() as exc:
        return fail(exc)
    if not args.quiet:
        meta = result.meta
        print(
            f"distilled {result.generations:,} continuations ({result.tokens:,} tokens, weight "
            f"{args.weight}) of {args.model} into {args.graph}: version {meta.version}, "
            f"{result.generate_seconds:.1f} s generating and counting, "
            f"{result.total_seconds:.1f} s in all",
            file=sys.stderr,
        )
    return 0
