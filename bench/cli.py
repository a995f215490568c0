"""The ``speculant`` commands that drive the whole system: ``bench build | draft | draft-tier |
verifier | generate | cost | distill``, ``tune`` (fit the graph's mixing by replay) and ``load``
(a bounded local load test). The service packages never import this package; it stands on all of
them. Handlers import their benchmark module only when they run.
"""

from __future__ import annotations

import argparse
import json

from bench.options import options_from_args
from builder.cli import add_corpus_args, builder_errors
from distill.cli import add_source_args, budgets, distill_errors, positive
from speculant.cli_errors import fail, usage_error
from speculant.config import DEFAULT_DRAFT_K, DEFAULT_TREE_NODES, MIXING_MODES, DraftConfig
from verifier_service.cli import add_model_args, config_from_args


def register(
    subparsers: argparse._SubParsersAction, bench_subparsers: argparse._SubParsersAction
) -> None:
    """Add ``tune``, ``load`` and every ``speculant bench`` target."""
    from bench.generate_cli import register_bench
    from bench.load_cli import register_load

    tune = subparsers.add_parser(
        "tune",
        help="fit the graph's mixing parameters by measured tokens per verifier forward on "
        "prompts; --write stores them in the graph as its drafting defaults",
    )
    tune.add_argument("--graph", required=True, help="graph directory")
    tune.add_argument("--model", required=True, help="the verifier model (name or folder)")
    tune.add_argument(
        "--prompts",
        required=True,
        help="JSON lines: prompt (text) or messages (chat, the model's chat template), and an "
        "optional kind (figures per kind)",
    )
    tune.add_argument("--max-prompts", type=int, default=32, help="prompts read (train + held out)")
    tune.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per prompt")
    tune.add_argument(
        "--k", type=int, default=DEFAULT_DRAFT_K, help="draft tokens per round (a tree's depth)"
    )
    tune.add_argument(
        "--tree-nodes",
        type=int,
        default=DEFAULT_TREE_NODES,
        help=f"the draft tree's size scored (0 = a chain of k; default {DEFAULT_TREE_NODES})",
    )
    tune.add_argument(
        "--train-fraction", type=float, default=0.5, help="share of prompts fitted on"
    )
    tune.add_argument(
        "--metric",
        choices=["tau", "acceptance"],
        default="tau",
        help="what is maximised: tokens per verifier forward, or the acceptance rate",
    )
    tune.add_argument("--seed", type=int, default=0, help="seed of the train/held-out split")
    tune.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs"
    )
    tune.add_argument("--json", default=None, metavar="OUT", help="write the result as JSON")
    tune.add_argument(
        "--write",
        action="store_true",
        help="store the best parameters in the graph's meta (atomically, new manifest)",
    )
    tune.set_defaults(handler=run_tune_command)

    bench = bench_subparsers.add_parser(
        "draft", help="Propose latency in-process and over gRPC, time to SERVING, server RSS"
    )
    bench.add_argument("--graph", required=True, help="graph directory")
    bench.add_argument("--requests", type=int, default=2000, help="Propose calls per measurement")
    _add_draft_shape(bench)
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
    _add_workers(bench)
    bench.add_argument("--seed", type=int, default=0, help="seed for the request contexts")
    bench.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    bench.set_defaults(handler=bench_draft)

    tier = bench_subparsers.add_parser(
        "draft-tier",
        help="Propose throughput of 1..N draft processes sharing one graph, and their memory",
    )
    tier.add_argument("--graph", required=True, help="graph directory")
    tier.add_argument(
        "--processes", default="1,2", help="comma-separated draft process counts (default 1,2)"
    )
    tier.add_argument("--clients", type=int, default=4, help="closed-loop client processes")
    tier.add_argument("--seconds", type=float, default=5.0, help="measured window per row")
    _add_draft_shape(tier)
    _add_workers(tier)
    tier.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    tier.set_defaults(handler=bench_draft_tier)

    start = bench_subparsers.add_parser(
        "startup", help="seconds from launching serve-draft to its health check SERVING"
    )
    start.add_argument("--graph", required=True, help="graph directory")
    start.add_argument("--runs", type=int, default=5, help="launches measured")
    _add_workers(start)
    start.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    start.set_defaults(handler=_bench_startup)

    bench = bench_subparsers.add_parser(
        "build", help="time a graph build (wall, peak RSS, throughput, size)"
    )
    add_corpus_args(bench)
    bench.add_argument("--out", default=None, help="graph directory (default: a temporary one)")
    bench.add_argument("--json", default=None, metavar="OUT", help="also write figures as JSON")
    bench.set_defaults(handler=run_bench_build)

    bench = bench_subparsers.add_parser(
        "verifier", help="median Prefill/Verify times, in process and over gRPC"
    )
    add_model_args(bench)
    bench.add_argument("--repeats", type=int, default=200, help="timed calls per figure")
    bench.add_argument(
        "--grpc-address",
        default=None,
        help="measure this running verifier (default: start serve-verifier on a free port)",
    )
    bench.add_argument("--json", default=None, metavar="OUT", help="also write the figures here")
    bench.set_defaults(handler=bench_verifier)

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


