"""`speculant load`: a bounded closed-loop load test of a running gateway (loopback only).

N workers each send GenerateStream requests back to back for S seconds (prompts taken in turn
from a prompts file). Reported: time to first token (TTFT: request sent -> first chunk with
tokens) and inter-token latency (ITL: the gap between chunks divided by the tokens the later
chunk carries) as p50 / p99, generated tokens per second over the run, errors by gRPC status
code, and, when given, each service's RSS (by pid) at the start and at the end. (Graphs are
opened read-only without a lock file, being immutable once published, so no LMDB reader slots
exist to count or to leak.)
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK_NAMES = ("localhost",)


@dataclass
class LoadResults:
    """What the workers measured (lists of seconds; counters)."""

    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    errors: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ttft: float | None, itl: list[float], tokens: int, error: str | None) -> None:
        with self.lock:
            self.requests += 1
            self.tokens += tokens
            self.itl.extend(itl)
            if ttft is not None:
                self.ttft.append(ttft)
            if error is not None:
                self.errors[error] += 1


def is_loopback(address: str) -> bool:
    """Whether HOST:PORT names this machine's loopback interface."""
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), nearest rank; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))  # 1-based
    return ordered[min(rank, len(ordered)) - 1]


def rss_bytes(pids: list[int]) -> dict[str, int | None]:
    import psutil

    out: dict[str, int | None] = {}
    for pid in pids:
        try:
            out[str(pid)] = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            out[str(pid)] = None
    return out


def _worker(
    stub: Any,
    requests: list[Any],
    metadata: tuple,
    deadline: float,
    results: LoadResults,
    offset: int,
) -> None:
    import grpc

    index = offset
    while time.monotonic() < deadline:
        request = requests[index % len(requests)]
        index += 1
        started = last = time.perf_counter()
        ttft, itl, tokens, error = None, [], 0, None
        try:
            for chunk in stub.GenerateStream(request, timeout=120, metadata=metadata):
                now = time.perf_counter()
                count = len(chunk.token_ids)
                if count:
                    if ttft is None:
                        ttft = now - started
                    else:
                        itl.extend([(now - last) / count] * count)
                    last = now
                    tokens += count
        except grpc.RpcError as exc:
            error = exc.code().name
        results.add(ttft, itl, tokens, error)


def run_load(
    gateway: str,
    prompts: list[str],
    *,
    concurrency: int,
    duration_s: float,
    max_tokens: int,
    temperature: float,
    metadata: tuple = (),
    tls: Any = None,
    pids: list[int] | None = None,
) -> dict[str, Any]:
    """Run the load and return every figure (see the module docstring)."""
    from speculant.tls import open_channel
    from speculant.v1 import gateway_pb2, gateway_pb2_grpc

    pids = pids or []
    requests = [
        gateway_pb2.GenerateRequest(prompt=p, max_tokens=max_tokens, temperature=temperature)
        for p in prompts
    ]
    start_state = {"rss_bytes": rss_bytes(pids)}
    results = LoadResults()
    with open_channel(gateway, tls) as channel:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        started = time.monotonic()
        deadline = started + duration_s
        workers = [
            threading.Thread(
                target=_worker, args=(stub, requests, metadata, deadline, results, i), daemon=True
            )
            for i in range(concurrency)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        elapsed = time.monotonic() - started
    end_state = {"rss_bytes": rss_bytes(pids)}

    def ms(value: float | None) -> float | None:
        return None if value is None else value * 1e3

    def p50_p99(values: list[float]) -> dict[str, float | None]:
        return {"p50": ms(percentile(values, 50)), "p99": ms(percentile(values, 99))}

    return {
        "gateway": gateway,
        "concurrency": concurrency,
        "duration_s": elapsed,
        "requests": results.requests,
        "errors": dict(results.errors),
        "tokens": results.tokens,
        "tokens_per_second": results.tokens / elapsed if elapsed > 0 else 0.0,
        "ttft_ms": p50_p99(results.ttft),
        "itl_ms": p50_p99(results.itl),
        "ttft_ms_mean": ms(statistics.mean(results.ttft)) if results.ttft else None,
        "start": start_state,
        "end": end_state,
    }


def register_load(subparsers: argparse._SubParsersAction) -> None:
    from speculant.tls import add_client_tls_arguments

    p = subparsers.add_parser(
        "load", help="closed-loop load test of a running gateway on this machine (bounded)"
    )
    p.add_argument("--gateway", required=True, help="HOST:PORT of the gateway (loopback only)")
    p.add_argument("--concurrency", type=int, default=4, help="streams in flight (1..256)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds (at most 3600)")
    p.add_argument("--prompts", default=None, help="JSON lines with `prompt` (default: demo)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--pids", default="", help="service pids whose RSS to report, comma separated")
    p.add_argument("--auth-token-file", default=None, help="bearer token file (see serve-gateway)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the figures here")
    add_client_tls_arguments(p, "--tls", "the gateway")
    p.set_defaults(handler=run_load_command)


def _print_report(report: dict[str, Any]) -> None:
    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    errors = ", ".join(f"{k} {v}" for k, v in sorted(report["errors"].items())) or "none"
    print(
        f"{report['requests']} requests in {report['duration_s']:.1f} s at concurrency "
        f"{report['concurrency']}: {report['tokens_per_second']:.0f} tokens/s; errors: {errors}\n"
        f"time to first token p50 {fmt(report['ttft_ms']['p50'])} ms, "
        f"p99 {fmt(report['ttft_ms']['p99'])} ms; inter-token latency p50 "
        f"{fmt(report['itl_ms']['p50'])} ms, p99 {fmt(report['itl_ms']['p99'])} ms"
    )
    for moment in ("start", "end"):
        state = report[moment]
        rss = ", ".join(
            f"pid {pid} {'-' if b is None else f'{b / 2**20:.0f} MiB'}"
            for pid, b in state["rss_bytes"].items()
        )
        print(f"{moment}: RSS {rss or '-'}")


def run_load_command(args: argparse.Namespace) -> int:
    from gateway.bench import default_prompts_path, load_prompts
    from speculant.auth import bearer_metadata, load_token
    from speculant.cli_errors import fail, usage_error
    from speculant.errors import SpeculantError
    from speculant.tls import client_tls_from_args

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
        prompts = load_prompts(args.prompts or default_prompts_path())
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
        )
    except (SpeculantError, OSError, ValueError, KeyError) as exc:
        return fail(str(exc))
    _print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0
