"""What both load generators (gRPC: bench.load, HTTP: bench.load_http) share: the loopback
check that keeps them on this machine by default, and latency percentiles."""

from __future__ import annotations

import ipaddress
import math

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