def run_tune_command(args: argparse.Namespace) -> int:
    """Tune, print the table (and JSON), and with --write store the winner in the graph."""
    import json
    from pathlib import Path

    from bench.tune import TuneOptions, run_tune
    from bench.tune_report import format_table, print_progress, write_tuned
    from speculant.errors import SpeculantError

    try:
        result = run_tune(options_from_args(TuneOptions, args), print_progress)
        print(format_table(result))
        if args.write:
            result["written"] = write_tuned(args.graph, result)
            print(f"wrote the tuned parameters {result['written']['params']} to {args.graph}")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    except (SpeculantError, OSError) as exc:
        return fail(str(exc))
    return 0


def _add_draft_shape(p: argparse.ArgumentParser) -> None:
    """--k and --tree-nodes of the draft benchmarks (DraftConfig's defaults)."""
    p.add_argument("--k", type=int, default=DEFAULT_DRAFT_K, help="draft tokens per call")
    p.add_argument(
        "--tree-nodes",
        type=int,
        default=DEFAULT_TREE_NODES,
        help=f"draft tree size (0 = chains of k; default {DEFAULT_TREE_NODES})",
    )


def _add_workers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=8, help="server worker threads")


def _bench_startup(args: argparse.Namespace) -> int:
    from bench.startup import bench_startup

    if args.runs < 1:
        return usage_error(f"--runs must be >= 1, got {args.runs}")
    return bench_startup(args)


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


def bench_draft_tier(args: argparse.Namespace) -> int:
    """Print (and optionally write as JSON) the draft tier's throughput by process count."""
    from bench.tier import TierBenchOptions, run_tier_bench
    from speculant.graph_format import GraphFormatError

    try:
        processes = [int(p) for p in args.processes.split(",") if p.strip()]
    except ValueError:
        processes = []
    if not processes or min(processes) < 1:
        return usage_error(f"--processes must be like 1,2,4, got {args.processes!r}")
    for name in ("clients", "k", "workers"):
        if getattr(args, name) < 1:
            return usage_error(f"--{name} must be >= 1")
    if not args.seconds > 0:
        return usage_error(f"--seconds must be > 0, got {args.seconds}")
    try:
        run_tier_bench(options_from_args(TierBenchOptions, args, processes=processes))
    except GraphFormatError as exc:
        return fail(str(exc))
    return 0


def bench_verifier(args: argparse.Namespace) -> int:
    from bench.verify import main
    from verifier_service.model_loading import ModelLoadError

    config = config_from_args(args)
    try:
        return main(args, config)
    except ModelLoadError as exc:
        from speculant.cli_errors import fail

        return fail(exc)


def run_bench_distill(args: argparse.Namespace) -> int:
    try:
        from bench.distill import run_bench

        return run_bench(args)
    except distill_errors() as exc:
        return fail(exc)
