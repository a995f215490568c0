"""Prometheus figures for the metrics tests: a service's /metrics scraped over HTTP and parsed with
prometheus_client's parser into *samples* ((name, sorted labels) -> value), and the lookups the
tests compare scrapes taken before and after a call with."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

GATEWAY = "speculant.v1.GatewayService"
VERIFIER = "speculant.v1.VerifierService"
DRAFT = "speculant.v1.DraftService"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample at http://127.0.0.1:port/metrics: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value (0 if absent: a labelled counter appears on first use)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(now: Samples, then: Samples, name: str, **labels: str) -> float:
    """How much the sample grew from the scrape `then` to the scrape `now`."""
    return value(now, name, **labels) - value(then, name, **labels)


def total(samples: Samples, name: str) -> float:
    """The sum of a metric over all its label values."""
    return sum(v for (n, _), v in samples.items() if n == name)


def calls(samples: Samples, service: str, method: str, code: str) -> float:
    """The gRPC calls of service/method that ended with the status code."""
    return value(
        samples, "speculant_grpc_requests_total", service=service, method=method, code=code
    )


def wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Whether condition() became true within timeout_s (for work that ends asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()
