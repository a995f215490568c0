"""`speculant up`: the three services as child processes on localhost, stopped together.

Every flag is checked before anything starts: the children's command lines are parsed by their
own parsers, the verifier's and the drafting settings validated, the token and TLS files read,
and the ports tried. A service counts as ready only when its health check answers SERVING *and*
the answering socket is its own (another stack already on the port must not pass for it).

Defaults for the host: on a CPU device the verifier gets the usable cores but one as torch
threads (speculant.affinity.default_torch_threads); ``--pin-cpus`` also runs it on cores of its
own and the draft service and gateway on the others (not the default: measured slower, or no
faster, than leaving the placement to the scheduler on a 2-core host with other work; see
docs/benchmarks.md). What was chosen is printed at start-up.

Children get SIGTERM when `up` exits (and, on Linux, when `up` itself dies: PR_SET_PDEATHSIG),
so no orphan keeps a port or a model in memory.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from speculant.affinity import (
    CoreSplit,
    default_torch_threads,
    split_cores,
)
from speculant.cli_errors import EXIT_USAGE, CommandError, fail, warn
from speculant.draft_flags import add_draft_default_arguments, draft_default_argv
from speculant.health import wait_until_serving
from speculant.request_context import add_log_format_argument
from speculant.tls import add_server_tls_arguments

PR_SET_PDEATHSIG = 1
BACKEND_HOST = "127.0.0.1"


def register_up(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up",
        help="start draft, verifier and gateway services together on localhost",
        description="Start the draft service, the verifier and the gateway as child processes "
        "and stop them together (Ctrl-C). The draft and verifier services listen on "
        f"{BACKEND_HOST} only; the gateway on --host, with its token, TLS and HTTP API.",
    )
    up.add_argument("--graph", required=True, help="graph directory (from `speculant build`)")
    up.add_argument("--model", required=True, help="hub name or local folder of the model")
    up.add_argument("--host", default="127.0.0.1", help="address the gateway listens on")
    up.add_argument("--gateway-port", type=int, default=50050, help="the gateway's gRPC port")
    up.add_argument("--draft-port", type=int, default=50051, help="the draft service's port")
    up.add_argument("--verifier-port", type=int, default=50052, help="the verifier's port")
    verifier = up.add_argument_group("verifier")
    from verifier_service.cli import add_model_loading_arguments

    add_model_loading_arguments(verifier)
    verifier.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="verifier torch threads (default on a CPU: the usable cores but one)",
    )
    verifier.add_argument(
        "--max-batch", type=int, default=None, help="Verify calls per forward pass (default 8)"
    )
    verifier.add_argument(
        "--session-ttl", type=float, default=None, help="idle seconds before a session expires"
    )
    verifier.add_argument("--max-sessions", type=int, default=None, help="cap on live sessions")
    gateway = up.add_argument_group("gateway")
    gateway.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="generations in flight at once; more are refused (default 64)",
    )
    gateway.add_argument(
        "--auth-token-file",
        default=None,
        help="clients must send 'authorization: Bearer <token>' with the token in this file "
        "(default: $SPECULANT_AUTH_TOKEN if set, else no authentication)",
    )
    add_server_tls_arguments(gateway)
    from gateway.cli import DEFAULT_UP_HTTP_PORT, add_http_arguments

    add_http_arguments(gateway, default_port=DEFAULT_UP_HTTP_PORT)
    add_draft_default_arguments(up)
    from gateway.cli import add_verify_cost_argument

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


@dataclass
class ChildPlan:
    """What to start: a service's name, address, command line and cores (None: unpinned)."""

    name: str
    host: str
    port: int
    argv: list[str]
    cores: frozenset[int] | None = None
    other_ports: tuple[int, ...] = ()  # more ports it must listen on to be ready (HTTP API)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass
class Plan:
    children: list[ChildPlan]
    notes: list[str] = field(default_factory=list)  # what was chosen for this host


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


def _optional(flag: str, value: object) -> list[str]:
    return [] if value is None else [flag, str(value)]


def _cpu_list(cores: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cores))


