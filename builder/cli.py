"""Command-line subcommands of the builder package.

- ``speculant build (--corpus PATH [PATH ...] | --dataset NAME_OR_PATH [--dataset-config C]
  [--split S] [--data-files PATTERN ...] [--max-docs N]) --tokenizer NAME_OR_DIR
  --out GRAPH_DIR [...] [--engine local|dask] [--address ADDR] [--workers N]
  [--partitions N | --partition-size MB] [--work-dir DIR] [--append]`` (``--corpus`` and
  ``--dataset`` may be combined; ``--append`` adds the corpus to the graph at GRAPH_DIR)
- ``speculant graph-info GRAPH_DIR [--json]``
- ``speculant graph-viz GRAPH_DIR --out PAGE.html [--max-nodes N] [--min-weight P]
  [--context TEXT] [--tokenizer NAME_OR_DIR]``

The graph-info and graph-viz handlers are in :mod:`builder.graph_commands`. Handlers import the
builder (numpy, lmdb, transformers) only when they run. Errors print one
line to stderr (``speculant build: error: ...``) and exit with status 1, 2 for a wrong command
line (see :mod:`speculant.cli_errors`); nothing is published by a failed build.
"""

from __future__ import annotations

import argparse
import logging
import sys

from builder.graph_commands import run_graph_info, run_graph_viz
from builder.heartbeat import PROGRESS_SECONDS

MAX_ORDER_LIMIT = 64  # speculant.suffix_index.MAX_CONTEXT (not imported: keep it light)
DEFAULT_MAX_ORDER = 5


