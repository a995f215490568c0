"""The draft service's own Prometheus metrics (beside speculant.metrics' gRPC ones).

- ``speculant_draft_proposals_total``: drafts proposed (one per Propose request, or per
  ProposeStream message);
- ``speculant_draft_tokens_total``: draft tokens in them;
- ``speculant_draft_learned_tokens_total``: tokens of reported generations learned (Learn);
- ``speculant_draft_live_layer_bytes``: the live layer's estimated memory;
- ``speculant_draft_graph_readers``: threads that have read the graphs (a format 1 graph keeps
  an LMDB read transaction open for each; the graph is opened without a lock file, so LMDB's own
  reader table, ``Environment.readers()``, stays empty);
- ``speculant_draft_graph_resident_bytes{graph}``: per graph of the catalog, the bytes of its
  files in the host's page cache (one copy, shared by every process that maps it), and
  ``speculant_draft_graph_bytes{graph}`` / ``speculant_draft_graph_tokens{graph}``: its size on
  disk and its corpus tokens, read at every scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric

from speculant.types import GraphStatus

# (name, help, GraphStatus field) of the per-graph gauges
_GRAPH_GAUGES = (
    ("speculant_draft_graph_resident_bytes", "Graph bytes in the page cache", "resident_bytes"),
    ("speculant_draft_graph_bytes", "Graph files on disk, in bytes", "bytes"),
    ("speculant_draft_graph_tokens", "Corpus tokens counted into the graph", "tokens"),
)


class DraftMetrics:
    """Counters of the drafts served, and a gauge of the graph's LMDB readers."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.proposals = Counter("speculant_draft_proposals", "Drafts proposed", registry=registry)
        self.tokens = Counter("speculant_draft_tokens", "Draft tokens proposed", registry=registry)
        self.learned_tokens = Counter(
            "speculant_draft_learned_tokens",
            "Tokens of reported generations learned into the live layer",
            registry=registry,
        )
        self.live_layer_bytes = Gauge(
            "speculant_draft_live_layer_bytes",
            "Estimated memory of the live layer (learned n-gram counts)",
            registry=registry,
        )
        self.registry = registry
        self.graph_readers = Gauge(
            "speculant_draft_graph_readers",
            "Threads that have read the graph (one per drafting thread)",
            registry=registry,
        )

    def watch_readers(self, readers: Callable[[], float]) -> None:
        """Report readers() as the graph readers gauge at every scrape."""
        self.graph_readers.set_function(readers)

    def watch_graphs(self, statuses: Callable[[], list[GraphStatus]]) -> None:
        """Report each graph's resident bytes, bytes and tokens at every scrape."""
        self.registry.register(_GraphCollector(statuses))

    def observe(self, draft_tokens: int) -> None:
        self.proposals.inc()
        self.tokens.inc(draft_tokens)

    def observe_learned(self, tokens: int, live_bytes: int) -> None:
        self.learned_tokens.inc(tokens)
        self.live_layer_bytes.set(live_bytes)


class _GraphCollector:
    """The per-graph gauges, read from the catalog at every scrape."""

    def __init__(self, statuses: Callable[[], list[GraphStatus]]) -> None:
        self._statuses = statuses

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(name, text, labels=["graph"]) for name, text, _ in _GRAPH_GAUGES]

    def collect(self) -> Iterator[Metric]:
        statuses = self._statuses()
        for name, text, attribute in _GRAPH_GAUGES:
            family = GaugeMetricFamily(name, text, labels=["graph"])
            for status in statuses:
                family.add_metric([status.name], getattr(status, attribute))
            yield family
