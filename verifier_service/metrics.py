"""The verifier's own Prometheus metrics, read from LocalVerifier.stats() at each scrape:

- ``speculant_verifier_live_sessions``: sessions holding a KV cache now;
- ``speculant_verifier_sessions_created_total``, ``..._released_total``, ``..._expired_total``;
- ``speculant_verifier_forward_passes_total``: model forward passes (prefills and verifies);
- ``speculant_verifier_draft_tokens_total``, ``speculant_verifier_accepted_tokens_total``:
  draft tokens verified and accepted;
- ``speculant_verifier_forward_cost_seconds{new_tokens="n"}``: the cost profile, seconds of
  one forward over n new tokens (measured at start-up, refreshed from real Verify timings; see
  speculant.cost_profile), at n = 1, 2, 4, 8, 16, 32 and 65.
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


COST_POINTS = (1, 2, 4, 8, 16, 32, 65)  # new-token counts the cost profile is reported at


class VerifierCollector(Collector):
    """Reports a verifier's stats() as gauges and counters, and its cost profile."""

    def __init__(
        self, stats: Callable[[], VerifierStats], cost: Callable[[int], float] | None = None
    ) -> None:
        self._stats = stats
        self._cost = cost

    def collect(self) -> Iterator[Metric]:
        if self._cost is not None:
            family = GaugeMetricFamily(
                "speculant_verifier_forward_cost_seconds",
                "Seconds of one forward over new_tokens new tokens (the cost profile)",
                labels=["new_tokens"],
            )
            for n in COST_POINTS:
                family.add_metric([str(n)], self._cost(n))
            yield family
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
