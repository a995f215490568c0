"""The `speculant load` command: its flags, their checks, and the report it prints of a load
test of a gateway's gRPC API (:mod:`bench.load`) or of its HTTP API (:mod:`bench.load_http`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.load import parse_mix, run_load
from bench.load_stats import is_loopback, latency_line


def register_load(subparsers: argparse._SubParsersAction) -> None:
    from speculant.tls import add_client_tls_arguments

    p = subparsers.add_parser(
        "load",
        help="closed-loop load test of a running gateway on this machine (bounded)",
        description="Load a gateway on this machine: its gRPC API (--gateway) or its "
        "OpenAI-compatible HTTP API (--http, streamed completions or chat; concurrency "
        "1..64, at most 60 s).",
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--gateway", help="HOST:PORT of the gateway's gRPC API (loopback only)")
    target.add_argument(
        "--http",
        metavar="URL",
        help="http://HOST:PORT of the gateway's HTTP API (loopback only): streamed OpenAI "
        "requests (see --endpoint)",
    )
    p.add_argument(
        "--endpoint",
        choices=["completions", "chat"],
        default="completions",
        help="with --http: /v1/completions or /v1/chat/completions",
    )
    p.add_argument(
        "--concurrency", type=int, default=4, help="streams in flight (1..256; --http: 1..64)"
    )
    p.add_argument(
        "--duration", type=float, default=30.0, help="seconds (at most 3600; --http: 60)"
    )
    p.add_argument("--prompts", default=None, help="JSON lines with `prompt` (default: demo)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--pids", default="", help="service pids whose RSS to report, comma separated")
    p.add_argument(
        "--mix",
        default="stream=1",
        help="request kinds by weight: stream, unary, cancel, bad (e.g. "
        "stream=4,unary=2,cancel=1,bad=1; default: streams only)",
    )
    p.add_argument(
        "--health",
        default="",
        help="addresses to health-check every second during the run, comma separated",
    )
    p.add_argument(
        "--verifier", default=None, help="the verifier's HOST:PORT: report its session counters"
    )
    p.add_argument("--auth-token-file", default=None, help="bearer token file (see serve-gateway)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the figures here")
    add_client_tls_arguments(p, "--tls", "the gateway")
    p.set_defaults(handler=run_load_command)


def _print_report(report: dict[str, Any]) -> None:
    errors = ", ".join(f"{k} {v}" for k, v in sorted(report["errors"].items())) or "none"
    unexpected = report.get("unexpected") or {}
    outcomes = "; ".join(
        f"{kind}: " + ", ".join(f"{c} {n}" for c, n in sorted(codes.items()))
        for kind, codes in (report.get("outcomes") or {}).items()
    )
    print(
        f"{report['requests']} requests in {report['duration_s']:.1f} s at concurrency "
        f"{report['concurrency']}: {report['tokens_per_second']:.0f} tokens/s; errors: {errors}\n"
        f"{latency_line(report)}"
    )
    print(f"outcomes: {outcomes or '-'}; unexpected codes: {unexpected or 'none'}")
    for moment in ("start", "end"):
        state = report[moment]
        rss = ", ".join(
            f"pid {pid} {'-' if b is None else f'{b / 2**20:.0f} MiB'}"
            for pid, b in state["rss_bytes"].items()
        )
        print(f"{moment}: RSS {rss or '-'}")
    for address, tally in (report.get("health") or {}).items():
        print(
            f"health {address}: {tally['answered']}/{tally['checks']} answered "
            f"({tally['serving']} SERVING), slowest {tally['max_ms']:.0f} ms"
        )
    sessions = report.get("verifier_sessions")
    if sessions:
        print(
            f"verifier sessions: {sessions['created']} created, {sessions['released']} released, "
            f"{sessions['expired']} expired, {sessions['live_at_end']} live at the end"
        )


def run_http_load_command(args: argparse.Namespace) -> int:
    """`speculant load --http URL`."""
    from bench.load_http import check_http_target, print_http_report, run_http_load
    from bench.settings import default_prompts_path, load_prompt_texts
    from speculant.auth import load_token
    from speculant.cli_errors import fail, usage_error
    from speculant.errors import SpeculantError

    problem = check_http_target(args.http, args.concurrency, args.duration)
    if problem is not None:
        return usage_error(problem)
    try:
        report = run_http_load(
            args.http,
            load_prompt_texts(args.prompts or default_prompts_path()),
            concurrency=args.concurrency,
            duration_s=args.duration,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            endpoint=args.endpoint,
            token=load_token(args.auth_token_file),
        )
    except (SpeculantError, OSError, ValueError, KeyError) as exc:
        return fail(str(exc))
    return _report(report, print_http_report, args.json)


def _report(report: dict[str, Any], show: Any, json_path: str | None) -> int:
    """Print the report with `show`, and write it as JSON to json_path if given; 0."""
    show(report)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def run_load_command(args: argparse.Namespace) -> int:
    from bench.settings import default_prompts_path, load_prompt_texts
    from speculant.auth import bearer_metadata, load_token
    from speculant.cli_errors import fail, usage_error
    from speculant.errors import SpeculantError
    from speculant.tls import client_tls_from_args

    if args.http is not None:
        return run_http_load_command(args)
    if not is_loopback(args.gateway):
        return usage_error(
            f"--gateway: {args.gateway} is not a loopback address (load tests stay local)"
        )
    if not 1 <= args.concurrency <= 256:
        return usage_error(f"--concurrency: must be in 1..256, got {args.concurrency}")
    if not 0 < args.duration <= 3600:
        return usage_error(f"--duration: must be in (0, 3600] seconds, got {args.duration}")
    try:
        pids = [int(p) for p in args.pids.split(",") if p.strip()]
    except ValueError:
        return usage_error(f"--pids: not a comma-separated list of integers: {args.pids!r}")
    try:
        mix = parse_mix(args.mix)
    except ValueError as exc:
        return usage_error(str(exc))
    health = [a.strip() for a in args.health.split(",") if a.strip()]
    for address in [*health, *([args.verifier] if args.verifier else [])]:
        if not is_loopback(address):
            return usage_error(f"{address} is not a loopback address (load tests stay local)")
    try:
        prompts = load_prompt_texts(args.prompts or default_prompts_path())
        report = run_load(
            args.gateway,
            prompts,
            concurrency=args.concurrency,
            duration_s=args.duration,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            metadata=bearer_metadata(load_token(args.auth_token_file)),
            tls=client_tls_from_args(args, "--tls"),
            pids=pids,
            mix=mix,
            health=health,
            verifier=args.verifier,
        )
    except (SpeculantError, OSError, ValueError, KeyError) as exc:
        return fail(str(exc))
    return _report(report, _print_report, args.json)
