"""What ``speculant up`` starts: the three services' command lines and cores for its flags
(:func:`plan_up`), and every check a child would fail, made before any starts
(:func:`validate_plan`): the children's command lines parsed by the services' own parsers, the
verifier's and the drafting settings validated, the token and TLS files read, the ports tried.

Defaults for the host: on a CPU device the verifier gets the usable cores but one as torch
threads (speculant.affinity.default_torch_threads); ``--pin-cpus`` also runs it on cores of its
own and the draft service and gateway on the others (not the default: measured slower, or no
faster, than leaving the placement to the scheduler on a 2-core host with other work; see
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from speculant.affinity import CoreSplit, default_torch_threads, split_cores
from speculant.children import port_is_free
from speculant.cli_errors import EXIT_USAGE, CommandError, warn
from speculant.draft_flags import draft_default_argv

BACKEND_HOST = "127.0.0.1"


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
    notes: list[str] = []
    threads, split = _verifier_threads(args, notes)
    verbose = ["-v"] if getattr(args, "verbose", False) else []  # DEBUG logs in the children
    draft = ChildPlan(
        "draft",
        BACKEND_HOST,
        args.draft_port,
        [*verbose, *_draft_argv(args)],
        split.other if split else None,
    )
    verifier = ChildPlan(
        "verifier",
        BACKEND_HOST,
        args.verifier_port,
        [*verbose, *_verifier_argv(args, threads)],
        split.model if split else None,
    )
    gateway = ChildPlan(
        "gateway",
        args.host,
        args.gateway_port,
        [*verbose, *_gateway_argv(args, draft.address, verifier.address)],
        split.other if split else None,
        (args.http_port,) if args.http_port else (),
    )
    return Plan([draft, verifier, gateway], notes)


def _verifier_threads(
    args: argparse.Namespace, notes: list[str]
) -> tuple[int | None, CoreSplit | None]:
    """The verifier's torch threads (None: its own choice) and, with --pin-cpus, the cores of
    the verifier and of the others; what was chosen goes to notes."""
    threads = args.torch_threads
    if threads is None and _device_type(args.device) == "cpu":
        import torch

        choice = default_torch_threads("cpu", torch.get_num_threads())
        threads = choice.threads
        notes.append(f"verifier: {threads} torch thread(s) ({choice.reason})")
    if not args.pin_cpus:
        return threads, None
    split = split_cores(threads or 1)
    if split is None:
        warn("--pin-cpus needs more usable cores than torch threads; not pinning")
    else:
        notes.append(
            f"pinned: verifier to CPU {_cpu_list(split.model)}, draft service and gateway "
            f"to CPU {_cpu_list(split.other)} (--pin-cpus)"
        )
    return threads, split


def _draft_argv(args: argparse.Namespace) -> list[str]:
    graphs = [word for graph in args.graph for word in ("--graph", graph)]
    return [
        "serve-draft",
        *graphs,
        *_optional("--default-graph", args.default_graph),
        *(["--catalog", args.catalog] if args.catalog else []),
        *_optional("--admin-token-file", args.admin_token_file),
        *("--host", BACKEND_HOST, "--port", str(args.draft_port)),
        *draft_default_argv(args),
        *_learning_flags(args),
        *_observability_args(args, 1),
    ]


def _verifier_argv(args: argparse.Namespace, threads: int | None) -> list[str]:
    return [
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
    ]


def _gateway_argv(args: argparse.Namespace, draft: str, verifier: str) -> list[str]:
    return [
        *("serve-gateway", "--draft", draft, "--verifier", verifier),
        *("--host", args.host, "--port", str(args.gateway_port)),
        *(["--no-learn"] if args.no_learn else []),
        *_optional("--max-concurrent", args.max_concurrent),
        *_optional("--auth-token-file", args.auth_token_file),
        *_optional("--admin-token-file", args.admin_token_file),
        *_optional("--tls-cert", args.tls_cert),
        *_optional("--tls-key", args.tls_key),
        *_optional("--tls-client-ca", args.tls_client_ca),
        *_http_flags(args),
        *("--verify-cost", args.verify_cost),
        *draft_default_argv(args),
        *_observability_args(args, 0),
    ]


def _http_flags(args: argparse.Namespace) -> list[str]:
    """The gateway's HTTP API flags, passed on as given (--http-port 0: off), and its chat
    template (as an absolute path: the child may run elsewhere)."""
    template = None if args.chat_template is None else Path(args.chat_template).resolve()
    return [
        *_optional("--http-port", args.http_port),
        *_optional("--http-model-name", args.http_model_name),
        *_optional("--chat-template", template),
    ]


def service_parser() -> argparse.ArgumentParser:
    """A parser of the three services' commands (serve-draft, serve-verifier, serve-gateway),
    made from each package's own registration: what `up` checks its children's flags with."""
    from draft_service import cli as draft_cli
    from gateway.launch import cli as gateway_cli
    from verifier_service import cli as verifier_cli

    parser = argparse.ArgumentParser(prog="speculant")
    parser.add_argument("-v", "--verbose", action="store_true")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (draft_cli, verifier_cli, gateway_cli):
        module.register(subparsers)
    return parser


def validate_plan(plan: Plan, args: argparse.Namespace) -> None:
    """Check everything a child would refuse, before any child starts: CommandError (exit 2
    for a flag, 1 for a port in use)."""
    base = args.metrics_port_base
    if base is not None and not 1 <= base <= 65533:
        raise CommandError(f"--metrics-port-base must be in 1..65533, got {base}", EXIT_USAGE)
    _check_settings(args, _parse_children(plan))
    for flag, value, low in (
        ("--torch-threads", args.torch_threads, 1),
        ("--max-batch", args.max_batch, 1),
        ("--max-sessions", args.max_sessions, 1),
        ("--max-concurrent", args.max_concurrent, 1),
    ):
        if value is not None and value < low:
            raise CommandError(f"{flag} must be >= {low}, got {value}", EXIT_USAGE)
    _check_ports(plan, args)


def _parse_children(plan: Plan) -> dict[str, argparse.Namespace]:
    """Each child's command line parsed by its service's own parser (exit 2 if one fails)."""
    parser = service_parser()
    parsed = {}
    for child in plan.children:
        with contextlib.redirect_stderr(_Discard()):
            try:
                parsed[child.name] = parser.parse_args(child.argv)
            except SystemExit:
                raise CommandError(f"bad flags for the {child.name} service", EXIT_USAGE) from None
    return parsed


def _check_settings(args: argparse.Namespace, parsed: dict[str, argparse.Namespace]) -> None:
    """The settings each service validates at its start: the verifier's, the drafting and
    learning defaults, the token file, the TLS files and the verify cost."""
    from draft_service.cli import catalog_from_args, learning_from_args
    from gateway.launch.commands import chat_template_from_args, check_verify_cost
    from speculant.auth import check_admin_token, load_admin_token, load_client_tokens
    from speculant.draft_flags import draft_defaults_from_args
    from speculant.errors import InvalidArgumentError
    from speculant.tls import server_tls_from_args
    from verifier_service.cli import config_from_args

    try:
        config_from_args(parsed["verifier"])  # CommandError naming the setting
        draft_defaults_from_args(args)
        learning_from_args(args)
        catalog_from_args(args)
        check_admin_token(
            load_admin_token(args.admin_token_file), load_client_tokens(args.auth_token_file)
        )
        server_tls_from_args(parsed["gateway"])
        check_verify_cost(args.verify_cost)
        chat_template_from_args(args)
    except (InvalidArgumentError, ValueError) as exc:
        raise CommandError(exc, EXIT_USAGE) from None


def _check_ports(plan: Plan, args: argparse.Namespace) -> None:
    """Every port distinct and free (exit 1 naming a port in use)."""
    ports = [(c.name, c.host, c.port) for c in plan.children]
    if args.http_port:
        ports.append(("HTTP API", args.host, args.http_port))
    base = args.metrics_port_base
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
