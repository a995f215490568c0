"""`speculant up`: the three services as child processes on localhost, stopped together.

Children get SIGTERM when `up` exits (and, on Linux, when `up` itself dies: PR_SET_PDEATHSIG),
so no orphan keeps a port or a model in memory.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from speculant.affinity import pin_process, split_cores
from speculant.health import wait_until_serving
from speculant.request_context import add_log_format_argument

PR_SET_PDEATHSIG = 1


def register_up(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up", help="start draft, verifier and gateway services together on localhost"
    )
    up.add_argument("--graph", required=True)
    up.add_argument("--model", required=True)
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--gateway-port", type=int, default=50050)
    up.add_argument("--draft-port", type=int, default=50051)
    up.add_argument("--verifier-port", type=int, default=50052)
    up.add_argument("--device", default="auto")
    up.add_argument("--torch-threads", type=int, default=None, help="verifier torch threads")
    up.add_argument(
        "--max-batch", type=int, default=None, help="verifier: Verify calls per forward pass"
    )
    up.add_argument("--startup-timeout", type=float, default=300.0)
    up.add_argument(
        "--pin-cpus",
        action="store_true",
        help="give the verifier its own cores (one per torch thread; --torch-threads defaults "
        "to 1 then) and the draft service and gateway the others: faster rounds on small hosts",
    )
    from draft_service.cli import add_learning_arguments
    from gateway.cli import add_http_arguments

    add_http_arguments(up)
    add_learning_arguments(up)
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


def _observability_args(args: argparse.Namespace, offset: int) -> list[str]:
    """--log-format, and --metrics-port P+offset with --metrics-port-base P, for a child."""
    extra = ["--log-format", args.log_format]
    if args.metrics_port_base is not None:
        extra += ["--metrics-port", str(args.metrics_port_base + offset)]
    return extra


def _learning_flags(args: argparse.Namespace) -> list[str]:
    """serve-draft's learning flags, as given to up."""
    if args.no_learn:
        return ["--no-learn"]
    flags = ["--learn-memory", str(args.learn_memory), "--learn-weight", str(args.learn_weight)]
    return flags + (["--learn-log", args.learn_log] if args.learn_log else [])


def _cpu_list(cores: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


def _die_with_parent() -> None:
    # Not on Linux: `up` still stops its children when it exits normally.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    address: str
    process: subprocess.Popen


def _start(name: str, address: str, args: list[str]) -> Child:
    command = [sys.executable, "-m", "speculant.cli", *args]
    process = subprocess.Popen(command, preexec_fn=_die_with_parent)
    return Child(name, address, process)


def stop_children(children: list[Child], grace_s: float = 10.0) -> None:
    """SIGTERM every child, then SIGKILL whoever is still running after grace_s."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def run_up(args: argparse.Namespace) -> int:
    host = args.host
    base = args.metrics_port_base
    verbose = ["-v"] if getattr(args, "verbose", False) else []  # DEBUG logs in the children
    if base is not None and not 1 <= base <= 65533:
        print(f"error: --metrics-port-base must be in 1..65533, got {base}", file=sys.stderr)
        return 2
    draft = f"{host}:{args.draft_port}"
    verifier = f"{host}:{args.verifier_port}"
    gateway = f"{host}:{args.gateway_port}"
    children: list[Child] = []
    stop = {"requested": False}

    def on_signal(_signum: int, _frame: object) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    split = None
    if args.pin_cpus:
        args.torch_threads = args.torch_threads or 1
        split = split_cores(args.torch_threads)
        if split is None:
            print("warning: --pin-cpus needs more cores than torch threads; not pinning")
    try:
        children.append(
            _start(
                "draft",
                draft,
                [
                    *verbose,
                    "serve-draft",
                    "--graph",
                    args.graph,
                    "--host",
                    host,
                    "--port",
                    str(args.draft_port),
                    *_learning_flags(args),
                    *_observability_args(args, 1),
                ],
            )
        )
        children.append(
            _start(
                "verifier",
                verifier,
                [
                    *verbose,
                    "serve-verifier",
                    "--model",
                    args.model,
                    "--host",
                    host,
                    "--port",
                    str(args.verifier_port),
                    "--device",
                    args.device,
                    *(["--torch-threads", str(args.torch_threads)] if args.torch_threads else []),
                    *_observability_args(args, 2),
                    *(["--max-batch", str(args.max_batch)] if args.max_batch else []),
                ],
            )
        )
        for child in children:
            if not _wait_ready(child, args.startup_timeout, stop):
                return 1
        children.append(
            _start(
                "gateway",
                gateway,
                [
                    *verbose,
                    "serve-gateway",
                    "--draft",
                    draft,
                    "--verifier",
                    verifier,
                    "--host",
                    host,
                    "--port",
                    str(args.gateway_port),
                    *(["--no-learn"] if args.no_learn else []),
                    *_http_flags(args),
                    *_observability_args(args, 0),
                ],
            )
        )
        if not _wait_ready(children[-1], args.startup_timeout, stop):
            return 1
        if split is not None:
            for child in children:
                cores = split.model if child.name == "verifier" else split.other
                pin_process(child.process.pid, cores)
            print(
                f"pinned: verifier to CPU {_cpu_list(split.model)}, "
                f"draft and gateway to CPU {_cpu_list(split.other)}",
                flush=True,
            )
        print(
            f"ready: gateway {gateway} (draft {draft}, verifier {verifier}); Ctrl-C stops all\n"
            f'try: grpcurl -plaintext -d \'{{"prompt": "Once upon a time", '
            f'"max_tokens": 50, "temperature": 0}}\' {gateway} '
            "speculant.v1.GatewayService/Generate",
            flush=True,
        )
        if args.http_port:
            print(f"HTTP API: http://{host}:{args.http_port} (OpenAI-compatible /v1)", flush=True)
        if base is not None:
            print(
                f"metrics: http://{host}:{base}/metrics (gateway), :{base + 1} (draft), "
                f":{base + 2} (verifier)",
                flush=True,
            )
        while not stop["requested"]:
            for child in children:
                if child.process.poll() is not None:
                    print(
                        f"error: the {child.name} service exited (code {child.process.returncode})",
                        file=sys.stderr,
                    )
                    return 1
            time.sleep(0.2)
        return 0
    finally:
        stop_children(children)


def _http_flags(args: argparse.Namespace) -> list[str]:
    """The gateway's HTTP API flags, passed on as given."""
    flags = []
    if args.http_port is not None:
        flags += ["--http-port", str(args.http_port)]
    if args.http_model_name is not None:
        flags += ["--http-model-name", args.http_model_name]
    return flags


def _wait_ready(child: Child, timeout_s: float, stop: dict[str, bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop["requested"]:
        if child.process.poll() is not None:
            print(
                f"error: the {child.name} service failed to start "
                f"(code {child.process.returncode})",
                file=sys.stderr,
            )
            return False
        if wait_until_serving(child.address, timeout_s=0.5):
            return True
    if not stop["requested"]:
        print(
            f"error: the {child.name} service did not become ready in {timeout_s:.0f} s",
            file=sys.stderr,
        )
    return False