def non_negative_seconds(text: str) -> float:
    """An argparse type: seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 of seconds, got {text}")
    return value


def parse_escapes(text: str) -> str:
    """Turn backslash escapes typed on a command line (``'\\n\\n'``, ``'\\t'``) into text."""
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def _order(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_ORDER_LIMIT:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_ORDER_LIMIT}, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _probability(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def add_corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--corpus",
        nargs="+",
        default=None,
        metavar="PATH",
        help="corpus files, directories (recursive) or globs (.jsonl: one record per line; "
        ".parquet: one row per document, needs the distributed extra)",
    )
    ds = p.add_argument_group(
        "Hugging Face dataset (instead of or with --corpus; streamed, needs the distributed extra)"
    )
    ds.add_argument(
        "--dataset",
        default=None,
        metavar="NAME_OR_PATH",
        help="a hub dataset, a local dataset directory, or json/parquet/csv/text with "
        "--data-files; one record = one document (field --text-field)",
    )
    ds.add_argument(
        "--dataset-config", default=None, metavar="C", help="the dataset's configuration name"
    )
    ds.add_argument("--split", default=None, metavar="S", help="the split to read (default train)")
    ds.add_argument(
        "--data-files",
        nargs="+",
        default=None,
        metavar="PATTERN",
        help="data files or globs of the dataset (load_dataset's data_files)",
    )
    ds.add_argument(
        "--max-docs",
        type=_positive,
        default=None,
        metavar="N",
        help="read exactly N documents (or all, if fewer), spread evenly over the shards",
    )
    p.add_argument(
        "--tokenizer", required=True, metavar="NAME_OR_DIR", help="Hugging Face tokenizer"
    )
    p.add_argument(
        "--max-order",
        type=_order,
        default=None,
        help="the longest context drafts mix (1..64; default 5, or the graph's own with "
        "--append); the graph answers contexts of any length up to 64 whatever this is",
    )
    p.add_argument(
        "--doc-separator",
        type=parse_escapes,
        default=None,
        metavar="STR",
        help="split plain-text files into documents at STR (escapes allowed: '\\n\\n\\n'); "
        "default: one document per file",
    )
    p.add_argument(
        "--text-field",
        default="text",
        help="JSON-lines field, Parquet column or dataset field holding the text",
    )
    p.add_argument("--hf-token", default=None, help="Hugging Face token (default: $HF_TOKEN)")
    engine = p.add_argument_group("engine (where tokenizing and sorting run)")
    engine.add_argument(
        "--engine",
        choices=("local", "dask"),
        default="local",
        help="local: this machine's cores (default); dask: a Dask cluster (see --address)",
    )
    engine.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: a new local cluster)",
    )
    engine.add_argument(
        "--workers",
        type=_positive,
        default=None,
        help="worker processes (local engine, or a new local Dask cluster; default: every core)",
    )
    size = engine.add_mutually_exclusive_group()
    size.add_argument(
        "--partitions",
        type=_positive,
        default=None,
        metavar="N",
        help="cut the corpus into about N partitions (tasks); a dataset: its shards into "
        "at most N tasks (default: one task per shard)",
    )
    size.add_argument(
        "--partition-size",
        type=_positive,
        default=None,
        metavar="MB",
        help="partition size in MiB (default 64; corpus files only); files are cut at document "
        "boundaries",
    )
    engine.add_argument(
        "--work-dir",
        default=None,
        metavar="DIR",
        help="where tasks write partial counts: storage every worker reaches at the same path "
        "(required with --address; default: the temporary directory)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's subcommands."""
    build = subparsers.add_parser(
        "build",
        help="build an n-gram graph from a corpus",
        description="Tokenize a corpus, count its n-grams exactly and publish an LMDB graph.",
    )
    add_corpus_args(build)
    build.add_argument("--out", required=True, metavar="GRAPH_DIR", help="graph directory")
    build.add_argument(
        "--append",
        action="store_true",
        help="add the corpus to the graph at --out (same tokenizer and max order) and publish "
        "the sum as its next version, atomically",
    )
    build.add_argument(
        "--progress-every",
        type=non_negative_seconds,
        default=PROGRESS_SECONDS,
        metavar="S",
        help="when stderr is not a terminal, log a progress line every S seconds while "
        f"tokenizing and counting (default {PROGRESS_SECONDS:g}; 0: none); on a terminal a "
        "progress bar shows instead",
    )
    build.add_argument("--quiet", action="store_true", help="no progress bar or log lines")
    build.set_defaults(handler=run_build)

    info = subparsers.add_parser("graph-info", help="show a graph's meta and statistics")
    info.add_argument("graph", metavar="GRAPH_DIR")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(handler=run_graph_info)

    viz = subparsers.add_parser(
        "graph-viz",
        help="draw part of a graph as a self-contained interactive HTML page",
        description="Draw the contexts and successors around a text (or the most frequent "
        "contexts) as one HTML file that works offline: context nodes coloured by order, "
        "token nodes, edge width = P(token | context); hover for text and counts.",
    )
    viz.add_argument("graph", metavar="GRAPH_DIR")
    viz.add_argument("--out", required=True, metavar="PAGE.html", help="the HTML file to write")
    viz.add_argument(
        "--max-nodes",
        type=_positive,
        default=100,
        metavar="N",
        help="draw at most N nodes (default 100)",
    )
    viz.add_argument(
        "--min-weight",
        type=_probability,
        default=0.1,
        metavar="P",
        help="follow successors with P(token | context) >= P (0..1, default 0.1)",
    )
    viz.add_argument(
        "--context",
        default=None,
        metavar="TEXT",
        help="start from the last tokens of TEXT at every order (default: from the most "
        "frequent context of every order, found by reading the whole graph)",
    )
    viz.add_argument(
        "--tokenizer",
        default=None,
        metavar="NAME_OR_DIR",
        help="the graph's tokenizer, if its name in the graph's meta does not load from here",
    )
    viz.set_defaults(handler=run_graph_viz)


def _fail(exc: BaseException) -> int:
    from speculant.cli_errors import fail

    return fail(exc)


def builder_errors() -> tuple[type[BaseException], ...]:
    from builder.errors import BuildError
    from speculant.graph_format import GraphFormatError
    from speculant.tokenizer import TokenizerLoadError

    return (BuildError, GraphFormatError, TokenizerLoadError, ValueError, OSError)