def _device_type(device: str) -> str:
    """cpu or cuda, as the verifier will resolve `device`."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def plan_up(args: argparse.Namespace) -> Plan:
    """The three children's command lines and cores for these flags (nothing is started)."""
    device = _device_type(args.device)
    notes: list[str] = []
    threads = args.torch_threads
    if threads is None and device == "cpu":
        import torch

        choice = default_torch_threads(device, torch.get_num_threads())
        threads = choice.threads
        notes.append(f"verifier: {threads} torch thread(s) ({choice.reason})")
    split: CoreSplit | None = None
    if args.pin_cpus:
        split = split_cores(threads or 1)
        if split is None:
            warn("--pin-cpus needs more usable cores than torch threads; not pinning")
        else:
            notes.append(
                f"pinned: verifier to CPU {_cpu_list(split.model)}, draft service and gateway "
                f"to CPU {_cpu_list(split.other)} (--pin-cpus)"
            )
    verbose = ["-v"] if getattr(args, "verbose", False) else []  # DEBUG logs in the children
    draft = ChildPlan(
        "draft",
        BACKEND_HOST,
        args.draft_port,
        [
            *verbose,
            *("serve-draft", "--graph", args.graph),
            *("--host", BACKEND_HOST, "--port", str(args.draft_port)),
            *draft_default_argv(args),
            *_learning_flags(args),
            *_observability_args(args, 1),
        ],
        split.other if split else None,
    )
    verifier = ChildPlan(
        "verifier",
        BACKEND_HOST,
        args.verifier_port,
        [
            *verbose,
            *("serve-verifier", "--model", args.model),
            *("--host", BACKEND_HOST, "--port", str(args.verifier_port)),
            *("--device", args.device, "--dtype", args.dtype),
            *("--download-mode", args.download_mode),
            *_optional("--hf-token", args.hf_token),
            *_optional("--torch-threads", threads),
            *_optional("--max-batch", args.max_batch),
            *_optional("--session-ttl", args.session_ttl),
            *_optional("--max-sessions", args.max_sessions),
            *_observability_args(args, 2),
        ],
        split.model if split else None,
    )
    gateway = ChildPlan(
        "gateway",
        args.host,
        args.gateway_port,
        [
            *verbose,
            *("serve-gateway", "--draft", draft.address, "--verifier", verifier.address),
            *("--host", args.host, "--port", str(args.gateway_port)),
            *(["--no-learn"] if args.no_learn else []),
            *_optional("--max-concurrent", args.max_concurrent),
            *_optional("--auth-token-file", args.auth_token_file),
            *_optional("--tls-cert", args.tls_cert),
            *_optional("--tls-key", args.tls_key),
            *_optional("--tls-client-ca", args.tls_client_ca),
            *_http_flags(args),
            *("--verify-cost", args.verify_cost),
            *draft_default_argv(args),
            *_observability_args(args, 0),
        ],
        split.other if split else None,
        (args.http_port,) if args.http_port else (),
    )
    return Plan([draft, verifier, gateway], notes)


def _http_flags(args: argparse.Namespace) -> list[str]:
    """The gateway's HTTP API flags, passed on as given (--http-port 0: off)."""
    return [
        *_optional("--http-port", args.http_port),
        *_optional("--http-model-name", args.http_model_name),
    ]


def service_parser() -> argparse.ArgumentParser:
    """A parser of the three services' commands (serve-draft, serve-verifier, serve-gateway),
    made from each package's own registration: what `up` checks its children's flags with."""
    from draft_service import cli as draft_cli
    from gateway import cli as gateway_cli
    from verifier_service import cli as verifier_cli

    parser = argparse.ArgumentParser(prog="speculant")
    parser.add_argument("-v", "--verbose", action="store_true")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (draft_cli, verifier_cli, gateway_cli):
        module.register(subparsers)
    return parser


def up_parser() -> argparse.ArgumentParser:
    """A parser of `up` alone (for tools that plan what `up` would start)."""
    parser = argparse.ArgumentParser(prog="speculant")
    register_up(parser.add_subparsers(dest="command", required=True))
    return parser


