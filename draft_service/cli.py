"""Command-line subcommands of the draft_service package.

- ``speculant serve-draft --graph [NAME=]GRAPH_DIR ... [--default-graph NAME] [--catalog FILE]
  [--admin-token-file F] [--host 127.0.0.1] [--port 50051] [--workers N] [--reload-interval S]
  [--metrics-port P] [--log-format text|json]``: the gRPC draft service (health NOT_SERVING until
  the graphs are open; SIGINT/SIGTERM stop it; a graph newly published at a GRAPH_DIR, or a
  change recorded in the catalog file, is loaded without a restart, checked every S seconds and
  on SIGHUP, see :mod:`draft_service.reload`).

``speculant tune`` and the draft benchmarks (``bench draft``, ``bench draft-tier``) drive the
service from above: :mod:`bench.cli`.

Handlers import grpc, numpy and lmdb only when they run.
"""

from __future__ import annotations

import argparse
import logging
import signal
from typing import TYPE_CHECKING

from speculant import termination
from speculant.config import (
    DEFAULT_LEARN_MEMORY_MB,
    DEFAULT_LEARN_WEIGHT,
    DEFAULT_MAX_CONTEXT_TOKENS,
    DEFAULT_RELOAD_INTERVAL_S,
    LONG_CONTEXT,
)
from speculant.draft_flags import add_draft_default_arguments
from speculant.errors import InvalidArgumentError
from speculant.metrics import add_metrics_arguments
from speculant.request_context import add_log_format_argument
from speculant.tls import add_server_tls_arguments, server_tls_from_args

if TYPE_CHECKING:
    from draft_service.learning import LearningConfig
    from speculant.config import DraftParams
    from speculant.metrics import Metrics

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this package's subcommands."""
    serve = subparsers.add_parser(
        "serve-draft", help="serve draft proposals from an n-gram graph over gRPC"
    )
    add_catalog_arguments(serve)
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
        "--long-context",
        type=int,
        default=0,
        metavar="TOKENS",
        help="draft from the longest match of up to this many context tokens too, beside the "
        f"orders 1..max order (a format 2 graph; {LONG_CONTEXT} suggested: better drafts from "
        "graphs of learned text, at a slower Propose; 0 = off)",
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


def add_catalog_arguments(p: argparse.ArgumentParser, admin: bool = True) -> None:
    """--graph (repeatable), --default-graph, --catalog and (admin) --admin-token-file
    (serve-draft; up without the last, which it gives its gateway's)."""
    p.add_argument(
        "--graph",
        action="append",
        required=True,
        metavar="[NAME=]DIR",
        help="a graph folder (from `speculant build`) to serve under NAME (default: the folder's "
        "name); repeat it to serve several: each request names its graph (see docs/graph.md)",
    )
    p.add_argument(
        "--default-graph",
        default=None,
        metavar="NAME",
        help="the graph of requests that name none (default: the first --graph)",
    )
    p.add_argument(
        "--catalog",
        default="",
        metavar="FILE",
        help="where graphs added or removed while serving are recorded, shared by the draft "
        "replicas (each applies it at start and when it changes) (default: "
        "DEFAULT_GRAPH_DIR.catalog.json beside the default graph; 'none': not recorded)",
    )
    if not admin:
        return
    p.add_argument(
        "--admin-token-file",
        default=None,
        metavar="FILE",
        help="the token AdminService calls (adding, replacing, removing graphs) must send "
        "(default: $SPECULANT_ADMIN_TOKEN if set, else admin calls are refused)",
    )


def catalog_from_args(args: argparse.Namespace):
    """(graph specs, default graph name, catalog file path or None) of the flags;
    InvalidArgumentError naming the flag when one is bad."""
    from speculant.graph_catalog import default_catalog_path, parse_graph_specs

    specs, default = parse_graph_specs(args.graph, args.default_graph)
    if args.catalog.lower() == "none":
        return specs, default, None
    chosen = next(spec.path for spec in specs if spec.name == default)
    return specs, default, args.catalog or default_catalog_path(chosen)


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
        help="do not learn from the generations served (default: learn; see docs/learning.md)",
    )
    p.add_argument(
        "--learn-memory",
        type=float,
        default=DEFAULT_LEARN_MEMORY_MB,
        metavar="MB",
        help="memory cap of each (graph, tenant) learned layer; the oldest generations go first "
        "(default "
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
        help="where the default graph's default tenant's learned generations persist across "
        "restarts, shared by the replicas; the other graphs' and tenants' logs go beside it "
        "(default: GRAPH_DIR.learned[.TENANT].jsonl beside each graph; 'none': in memory only)",
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
    from speculant.auth import load_admin_token
    from speculant.config import DraftParams
    from speculant.draft_flags import draft_defaults_from_args
    from speculant.metrics import metrics_from_args

    termination.catch()  # before anything can report SERVING
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
        catalog = catalog_from_args(args)
        admin_token = load_admin_token(args.admin_token_file)
    except ValueError as exc:
        return _usage(str(exc))
    try:
        metrics = metrics_from_args(args)
    except OSError as exc:
        return _fail(str(exc))
    try:
        return _serve(args, defaults, metrics, learning, catalog, admin_token)
    finally:
        if metrics is not None:
            metrics.close()


def _serve(
    args: argparse.Namespace,
    defaults: DraftParams,
    metrics: Metrics | None,
    learning: LearningConfig | None,
    catalog: tuple,
    admin_token: str | None,
) -> int:
    from speculant.numba_start import import_numba_without_blas

    import_numba_without_blas()  # before the graph's kernels load: 0.2 s less to SERVING
    from draft_service.server import DraftServer
    from speculant.errors import SpeculantError

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
            long_context=args.long_context,
            learning=learning,
            catalog_file=catalog[2],
            admin_token=admin_token,
        )
    except InvalidArgumentError as exc:
        return _usage(str(exc))
    except OSError as exc:
        return _fail(str(exc))
    server.start()
    try:
        server.load_graphs(catalog[0], catalog[1])
    except SpeculantError as exc:  # a graph that does not open, or of another tokenizer
        server.stop(0)
        return _fail(str(exc))
    log.info("%s", server.serving_summary())
    log.info("%s", server.learning_summary())
    # SIGHUP: check the graph path now (the watcher thread does the work)
    signal.signal(signal.SIGHUP, lambda _signum, _frame: server.request_reload())
    server.wait_for_termination_signal()
    log.info("draft service stopped")
    return 0
