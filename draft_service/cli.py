"""Command-line subcommands of the draft_service package.

- ``speculant serve-draft --graph GRAPH_DIR [--host 127.0.0.1] [--port 50051] [--workers N]
  [--metrics-port P] [--log-format text|json]``: the gRPC draft service (health NOT_SERVING
  until the graph is open; SIGINT/SIGTERM stop it).
- ``speculant bench draft --graph GRAPH_DIR [--requests N] [--k 8] [--concurrency 1,4]
  [--json OUT]``: in-process and over-gRPC Propose latency, time to SERVING, server RSS.

Handlers import grpc, numpy and lmdb only when they run.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from speculant.config import MIXING_MODES, DraftConfig
from speculant.errors import InvalidArgumentError
from speculant.metrics import add_metrics_arguments
from speculant.request_context import add_log_format_argument
from speculant.tls import add_server_tls_arguments, server_tls_from_args

if TYPE_CHECKING:
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
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=50051, help="0 picks a free port")
    serve.add_argument("--workers", type=int, default=8, help="gRPC worker threads")
    add_server_tls_arguments(serve)
    add_metrics_arguments(serve)
    add_log_format_argument(serve)
    serve.set_defaults(handler=serve_draft)

    bench = bench_subparsers.add_parser(
        "draft", help="Propose latency in-process and over gRPC, time to SERVING, server RSS"
    )
    bench.add_argument("--graph", required=True, help="graph directory")
    bench.add_argument("--requests", type=int, default=2000, help="Propose calls per measurement")
    bench.add_argument("--k", type=int, default=8, help="draft tokens per call")
    bench.add_argument(
        "--concurrency", default="1,4", help="comma-separated closed-loop client counts"
    )
    bench.add_argument("--strategy", choices=["greedy", "sampling"], default="greedy")
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


def _fail(command: str, message: str) -> int:
    print(f"speculant {command}: error: {message}", file=sys.stderr)
    return 2


def serve_draft(args: argparse.Namespace) -> int:
    """Run the draft service; exit code 2 with a one-line message for a bad graph or port."""
    from pydantic import ValidationError

    from speculant.config import DraftConfig
    from speculant.metrics import metrics_from_args
    from speculant.types import DraftParams

    if args.workers < 1:
        return _fail("serve-draft", f"--workers must be >= 1, got {args.workers}")
    try:
        defaults = DraftParams.from_config(DraftConfig()).validate()
    except (ValidationError, ValueError) as exc:
        first = str(exc).splitlines()
        return _fail("serve-draft", f"bad SPECULANT_DRAFT__* setting: {' '.join(first[:3])}")
    try:
        metrics = metrics_from_args(args)
    except OSError as exc:
        return _fail("serve-draft", str(exc))
    try:
        return _serve(args, defaults, metrics)
    finally:
        if metrics is not None:
            metrics.close()


def _serve(args: argparse.Namespace, defaults: DraftParams, metrics: Metrics | None) -> int:
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
            metrics=metrics,
        )
    except InvalidArgumentError as exc:
        return _fail("serve-draft", str(exc))
    except (OSError, RuntimeError) as exc:
        return _fail("serve-draft", f"cannot listen on {args.host}:{args.port}: {exc}")
    server.start()
    try:
        graph = server.load_graph(args.graph)
    except GraphFormatError as exc:
        server.stop(0)
        return _fail("serve-draft", str(exc))
    log.info(
        "draft service serving %s (max order %d, vocab %d) on %s",
        graph.path,
        graph.max_order,
        graph.vocab_size,
        server.address,
    )
    server.wait_for_termination_signal()
    log.info("draft service stopped")
    return 0


def bench_draft(args: argparse.Namespace) -> int:
    """Print (and optionally write as JSON) the draft service's figures."""
    from draft_service.bench import BenchOptions, run_bench
    from speculant.graph_format import GraphFormatError

    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        return _fail("bench draft", f"--concurrency must be like 1,4, got {args.concurrency!r}")
    options = BenchOptions(
        graph=args.graph,
        requests=args.requests,
        k=args.k,
        concurrency=concurrency,
        strategy=args.strategy,
        attentive_mix=not args.no_mix,
        mixing=args.mixing,
        min_draft_prob=args.min_draft_prob,
        context_len=args.context_len,
        workers=args.workers,
        seed=args.seed,
        json_out=args.json,
    )
    try:
        run_bench(options)
    except GraphFormatError as exc:
        return _fail("bench draft", str(exc))
    return 0
