"""`speculant up`: the three services as child processes on localhost, stopped together.

Every flag is checked before anything starts (gateway.launch.up_plan). What was chosen for the host
is printed at start-up. Children get SIGTERM when `up` exits (and, on Linux, when `up` itself
dies), so no orphan keeps a port or a model in memory (speculant.children).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from gateway.launch.up_plan import BACKEND_HOST, ChildPlan, plan_up, validate_plan
from speculant.children import Child, child_setup, stop_children, wait_ready
from speculant.cli_errors import fail
from speculant.config import VerifierConfig
from speculant.draft_flags import add_draft_default_arguments, flag_options
from speculant.request_context import add_log_format_argument
from speculant.tls import add_server_tls_arguments


def register_up(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up",
        help="start draft, verifier and gateway services together on localhost",
        description="Start the draft service, the verifier and the gateway as child processes "
        "and stop them together (Ctrl-C). The draft and verifier services listen on "
        f"{BACKEND_HOST} only; the gateway on --host, with its token, TLS and HTTP API.",
    )
    from draft_service.cli import add_catalog_arguments

    add_catalog_arguments(up, admin=False)
    up.add_argument("--model", required=True, help="hub name or local folder of the model")
    up.add_argument("--host", default="127.0.0.1", help="address the gateway listens on")
    up.add_argument("--gateway-port", type=int, default=50050, help="the gateway's gRPC port")
    up.add_argument("--draft-port", type=int, default=50051, help="the draft service's port")
    up.add_argument("--verifier-port", type=int, default=50052, help="the verifier's port")
    verifier = up.add_argument_group("verifier")
    from verifier_service.cli import add_model_loading_arguments

    add_model_loading_arguments(verifier)
    for flag, setting in (
        ("--torch-threads", "torch_threads"),
        ("--max-batch", "max_batch"),
        ("--session-ttl", "session_ttl_s"),
        ("--max-sessions", "max_sessions"),
    ):
        verifier.add_argument(flag, **flag_options(VerifierConfig, setting))
    gateway = up.add_argument_group("gateway")
    gateway.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="generations in flight at once; more are refused (default 64)",
    )
    from gateway.launch.cli import DEFAULT_UP_HTTP_PORT, add_http_arguments, add_token_arguments

    add_token_arguments(gateway)
    add_server_tls_arguments(gateway)

    add_http_arguments(gateway, default_port=DEFAULT_UP_HTTP_PORT)
    add_draft_default_arguments(up)
    from gateway.launch.cli import add_verify_cost_argument

    add_verify_cost_argument(gateway)
    from draft_service.cli import add_learning_arguments

    add_learning_arguments(up.add_argument_group("learning (draft service and gateway)"))
    up.add_argument(
        "--startup-timeout", type=float, default=300.0, help="seconds each service may take"
    )
    up.add_argument(
        "--pin-cpus",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="give the verifier cores of its own (one per torch thread) and the draft service "
        "and gateway the others (off by default: on a busy small host the scheduler placed them "
        "better, see the docs/benchmarks.md)",
    )
    up.add_argument(
        "--metrics-port-base",
        type=int,
        default=None,
        metavar="P",
        help="serve Prometheus metrics: the gateway's on port P, the draft service's on P+1, "
        "the verifier's on P+2 (default: off)",
    )
    add_log_format_argument(up)
    up.set_defaults(handler=run_up)


def up_parser() -> argparse.ArgumentParser:
    """A parser of `up` alone (for tools that plan what `up` would start)."""
    parser = argparse.ArgumentParser(prog="speculant")
    register_up(parser.add_subparsers(dest="command", required=True))
    return parser


def _start(plan: ChildPlan) -> Child:
    command = [sys.executable, "-m", "launcher.cli", *plan.argv]
    process = subprocess.Popen(command, preexec_fn=child_setup(plan.cores))
    return Child(plan.name, plan.address, process, plan.port, plan.other_ports)


def run_up(args: argparse.Namespace) -> int:
    plan = plan_up(args)
    validate_plan(plan, args)  # CommandError: main prints it
    draft, verifier, gateway = plan.children
    children: list[Child] = []
    stop = {"requested": False}

    def on_signal(_signum: int, _frame: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    for note in plan.notes:
        print(f"up: {note}", flush=True)
    try:
        children += [_start(draft), _start(verifier)]
        for child in children:
            if not wait_ready(child, args.startup_timeout, stop):
                return 1
        children.append(_start(gateway))
        # Under TLS the health check (plaintext) cannot answer: its own listening socket does.
        check = args.tls_cert is None
        if not wait_ready(children[-1], args.startup_timeout, stop, health=check):
            return 1
        print(
            f"ready: gateway {gateway.address} (draft {draft.address}, verifier "
            f"{verifier.address}); Ctrl-C stops all\n"
            f"try: {_grpcurl_hint(args, gateway.address)}",
            flush=True,
        )
        if args.http_port:
            scheme = "http" if args.tls_cert is None else "https"
            print(
                f"HTTP API: {scheme}://{args.host}:{args.http_port} (OpenAI-compatible /v1, "
                "/metrics; --http-port 0 turns it off)",
                flush=True,
            )
        base = args.metrics_port_base
        if base is not None:
            print(
                f"metrics: http://{args.host}:{base}/metrics (gateway), "
                f"http://{BACKEND_HOST}:{base + 1}/metrics (draft), "
                f"http://{BACKEND_HOST}:{base + 2}/metrics (verifier)",
                flush=True,
            )
        while not stop["requested"]:
            for child in children:
                if child.process.poll() is not None:
                    fail(f"the {child.name} service exited (code {child.process.returncode})")
                    return 1
            time.sleep(0.2)
        return 0
    finally:
        stop_children(children)


def _grpcurl_hint(args: argparse.Namespace, address: str) -> str:
    """A grpcurl command for the gateway (grpcurl by its full path when it is in this Python's
    bin folder, a virtual environment that may not be on PATH)."""
    import shutil
    from pathlib import Path

    beside = Path(sys.executable).parent / "grpcurl"
    tool = shutil.which("grpcurl") or (str(beside) if beside.exists() else "grpcurl")
    security = "-plaintext" if args.tls_cert is None else f"-cacert {args.tls_cert}"
    token = args.auth_token_file or os.environ.get("SPECULANT_AUTH_TOKEN")
    auth = ' -H "authorization: Bearer $TOKEN"' if token else ""
    return (
        f'{tool} {security}{auth} -d \'{{"prompt": "Once upon a time", "max_tokens": 50, '
        f'"temperature": 0}}\' {address} speculant.v1.GatewayService/Generate'
    )
