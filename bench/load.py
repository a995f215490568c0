"""`speculant load`: a bounded closed-loop load test of a running gateway (loopback only).

N workers each send requests back to back for S seconds (prompts taken in turn from a prompts
file). By default every request is a GenerateStream; ``--mix`` interleaves request *kinds* by
weight: ``stream`` (GenerateStream read to its end), ``unary`` (Generate), ``cancel`` (a
GenerateStream cancelled after its first chunk) and ``bad`` (an invalid request, in turn: a
negative max_tokens, an empty prompt, a draft k of 0, a NaN temperature, an over-long stop
string, a prompt longer than any context). Each kind has its *expected* codes (OK; OK or
CANCELLED; INVALID_ARGUMENT or OUT_OF_RANGE); any other is *unexpected*.

Reported: time to first token (TTFT: request sent -> first chunk with tokens) and inter-token
latency (ITL: the gap between chunks divided by the tokens the later chunk carries) of the
streams as p50 / p99, generated tokens per second over the run, errors by gRPC status code,
outcomes and unexpected codes by kind, and, when given: each service's RSS (by pid) at the
start, its peak and at the end (sampled every second); every second a health check (1 s
deadline) of each ``--health`` address, counted answered or not; and the verifier's session
counters (``--verifier``): sessions created, released and expired during the run, and live at
its end. (Graphs are opened read-only without a lock file, being immutable once published, so
no LMDB reader slots exist to count or to leak.) The command's flags, checks and printed report
(of this gRPC load test or of :mod:`bench.load_http`'s) are at the end of this module.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from bench.load_stats import LatencySamples, is_loopback, latency_line, run_workers

KINDS = ("stream", "unary", "cancel", "bad")
EXPECTED_CODES = {
    "stream": {"OK"},
    "unary": {"OK"},
    "cancel": {"OK", "CANCELLED"},  # OK: it finished before its first chunk was read
    "bad": {"INVALID_ARGUMENT", "OUT_OF_RANGE"},
}


@dataclass
class LoadResults(LatencySamples):
    """What the workers measured, with the errors by gRPC status code and the outcomes by kind."""

    errors: Counter = field(default_factory=Counter)
    outcomes: dict[str, Counter] = field(default_factory=lambda: {k: Counter() for k in KINDS})

    def add(
        self,
        ttft: float | None,
        itl: list[float],
        tokens: int,
        error: str | None,
        kind: str = "stream",
    ) -> None:
        with self.lock:
            self.requests += 1
            self.tokens += tokens
            self.itl.extend(itl)
            if ttft is not None:
                self.ttft.append(ttft)
            if error is not None and kind != "bad" and error != "CANCELLED":
                self.errors[error] += 1
            self.outcomes[kind][error or "OK"] += 1

    def unexpected(self) -> dict[str, dict[str, int]]:
        """Codes outside each kind's EXPECTED_CODES, by kind."""
        return {
            kind: dict(bad)
            for kind, counts in self.outcomes.items()
            if (bad := {c: n for c, n in counts.items() if c not in EXPECTED_CODES[kind]})
        }


def parse_mix(text: str) -> list[str]:
    """``stream=4,unary=2,cancel=1,bad=1`` -> a schedule of kinds, each as often as its weight
    (ValueError naming the bad entry)."""
    schedule: list[str] = []
    for entry in (e.strip() for e in text.split(",") if e.strip()):
        kind, _, weight = entry.partition("=")
        if kind not in KINDS or not weight.isdigit():
            raise ValueError(f"--mix: {entry!r} is not KIND=WEIGHT with KIND one of {KINDS}")
        schedule += [kind] * int(weight)
    if not schedule:
        raise ValueError("--mix: give at least one KIND=WEIGHT with a weight > 0")
    return schedule


def rss_bytes(pids: list[int]) -> dict[str, int | None]:
    import psutil

    out: dict[str, int | None] = {}
    for pid in pids:
        try:
            out[str(pid)] = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            out[str(pid)] = None
    return out


def bad_requests(max_tokens: int) -> list[Any]:
    """Invalid GenerateRequests, one per kind of mistake (see the module docstring)."""
    from speculant.v1 import common_pb2, gateway_pb2

    prompt = "Once upon a time"
    return [
        gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=-1),
        gateway_pb2.GenerateRequest(prompt="", max_tokens=max_tokens),
        gateway_pb2.GenerateRequest(
            prompt=prompt, max_tokens=max_tokens, draft=common_pb2.DraftOptions(k=0)
        ),
        gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, temperature=math.nan),
        gateway_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, stop=["x" * 5000]),
        gateway_pb2.GenerateRequest(prompt=prompt * 62_500, max_tokens=max_tokens),  # 1 MB
    ]


