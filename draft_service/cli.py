"""Command-line subcommands of the draft_service package.

- ``speculant serve-draft --graph GRAPH_DIR [--host 127.0.0.1] [--port 50051] [--workers N]
  [--reload-interval S] [--metrics-port P] [--log-format text|json]``: the gRPC draft service
  (health NOT_SERVING until the graph is open; SIGINT/SIGTERM stop it; a graph newly published
  at GRAPH_DIR is loaded without a restart, checked every S seconds and on SIGHUP, see
  :mod:`draft_service.reload`).
- ``speculant tune --graph GRAPH_DIR --model M --prompts FILE [--write]``: fit the graph's mixing
  parameters by replayed greedy speculative decoding (:mod:`draft_service.tune`).
- ``speculant bench draft --graph GRAPH_DIR [--requests N] [--k 8] [--concurrency 1,4]
  [--json OUT]``: in-process and over-gRPC Propose latency, time to SERVING, server RSS.
- ``speculant bench draft-tier --graph GRAPH_DIR [--processes 1,2] [--clients 4] [--json OUT]``:
  Propose throughput as draft processes are added, and how much of the graph each one shares.

Handlers import grpc, numpy and lmdb only when they run.
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import TYPE_CHECKING

from speculant.config import (
    DEFAULT_DRAFT_K,
    DEFAULT_LEARN_MEMORY_MB,
    DEFAULT_LEARN_WEIGHT,
    DEFAULT_MAX_CONTEXT_TOKENS,
    DEFAULT_RELOAD_INTERVAL_S,
    DEFAULT_TREE_NODES,
    MIXING_MODES,
    DraftConfig,
)
from speculant.draft_flags import add_draft_default_arguments
from speculant.errors import InvalidArgumentError
from speculant.metrics import add_metrics_arguments
from speculant.request_context import add_log_format_argument
from speculant.tls import add_server_tls_arguments, server_tls_from_args

if TYPE_CHECKING:
    from draft_service.learning import LearningConfig
    from speculant.metrics import Metrics
    from speculant.types import DraftParams

log = logging.getLogger(__name__)


def register(
    subparsers: argparse._SubParsersAction, bench_subparsers: argparse._SubParsersAction
) -> None:
    """Add this package's subcommands (and its `speculant bench` targets)."""
    serve = subparsers.add_parser(
        "serve-draft", help="serve draft proposals from an n-gram graph over gRPC"
    )
    serve.add_argument("--graph", required=True, help="graph directory (from `speculant build`)")
    serve.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)"
    )
    serve.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    serve.add_argument(
        "--workers",
        type=int,
        default=8,
        help="ProposeStream streams served at once, one gRPC thread each (more are refused and "
        "their clients use unary Propose); 8 more threads answer health checks, GetGraphInfo "
        "and Propose",
    )
    serve.add_argument(
        "--max-context",
        type=int,
        default=DEFAULT_MAX_CONTEXT_TOKENS,
        metavar="TOKENS",
        help="refuse Propose contexts longer than this (INVALID_ARGUMENT; default %(default)s)",
    )
    serve.add_argument(
        "--reload-interval",
        type=float,
        default=DEFAULT_RELOAD_INTERVAL_S,
        metavar="S",
        help="check every S seconds whether a new graph was published at --graph and switch to "
        "it without a restart (0: only on SIGHUP; default %(default)s)",
    )
    add_draft_default_arguments(serve)
    add_learning_arguments(serve)
    add_server_tls_arguments(serve)
    add_metrics_arguments(serve)
    add_log_format_argument(serve)
    serve.set_defaults(handler=serve_draft)

    tune = subparsers.add_parser(
        "tune",
        help="fit the graph's mixing parameters by measured tokens per verifier forward on "
        "prompts; --write stores them in the graph as its drafting defaults",
    )
    tune.add_argument("--graph", required=True, help="graph directory")
    tune.add_argument("--model", required=True, help="the verifier model (name or folder)")
    tune.add_argument(
        "--prompts", required=True, help='JSON-lines file, one {"prompt": ...} a line'
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
    bench.add_argument("--k", type=int, default=8, help="draft tokens per call")
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
        "--min-draft-prob", type=float, default=0.0, help="adaptive draft length (0 = off)"
    )
    bench.add_argument(
        "--context-len", type=int, default=32, help="maximum context length in tokens"
    )
    bench.add_argument("--workers", type=int, default=8, help="server worker threads")
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
    tier.add_argument("--k", type=int, default=8, help="draft tokens per call")
    tier.add_argument(
        "--tree-nodes",
        type=int,
        default=DEFAULT_TREE_NODES,
        help=f"draft tree size (0 = chains of k; default {DEFAULT_TREE_NODES})",
    )
    tier.add_argument("--workers", type=int, default=8, help="server worker threads")
    tier.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    tier.set_defaults(handler=bench_draft_tier)


