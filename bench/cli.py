"""The ``speculant`` commands that drive the whole system: ``bench build | draft | generate | cost
| distill`` and ``load`` (a bounded local load test). The service packages never import this
package; it stands on all of them. Handlers import their benchmark module only when they run.
(``bench draft-tier``, ``startup`` and ``verifier`` are retired; docs/benchmarks.md keeps their
figures as measured.)
"""

from __future__ import annotations

import argparse
import json

from bench.settings import options_from_args
from builder.cli import add_corpus_args, builder_errors
from distill.cli import add_source_args, budgets, distill_errors, positive
from speculant.cli_errors import fail, usage_error
from speculant.config import DEFAULT_DRAFT_K, DEFAULT_TREE_NODES, MIXING_MODES, DraftConfig


def register(
    subparsers: argparse._SubParsersAction, bench_subparsers: argparse._SubParsersAction
) -> None:
    """Add ``load`` and every ``speculant bench`` target."""
    from bench.generate_cli import register_bench
    from bench.load import register_load

    bench = bench_subparsers.add_parser(
        "draft", help="Propose latency in-process and over gRPC, time to SERVING, server RSS"
    )
    bench.add_argument("--graph", required=True, help="graph directory")
    bench.add_argument("--requests", type=int, default=2000, help="Propose calls per measurement")
    bench.add_argument("--k", type=int, default=DEFAULT_DRAFT_K, help="draft tokens per call")
    bench.add_argument(
        "--tree-nodes",
        type=int,
        default=DEFAULT_TREE_NODES,
        help=f"draft tree size (0 = chains of k; default {DEFAULT_TREE_NODES})",
    )
    bench.add_argument(
        "--concurrency", default="1,4", help="comma-separated closed-loop client counts"
    )
    bench.add_argument(
        "--strategy", choices=["greedy", "sampling"], default="greedy", help="draft strategy"
    )
    bench.add_argument("--no-mix", action="store_true", help="attentive_mix=false")
    bench.add_argument(
        "--mixing",
        choices=list(MIXING_MODES),
        default=DraftConfig.model_fields["mixing"].default,
        help="mixing mode",
    )
    bench.add_argument(
        "--context-len", type=int, default=32, help="maximum context length in tokens"
    )
    bench.add_argument("--workers", type=int, default=8, help="server worker threads")
    bench.add_argument("--seed", type=int, default=0, help="seed for the request contexts")
    bench.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    bench.set_defaults(handler=bench_draft)

    bench = bench_subparsers.add_parser(
        "build", help="time a graph build (wall, peak RSS, throughput, size)"
    )
    add_corpus_args(bench)
    bench.add_argument("--out", default=None, help="graph directory (default: a temporary one)")
    bench.add_argument("--json", default=None, metavar="OUT", help="also write figures as JSON")
    bench.set_defaults(handler=run_bench_build)

    b = bench_subparsers.add_parser(
        "distill", help="tau on held-out prompts against the number of distilled generations"
    )
    add_source_args(b)
    b.add_argument(
        "--budgets",
        type=budgets,
        default=(0, 512, 1024, 2048, 4096),
        metavar="N,N,...",
        help="generations per point (default 0,512,1024,2048,4096)",
    )
    b.add_argument(
        "--eval-prompts",
        default=None,
        metavar="FILE.jsonl",
        help="held-out prompts (JSON lines: prompt or messages, optional kind; default: the "
        "tinystories dev prompts in "
        "../shared, else the demo prompts)",
    )
    b.add_argument(
        "--eval-max-tokens",
        type=positive,
        default=128,
        metavar="T",
        help="tokens generated per held-out prompt (default: %(default)s)",
    )
    b.add_argument("--limit", type=positive, default=None, metavar="N", help="first N prompts")
    b.add_argument("--json", default=None, metavar="OUT", help="write every figure here")
    b.add_argument("--plot", default=None, metavar="OUT.png", help="draw the curve (matplotlib)")
    b.add_argument(
        "--save-graph",
        default=None,
        metavar="DIR",
        help="keep the graph of the largest budget here (what `speculant distill --generations "
        "N` writes for that N; DIR must not exist)",
    )
    b.set_defaults(handler=run_bench_distill)

    register_load(subparsers)
    register_bench(bench_subparsers)


def run_bench_build(args: argparse.Namespace) -> int:
    from bench.build import bench_build, format_bench

    try:
        figures = bench_build(args)
    except builder_errors() as exc:
        return fail(exc)
    print(format_bench(figures))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=2, sort_keys=True)
    return 0


def bench_draft(args: argparse.Namespace) -> int:
    """Print (and optionally write as JSON) the draft service's figures."""
    from bench.drafts import BenchOptions, run_bench
    from speculant.graph_format import GraphFormatError

    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        return usage_error(f"--concurrency must be like 1,4, got {args.concurrency!r}")
    options = options_from_args(
        BenchOptions, args, concurrency=concurrency, attentive_mix=not args.no_mix
    )
    try:
        run_bench(options)
    except GraphFormatError as exc:
        return fail(str(exc))
    return 0


def run_bench_distill(args: argparse.Namespace) -> int:
    try:
        from bench.distill import run_bench

        return run_bench(args)
    except distill_errors() as exc:
        return fail(exc)