def _worker(
    stub: Any,
    requests: list[Any],
    metadata: tuple,
    results: LoadResults,
    schedule: tuple[str, ...],
    bad: tuple[Any, ...],
    deadline: float,
    offset: int,
) -> None:
    import grpc

    index = offset
    while time.monotonic() < deadline:
        kind = schedule[index % len(schedule)]
        request = (bad if kind == "bad" else requests)[
            index % len(bad if kind == "bad" else requests)
        ]
        index += 1
        started = last = time.perf_counter()
        ttft, itl, tokens, error = None, [], 0, None
        try:
            if kind in ("unary", "bad"):
                response = stub.Generate(request, timeout=120, metadata=metadata)
                tokens = len(response.token_ids)
            else:
                call = stub.GenerateStream(request, timeout=120, metadata=metadata)
                for chunk in call:
                    now = time.perf_counter()
                    count = len(chunk.token_ids)
                    if count:
                        if ttft is None:
                            ttft = now - started
                        else:
                            itl.extend([(now - last) / count] * count)
                        last = now
                        tokens += count
                    if kind == "cancel" and count:
                        call.cancel()
        except grpc.RpcError as exc:
            error = exc.code().name
        if kind != "stream":
            ttft, itl = None, []  # latencies are the full streams'
        results.add(ttft, itl, tokens, error, kind)


class Probe:
    """Every second until stopped: each service's RSS (by pid) and a health check (1 s
    deadline) of each health address."""

    def __init__(self, pids: list[int], health: list[str]) -> None:
        self.pids = pids
        self.health = {a: {"checks": 0, "answered": 0, "serving": 0, "max_ms": 0.0} for a in health}
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-probe", daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        from speculant.health import health_status

        while not self._stop.wait(1.0):
            for pid, rss in rss_bytes(self.pids).items():
                if rss is not None:
                    self.peak[pid] = max(self.peak.get(pid, 0), rss)
            for address, tally in self.health.items():
                started = time.perf_counter()
                status = health_status(address, timeout_s=1.0)
                tally["checks"] += 1
                if status != "UNREACHABLE":
                    tally["answered"] += 1
                    tally["max_ms"] = max(tally["max_ms"], (time.perf_counter() - started) * 1e3)
                tally["serving"] += status == "SERVING"


def verifier_sessions(address: str | None, tls: Any = None) -> dict[str, int] | None:
    """The verifier's session counters (GetStats), or None without an address."""
    if address is None:
        return None
    from speculant.tls import open_channel
    from speculant.v1 import verifier_pb2, verifier_pb2_grpc

    with open_channel(address, tls) as channel:
        stats = verifier_pb2_grpc.VerifierServiceStub(channel).GetStats(
            verifier_pb2.GetStatsRequest(), timeout=10
        )
    return {
        "live": stats.live_sessions,
        "created": stats.sessions_created,
        "released": stats.sessions_released,
        "expired": stats.sessions_expired,
    }


def session_changes(
    before: dict[str, int] | None, address: str | None, tls: Any = None
) -> dict[str, int] | None:
    """The verifier's sessions created, released and expired since `before` (its counters at the
    start; None: not watched), and live at the start and at the end. Waits up to 10 s for the
    live sessions to fall back to the start's: cancelled streams release theirs meanwhile."""
    if before is None:
        return None
    settle = time.monotonic() + 10
    while True:
        after = verifier_sessions(address, tls)
        if after["live"] <= before["live"] or time.monotonic() > settle:
            break
        time.sleep(0.1)
    return {
        "created": after["created"] - before["created"],
        "released": after["released"] - before["released"],
        "expired": after["expired"] - before["expired"],
        "live_at_start": before["live"],
        "live_at_end": after["live"],
    }


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
    mix: list[str] | None = None,
    health: list[str] | None = None,
    verifier: str | None = None,
    verifier_tls: Any = None,
) -> dict[str, Any]:
    """Run the load and return every figure (see the module docstring). mix: a schedule of
    kinds (parse_mix; default all streams); health: addresses to health-check every second;
    verifier: the verifier's address, for its session counters."""
    from speculant.tls import open_channel
    from speculant.v1 import gateway_pb2, gateway_pb2_grpc

    pids = pids or []
    schedule = tuple(mix or ["stream"])
    requests = [
        gateway_pb2.GenerateRequest(prompt=p, max_tokens=max_tokens, temperature=temperature)
        for p in prompts
    ]
    bad = tuple(bad_requests(max_tokens))
    sessions_before = verifier_sessions(verifier, verifier_tls)
    start_state = {"rss_bytes": rss_bytes(pids)}
    results = LoadResults()
    with open_channel(gateway, tls) as channel, Probe(pids, health or []) as probe:
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        work = partial(_worker, stub, requests, metadata, results, schedule, bad)
        elapsed = run_workers(work, concurrency, duration_s)
    end_state = {"rss_bytes": rss_bytes(pids), "peak_rss_bytes": probe.peak}
    sessions = session_changes(sessions_before, verifier, verifier_tls)
    return {
        "gateway": gateway,
        "concurrency": concurrency,
        "duration_s": elapsed,
        "requests": results.requests,
        "errors": dict(results.errors),
        **results.figures(elapsed),
        "ttft_ms_mean": statistics.mean(results.ttft) * 1e3 if results.ttft else None,
        "mix": dict(Counter(schedule)),
        "outcomes": {k: dict(v) for k, v in results.outcomes.items() if v},
        "unexpected": results.unexpected(),
        "health": probe.health,
        "verifier_sessions": sessions,
        "start": start_state,
        "end": end_state,
    }


# -- the command line: `speculant load` --


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