def _fail(message: str) -> int:
    """The command could not do its job: one error line, exit status 1."""
    from speculant.cli_errors import fail

    return fail(message)


def _usage(message: str) -> int:
    """A wrong flag value: one error line, exit status 2."""
    from speculant.cli_errors import usage_error

    return usage_error(message)


def add_learning_arguments(p: argparse.ArgumentParser) -> None:
    """--no-learn, --learn-memory, --learn-weight, --learn-log (serve-draft and up)."""
    p.add_argument(
        "--no-learn",
        action="store_true",
        help="do not learn from the generations served (default: learn; see README, Learning)",
    )
    p.add_argument(
        "--learn-memory",
        type=float,
        default=DEFAULT_LEARN_MEMORY_MB,
        metavar="MB",
        help="memory cap of the live layer; the oldest generations go first (default "
        f"{DEFAULT_LEARN_MEMORY_MB:g} MiB)",
    )
    p.add_argument(
        "--learn-weight",
        type=float,
        default=DEFAULT_LEARN_WEIGHT,
        metavar="W",
        help=f"drafting adds W times the learned counts to the graph's (default "
        f"{DEFAULT_LEARN_WEIGHT:g})",
    )
    p.add_argument(
        "--learn-log",
        default="",
        metavar="PATH",
        help="where learned generations persist across restarts, shared by the replicas "
        "(default: GRAPH_DIR.learned.jsonl beside the graph; 'none': in memory only)",
    )


def learning_from_args(args: argparse.Namespace):
    """The LearningConfig the flags ask for (None with --no-learn); ValueError if bad."""
    from draft_service.learning import LearningConfig

    if args.no_learn:
        return None
    if not 0 <= args.learn_memory < float("inf"):
        raise ValueError(f"--learn-memory must be a number of MiB >= 0, got {args.learn_memory}")
    if not 0 < args.learn_weight < float("inf"):
        raise ValueError(f"--learn-weight must be a number > 0, got {args.learn_weight}")
    log_path = None if args.learn_log.lower() == "none" else args.learn_log
    return LearningConfig(
        enabled=True,
        max_bytes=int(args.learn_memory * 2**20),
        weight=args.learn_weight,
        log_path=log_path,
    )


def serve_draft(args: argparse.Namespace) -> int:
    """Run the draft service; one error line for a bad graph or port (exit status 1) or flag (2)."""
    from speculant.draft_flags import draft_defaults_from_args
    from speculant.metrics import metrics_from_args
    from speculant.types import DraftParams

    if args.workers < 1:
        return _usage(f"--workers must be >= 1, got {args.workers}")
    if not args.reload_interval >= 0:  # also refuses NaN
        return _usage(f"--reload-interval must be >= 0, got {args.reload_interval}")
    try:
        defaults = DraftParams.from_config(draft_defaults_from_args(args)).validate()
    except InvalidArgumentError as exc:
        return _usage(f"bad drafting default: {exc}")
    try:
        learning = learning_from_args(args)
    except ValueError as exc:
        return _usage(str(exc))
    try:
        metrics = metrics_from_args(args)
    except OSError as exc:
        return _fail(str(exc))
    try:
        return _serve(args, defaults, metrics, learning)
    finally:
        if metrics is not None:
            metrics.close()