def builder_kwargs(args: argparse.Namespace) -> dict:
    """GraphBuilder arguments from the corpus and engine options."""
    from builder.errors import BuildError

    check_inputs(args)
    if args.address and args.engine != "dask":
        raise BuildError("--address needs --engine dask")
    if args.address and not args.work_dir:
        raise BuildError(
            "--address needs --work-dir: a directory on storage that every Dask worker and "
            "this machine reach at the same path (the partial counts go there)"
        )
    if args.engine == "dask":  # the cluster's own INFO lines would drown the build's
        logging.getLogger("distributed").setLevel(logging.WARNING)
    return {
        "tokenizer_name": args.tokenizer,
        "max_order": args.max_order if args.max_order is not None else DEFAULT_MAX_ORDER,
        "hf_token": args.hf_token,
        "engine": args.engine,
        "address": args.address,
        "workers": args.workers,
        "partitions": args.partitions,
        "partition_bytes": args.partition_size << 20 if args.partition_size else None,
        "work_dir": args.work_dir,
    }


def check_inputs(args: argparse.Namespace) -> None:
    """--corpus and/or --dataset; the dataset options only with --dataset."""
    from builder.errors import BuildError

    if not args.corpus and not args.dataset:
        raise BuildError("give --corpus PATH ... and/or --dataset NAME_OR_PATH")
    if not args.dataset:
        for option, value in (
            ("--dataset-config", args.dataset_config),
            ("--split", args.split),
            ("--data-files", args.data_files),
            ("--max-docs", args.max_docs),
        ):
            if value is not None:
                raise BuildError(f"{option} needs --dataset")


def read_inputs(builder, args: argparse.Namespace) -> None:
    """Count the --corpus files, then the --dataset, into builder."""
    if args.corpus:
        builder.build_from_files(
            args.corpus, text_field=args.text_field, doc_separator=args.doc_separator
        )
    if args.dataset:
        builder.build_from_dataset(
            args.dataset,
            args.dataset_config,
            split=args.split or "train",
            text_field=args.text_field,
            data_files=args.data_files,
            max_docs=args.max_docs,
        )


def run_build(args: argparse.Namespace) -> int:
    from speculant.torchless import import_transformers_without_torch

    import_transformers_without_torch()  # this process only tokenizes: 250 MB less
    if args.quiet:
        logging.getLogger("builder").setLevel(logging.WARNING)
    errors = builder_errors()
    try:
        from builder import GraphBuilder
        from builder.publish import remove_stale_run_dirs, remove_stale_temp_dirs

        # what killed builds left beside the graph and in the work directory
        remove_stale_temp_dirs(_absolute(args.out))
        remove_stale_run_dirs(args.work_dir)
        if args.append and args.max_order is None:  # default: the graph's own max order
            from builder.append import read_base_meta

            args.max_order = read_base_meta(_absolute(args.out)).max_order
        if not args.append:  # refuse a bad --out before the tokenizing and counting
            from builder.publish import check_output

            check_output(_absolute(args.out))
        builder = GraphBuilder(
            **builder_kwargs(args),
            progress=False if args.quiet else None,
            progress_seconds=args.progress_every,
        )
        with builder:
            base = builder.check_append(args.out) if args.append else None
            read_inputs(builder, args)
            meta = builder.save(args.out, append=args.append)
    except errors as exc:
        return _fail(exc)
    if not args.quiet:
        added = (
            f"appended {builder.stats.documents:,} documents, {builder.stats.tokens:,} tokens "
            f"to {args.out} (version {base.version if base else '?'} -> {meta.version}): "
            if args.append
            else f"built {args.out}: "
        )
        print(
            f"{added}{meta.corpus_documents:,} documents, "
            f"{meta.corpus_tokens:,} tokens, orders 1..{meta.max_order}, "
            f"{meta.build_seconds:.1f} s ({args.engine} engine, "
            f"{meta.build_params['partitioning']['partitions']} partition(s))",
            file=sys.stderr,
        )
    return 0


def _absolute(path: str):
    from pathlib import Path

    return Path(path).expanduser().absolute()
