"""The verifier's own Prometheus metrics, read from LocalVerifier.stats() at each scrape:

- ``speculant_verifier_live_sessions``: sessions holding a KV cache now;
- ``speculant_verifier_sessions_created_total``, ``..._released_total``, ``..._expired_total``;
- ``speculant_verifier_forward_passes_total``: model forward passes (prefills and verifies);
- ``speculant_verifier_draft_tokens_total``, ``speculant_verifier_accepted_tokens_total``:
  draft tokens verified and accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from speculant.types import VerifierStats

_COUNTERS = (
    ("sessions_created", "Sessions created (prefills)"),
    ("sessions_released", "Sessions released by their client"),
    ("sessions_expired", "Sessions expired after their idle TTL"),
    ("forward_passes", "Model forward passes (prefills and verifies)"),
    ("draft_tokens", "Draft tokens verified"),
    ("accepted_tokens", "Draft tokens accepted"),
)


class VerifierCollector(Collector):
    """Reports a verifier's stats() as gauges and counters."""

    def __init__(self, stats: Callable[[], VerifierStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        yield GaugeMetricFamily(
            "speculant_verifier_live_sessions",
            "Sessions holding a KV cache now",
            value=stats.live_sessions,
        )
        for name, documentation in _COUNTERS:
            yield CounterMetricFamily(
                f"speculant_verifier_{name}", documentation, value=getattr(stats, name)
            )
