"""The gateway's own Prometheus metrics, from each finished generation's GenerationStats.

- ``speculant_gateway_generations_total{finish_reason}``: generations finished (eos,
  max_tokens, stop, context_length);
- ``speculant_gateway_generations_in_flight``: generations running now;
- ``speculant_gateway_prompt_tokens_total``, ``speculant_gateway_generated_tokens_total``;
- ``speculant_gateway_rounds_total``: verifier forward passes (prefill and verifies);
- ``speculant_gateway_draft_tokens_total``, ``speculant_gateway_accepted_tokens_total``;
- ``speculant_gateway_drafted_by_position_total{position}``,
  ``speculant_gateway_accepted_by_position_total{position}``: rounds that drafted / accepted a
  token at draft position 1, 2, ... (acceptance at position p = accepted / drafted);
- ``speculant_gateway_draft_failures_total``: rounds whose draft call failed or timed out
  (they verify without a draft);
- ``speculant_gateway_rounds_without_draft_total``: Verify rounds with no draft token (the
  cost-aware sizing found that nothing paid, or the drafter had nothing: plain decoding steps);
- ``speculant_gateway_unverified_draft_tokens_total``: draft tokens drafted but not verified
  (cut by the sizing as not worth their verify cost);
- ``speculant_gateway_tokens_per_second``: histogram of each generation's generated tokens
  per second.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.generation import GenerationStats

TOKENS_PER_SECOND_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class GatewayMetrics:
    """Counters fed with every finished generation's stats."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, documentation: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(f"speculant_gateway_{name}", documentation, labels, registry=registry)

        self.generations = counter("generations", "Generations finished", ("finish_reason",))
        self.in_flight = Gauge(
            "speculant_gateway_generations_in_flight",
            "Generations running now",
            registry=registry,
        )
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished generations")
        self.generated_tokens = counter("generated_tokens", "Tokens generated")
        self.rounds = counter("rounds", "Verifier forward passes (prefill and verifies)")
        self.draft_tokens = counter("draft_tokens", "Draft tokens sent to the verifier")
        self.accepted_tokens = counter("accepted_tokens", "Draft tokens accepted")
        self.drafted_by_position = counter(
            "drafted_by_position", "Rounds with a draft token at this position", ("position",)
        )
        self.accepted_by_position = counter(
            "accepted_by_position", "Draft tokens accepted at this position", ("position",)
        )
        self.draft_failures = counter("draft_failures", "Rounds whose draft call failed")
        self.rounds_without_draft = counter(
            "rounds_without_draft", "Verify rounds with no draft token (plain decoding steps)"
        )
        self.unverified_draft_tokens = counter(
            "unverified_draft_tokens", "Draft tokens drafted but not sent to the verifier"
        )
        self.tokens_per_second = Histogram(
            "speculant_gateway_tokens_per_second",
            "Generated tokens per second of each generation",
            buckets=TOKENS_PER_SECOND_BUCKETS,
            registry=registry,
        )

    def observe(self, stats: GenerationStats, finish_reason: str) -> None:
        """Count one finished generation."""
        self.generations.labels(finish_reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generated_tokens.inc(stats.generated_tokens)
        self.rounds.inc(stats.rounds)
        self.draft_tokens.inc(stats.draft_tokens)
        self.accepted_tokens.inc(stats.accepted_tokens)
        for position, count in enumerate(stats.drafted_by_position, start=1):
            self.drafted_by_position.labels(str(position)).inc(count)
        for position, count in enumerate(stats.accepted_by_position, start=1):
            self.accepted_by_position.labels(str(position)).inc(count)
        self.draft_failures.inc(stats.draft_failures)
        self.rounds_without_draft.inc(stats.rounds_without_draft)
        self.unverified_draft_tokens.inc(stats.unverified_draft_tokens)
        if stats.total_seconds > 0:
            self.tokens_per_second.observe(stats.tokens_per_second)
