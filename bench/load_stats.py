"""What both load generators (gRPC: bench.load, HTTP: bench.load_http) share: the loopback
check that keeps them on this machine by default, the closed loop of worker threads, the
latency samples they collect and how latencies are reported (percentiles, in milliseconds).

TTFT: time to first token (request sent -> first chunk with tokens); ITL: inter-token latency.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

LOOPBACK_NAMES = ("localhost",)


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


def p50_p99_ms(values: list[float]) -> dict[str, float | None]:
    """The p50 and p99 of values (seconds) in milliseconds (None without values)."""
    return {
        name: None if (v := percentile(values, q)) is None else v * 1e3
        for name, q in (("p50", 50), ("p99", 99))
    }


@dataclass
class LatencySamples:
    """What the workers measured (lists of seconds; counters), added to under `lock`."""

    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def figures(self, elapsed: float) -> dict[str, Any]:
        """Tokens, tokens per second over `elapsed` seconds, and TTFT and ITL p50 / p99 (ms)."""
        return {
            "tokens": self.tokens,
            "tokens_per_second": self.tokens / elapsed if elapsed > 0 else 0.0,
            "ttft_ms": p50_p99_ms(self.ttft),
            "itl_ms": p50_p99_ms(self.itl),
        }


def run_workers(work: Callable[[float, int], None], concurrency: int, duration_s: float) -> float:
    """Run work(deadline, index) on `concurrency` threads, index 0..concurrency-1, each until
    the deadline (time.monotonic) duration_s from now; the seconds until all had ended."""
    started = time.monotonic()
    deadline = started + duration_s
    workers = [
        threading.Thread(target=work, args=(deadline, i), daemon=True) for i in range(concurrency)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return time.monotonic() - started


def latency_line(report: dict[str, Any]) -> str:
    """The TTFT and ITL percentiles of a report, as printed ("-" without samples)."""

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    return (
        f"time to first token p50 {fmt(report['ttft_ms']['p50'])} ms, "
        f"p99 {fmt(report['ttft_ms']['p99'])} ms; inter-token latency p50 "
        f"{fmt(report['itl_ms']['p50'])} ms, p99 {fmt(report['itl_ms']['p99'])} ms"
    )
