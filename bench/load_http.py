"""`speculant load --http URL`: a bounded closed-loop load test of the OpenAI-compatible HTTP
API (loopback only).

N workers (1..64) each send streamed requests back to back for S seconds (at most 60), to
``/v1/completions`` or ``/v1/chat/completions`` (``--endpoint``), prompts taken in turn from a
prompts file, each on its own keep-alive connection. Reported: requests per second, time to
first token (TTFT: request sent -> first event with text) and inter-token latency (ITL: per
request, the time from its first to its last token over its tokens after the first, counted by
the stream's usage; one sample per token) as p50 / p99, generated tokens per second, and the
answers by HTTP status (errors: every status but 200, and 200 streams that carried an error
event, counted as ``stream-error``).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bench.load_stats import LatencySamples, is_loopback, latency_line, run_workers

MAX_HTTP_CONCURRENCY = 64
MAX_HTTP_DURATION_S = 60.0
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass
class HttpLoadResults(LatencySamples):
    """What the workers measured, with the answers by HTTP status."""

    statuses: Counter = field(default_factory=Counter)

    def add(self, status: str, ttft: float | None, itl: float | None, tokens: int) -> None:
        with self.lock:
            self.requests += 1
            self.statuses[status] += 1
            self.tokens += tokens
            if ttft is not None:
                self.ttft.append(ttft)
            if itl is not None:
                self.itl.extend([itl] * (tokens - 1))


def request_body(endpoint: str, prompt: str, max_tokens: int, temperature: float) -> bytes:
    """A streamed request with usage (the generated token count) in its last event."""
    body: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return json.dumps(body).encode()


def _has_text(event: dict[str, Any]) -> bool:
    for choice in event.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


def _one_request(
    connection: http.client.HTTPConnection, path: str, body: bytes, headers: dict[str, str]
) -> tuple[str, float | None, float | None, int]:
    """(status, TTFT, ITL, tokens) of one streamed request."""
    started = time.perf_counter()
    connection.request("POST", path, body, headers)
    response = connection.getresponse()
    if response.status != 200:
        response.read()
        return str(response.status), None, None, 0
    first = last = None
    tokens = 0
    status = "200"
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            status = "stream-error"
        elif _has_text(event):
            last = time.perf_counter()
            first = first or last
        elif event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    ttft = None if first is None else first - started
    itl = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
    return status, ttft, itl, tokens


def _worker(
    url: urllib.parse.SplitResult,
    path: str,
    bodies: list[bytes],
    headers: dict[str, str],
    results: HttpLoadResults,
    deadline: float,
    offset: int,
) -> None:
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
    index = offset
    try:
        while time.monotonic() < deadline:
            body = bodies[index % len(bodies)]
            index += 1
            try:
                results.add(*_one_request(connection, path, body, headers))
            except (OSError, http.client.HTTPException, ValueError) as exc:
                results.add(type(exc).__name__, None, None, 0)
                connection.close()  # a new connection for the next request
    finally:
        connection.close()


def run_http_load(
    url: str,
    prompts: list[str],
    *,
    concurrency: int,
    duration_s: float,
    max_tokens: int,
    temperature: float,
    endpoint: str = "completions",
    token: str | None = None,
) -> dict[str, Any]:
    """Run the load against the HTTP API at url (http://HOST:PORT) and return the figures."""
    parsed = urllib.parse.urlsplit(url)
    path = ENDPOINTS[endpoint]
    bodies = [request_body(endpoint, p, max_tokens, temperature) for p in prompts]
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    results = HttpLoadResults()
    work = partial(_worker, parsed, path, bodies, headers, results)
    elapsed = run_workers(work, concurrency, duration_s)
    return {
        "url": url,
        "endpoint": path,
        "concurrency": concurrency,
        "duration_s": elapsed,
        "requests": results.requests,
        "requests_per_second": results.requests / elapsed if elapsed > 0 else 0.0,
        "ok_requests_per_second": results.statuses["200"] / elapsed if elapsed > 0 else 0.0,
        "statuses": dict(results.statuses),
        "errors": {s: n for s, n in results.statuses.items() if s != "200"},
        **results.figures(elapsed),
    }


def check_http_target(url: str, concurrency: int, duration_s: float) -> str | None:
    """Why these --http settings are refused (None: they are fine)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme != "http" or not parsed.hostname or parsed.port is None:
        return f"--http: give http://HOST:PORT, got {url!r}"
    if not is_loopback(f"{parsed.hostname}:{parsed.port}"):
        return f"--http: {url} is not a loopback address (load tests stay local)"
    if not 1 <= concurrency <= MAX_HTTP_CONCURRENCY:
        return f"--concurrency: must be in 1..{MAX_HTTP_CONCURRENCY} with --http, got {concurrency}"
    if not 0 < duration_s <= MAX_HTTP_DURATION_S:
        return (
            f"--duration: must be in (0, {MAX_HTTP_DURATION_S:g}] seconds with --http, "
            f"got {duration_s}"
        )
    return None


def print_http_report(report: dict[str, Any]) -> None:
    errors = ", ".join(f"{k} {v}" for k, v in sorted(report["errors"].items())) or "none"
    print(
        f"{report['requests']} requests to {report['endpoint']} in {report['duration_s']:.1f} s "
        f"at concurrency {report['concurrency']}: {report['requests_per_second']:.2f} "
        f"requests/s ({report['ok_requests_per_second']:.2f} answered 200), "
        f"{report['tokens_per_second']:.0f} tokens/s; errors: {errors}\n{latency_line(report)}"
    )