def validate_plan(plan: Plan, args: argparse.Namespace) -> None:
    """Check everything a child would refuse, before any child starts: CommandError (exit 2
    for a flag, 1 for a port in use)."""
    from draft_service.cli import learning_from_args
    from gateway.cli import check_verify_cost
    from speculant.auth import load_token
    from speculant.draft_flags import draft_defaults_from_args
    from speculant.errors import InvalidArgumentError
    from speculant.tls import server_tls_from_args
    from verifier_service.cli import config_from_args

    base = args.metrics_port_base
    if base is not None and not 1 <= base <= 65533:
        raise CommandError(f"--metrics-port-base must be in 1..65533, got {base}", EXIT_USAGE)
    parser = service_parser()
    parsed = {}
    for child in plan.children:
        with contextlib.redirect_stderr(_Discard()):
            try:
                parsed[child.name] = parser.parse_args(child.argv)
            except SystemExit:
                parsed[child.name] = None
        if parsed[child.name] is None:
            raise CommandError(f"bad flags for the {child.name} service", EXIT_USAGE)
    try:
        config_from_args(parsed["verifier"])  # CommandError naming the setting
        draft_defaults_from_args(args)
        learning_from_args(args)
        load_token(args.auth_token_file)
        server_tls_from_args(parsed["gateway"])
        check_verify_cost(args.verify_cost)
    except (InvalidArgumentError, ValueError) as exc:
        raise CommandError(exc, EXIT_USAGE) from None
    for flag, value, low in (
        ("--torch-threads", args.torch_threads, 1),
        ("--max-batch", args.max_batch, 1),
        ("--max-sessions", args.max_sessions, 1),
        ("--max-concurrent", args.max_concurrent, 1),
    ):
        if value is not None and value < low:
            raise CommandError(f"{flag} must be >= {low}, got {value}", EXIT_USAGE)
    ports = [(c.name, c.host, c.port) for c in plan.children]
    if args.http_port:
        ports.append(("HTTP API", args.host, args.http_port))
    if base is not None:
        ports += [
            (f"{name} metrics", host, base + offset)
            for name, host, offset in (
                ("gateway", args.host, 0),
                ("draft", BACKEND_HOST, 1),
                ("verifier", BACKEND_HOST, 2),
            )
        ]
    numbers = [port for _, _, port in ports]
    if len(set(numbers)) != len(numbers):
        raise CommandError(f"two services were given the same port: {numbers}", EXIT_USAGE)
    for name, host, port in ports:
        if not port_is_free(host, port):
            raise CommandError(
                f"port {port} on {host} ({name}) is in use: stop what listens there, or pick "
                "another port"
            )


class _Discard:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def port_is_free(host: str, port: int) -> bool:
    """Whether nothing listens on host:port (a bind with SO_REUSEADDR succeeds, as gRPC's
    does: a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def listens_on(pid: int, port: int) -> bool:
    """Whether process pid has a listening socket on port (True where it cannot be seen)."""
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="inet")
    except (psutil.AccessDenied, NotImplementedError):
        return True
    except psutil.NoSuchProcess:
        return False
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections
    )


def child_setup(cores: frozenset[int] | None) -> Callable[[], None]:
    """preexec_fn for a child process: it gets SIGTERM when its parent dies (Linux), and runs
    on `cores` when given (None: wherever the parent may)."""

    def setup() -> None:
        # Not on Linux: `up` still stops its children when it exits normally.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if cores is not None and hasattr(os, "sched_setaffinity"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cores)  # every thread it starts inherits it

    return setup


def _die_with_parent() -> None:
    """preexec_fn for a child that must not outlive this process (Linux)."""
    child_setup(None)()


@dataclass
class Child:
    name: str
    address: str
    process: subprocess.Popen
    port: int = 0
    other_ports: tuple[int, ...] = ()


def _start(plan: ChildPlan) -> Child:
    command = [sys.executable, "-m", "speculant.cli", *plan.argv]
    process = subprocess.Popen(command, preexec_fn=child_setup(plan.cores))
    return Child(plan.name, plan.address, process, plan.port, plan.other_ports)


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
            if not _wait_ready(child, args.startup_timeout, stop):
                return 1
        children.append(_start(gateway))
        # Under TLS the health check (plaintext) cannot answer: its own listening socket does.
        check = args.tls_cert is None
        if not _wait_ready(children[-1], args.startup_timeout, stop, health=check):
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


def _wait_ready(
    child: Child, timeout_s: float, stop: dict[str, bool], *, health: bool = True
) -> bool:
    """Wait until the child serves: its health SERVING on its address (unless health is
    False), from its own listening socket, and it listens on its other ports."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop["requested"]:
        if child.process.poll() is not None:
            fail(f"the {child.name} service failed to start (code {child.process.returncode})")
            return False
        serving = wait_until_serving(child.address, timeout_s=0.5) if health else True
        ports = (child.port, *child.other_ports)
        if serving and all(listens_on(child.process.pid, port) for port in ports):
            return True
        if not health:
            time.sleep(0.1)
    if not stop["requested"]:
        fail(f"the {child.name} service did not become ready in {timeout_s:.0f} s")
    return False