def _serve(
    args: argparse.Namespace,
    defaults: DraftParams,
    metrics: Metrics | None,
    learning: LearningConfig | None,
) -> int:
    from draft_service.server import DraftServer
    from speculant.graph_format import GraphFormatError

    try:
        tls = server_tls_from_args(args)
        server = DraftServer(
            args.host,
            args.port,
            workers=args.workers,
            defaults=defaults,
            tls=tls,
            reload_interval_s=args.reload_interval,
            metrics=metrics,
            max_context_tokens=args.max_context,
            learning=learning,
        )
    except InvalidArgumentError as exc:
        return _usage(str(exc))
    except OSError as exc:
        return _fail(str(exc))
    server.start()
    try:
        graph = server.load_graph(args.graph)
    except GraphFormatError as exc:
        server.stop(0)
        return _fail(str(exc))
    log.info(
        "draft service serving %s (max order %d, vocab %d) on %s",
        graph.path,
        graph.max_order,
        graph.vocab_size,
        server.address,
    )
    log.info("%s", server.learning_summary())
    # SIGHUP: check the graph path now (the watcher thread does the work)
    signal.signal(signal.SIGHUP, lambda _signum, _frame: server.request_reload())
    server.wait_for_termination_signal()
    log.info("draft service stopped")
    return 0


def run_tune_command(args: argparse.Namespace) -> int:
    """Tune, print the table (and JSON), and with --write store the winner in the graph."""
    import json
    from pathlib import Path

    from draft_service.tune import (
        TuneOptions,
        format_table,
        print_progress,
        run_tune,
        write_tuned,
    )
    from speculant.errors import SpeculantError

    options = TuneOptions(
        graph=args.graph,
        model=args.model,
        prompts=args.prompts,
        max_prompts=args.max_prompts,
        max_tokens=args.max_tokens,
        k=args.k,
        tree_nodes=args.tree_nodes,
        train_fraction=args.train_fraction,
        metric=args.metric,
        seed=args.seed,
        device=args.device,
    )
    try:
        result = run_tune(options, print_progress)
        print(format_table(result))
        if args.write:
            result["written"] = write_tuned(args.graph, result)
            print(f"wrote the tuned parameters {result['written']['params']} to {args.graph}")
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    except (SpeculantError, OSError) as exc:
        return _fail(str(exc))
    return 0


def bench_draft(args: argparse.Namespace) -> int:
    """Print (and optionally write as JSON) the draft service's figures."""
    from draft_service.bench import BenchOptions, run_bench
    from speculant.graph_format import GraphFormatError

    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        return _usage(f"--concurrency must be like 1,4, got {args.concurrency!r}")
    options = BenchOptions(
        graph=args.graph,
        requests=args.requests,
        k=args.k,
        concurrency=concurrency,
        strategy=args.strategy,
        attentive_mix=not args.no_mix,
        mixing=args.mixing,
        min_draft_prob=args.min_draft_prob,
        tree_nodes=args.tree_nodes,
        context_len=args.context_len,
        workers=args.workers,
        seed=args.seed,
        json_out=args.json,
    )
    try:
        run_bench(options)
    except GraphFormatError as exc:
        return _fail(str(exc))
    return 0


def bench_draft_tier(args: argparse.Namespace) -> int:
    """Print (and optionally write as JSON) the draft tier's throughput by process count."""
    from draft_service.tier_bench import TierBenchOptions, run_tier_bench
    from speculant.graph_format import GraphFormatError

    try:
        processes = [int(p) for p in args.processes.split(",") if p.strip()]
    except ValueError:
        processes = []
    if not processes or min(processes) < 1:
        return _usage(f"--processes must be like 1,2,4, got {args.processes!r}")
    for name in ("clients", "k", "workers"):
        if getattr(args, name) < 1:
            return _usage(f"--{name} must be >= 1")
    if not args.seconds > 0:
        return _usage(f"--seconds must be > 0, got {args.seconds}")
    options = TierBenchOptions(
        graph=args.graph,
        processes=processes,
        clients=args.clients,
        seconds=args.seconds,
        k=args.k,
        tree_nodes=args.tree_nodes,
        workers=args.workers,
        json_out=args.json,
    )
    try:
        run_tier_bench(options)
    except GraphFormatError as exc:
        return _fail(str(exc))
    return 0
