"""Prometheus metrics of a service: its gRPC calls, and an HTTP endpoint serving /metrics.

Each :class:`Metrics` has its own registry (not prometheus_client's global one), so several
services can run in one process (tests) without their figures mixing. The gRPC metrics, by
``service`` (e.g. ``speculant.v1.GatewayService``) and ``method`` (e.g. ``Generate``):

- ``speculant_grpc_requests_total{service,method,code}``: finished calls by status code name
  (``OK``, ``INVALID_ARGUMENT``, ...; a stream counts once, when it ends; a call with a
  request stream that ends normally is counted once gRPC has closed it, a moment after its
  handler returns, so that a client's cancel counts as ``CANCELLED``);
- ``speculant_grpc_request_duration_seconds{service,method}``: call latency (a stream's whole
  life);
- ``speculant_grpc_stream_messages_total{service,method,direction}``: messages ``received``
  and ``sent`` on streaming calls (e.g. one per round on ``VerifierService/Session``);
- ``speculant_grpc_stream_message_duration_seconds{service,method}``: on bidirectional
  streams, the time from a request message to the next response message (one round).

Services add their own metrics to :attr:`Metrics.registry`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

log = logging.getLogger(__name__)

# Seconds: from a draft proposal (~0.1 ms) to a long generation.
LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)


def start_metrics_server(
    port: int, host: str, registry: CollectorRegistry
) -> tuple[WSGIServer, int]:
    """Serve `registry` at http://host:port/metrics on a daemon thread; (server, bound port).
    Port 0 picks a free port. OSError if the address cannot be bound."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_address[1])


class Metrics:
    """One service's registry with the gRPC call metrics, and its /metrics endpoint."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        by_method = ["service", "method"]

        def counter(name: str, doc: str, label: str) -> Counter:
            return Counter(name, doc, [*by_method, label], registry=self.registry)

        def latency(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, by_method, buckets=LATENCY_BUCKETS, registry=self.registry)

        self.requests = counter(
            "speculant_grpc_requests", "Finished gRPC calls by method and status code", "code"
        )
        self.latency = latency(
            "speculant_grpc_request_duration_seconds",
            "gRPC call latency (a stream: its whole life)",
        )
        self.stream_messages = counter(
            "speculant_grpc_stream_messages",
            "Messages received and sent on streaming gRPC calls",
            "direction",
        )
        self.message_latency = latency(
            "speculant_grpc_stream_message_duration_seconds",
            "On bidirectional streams: time from a request message to the next response",
        )
        self._server: WSGIServer | None = None
        self.port: int | None = None

    def method_metrics(self, service: str, method: str, handler: Any) -> MethodMetrics:
        """The metrics of one method's calls (what speculant.grpc_server.MetricsInterceptor
        wraps each call of a server with metrics in)."""
        return MethodMetrics(self, service, method, handler)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Start the /metrics endpoint (once); return its port."""
        if self._server is None:
            self._server, self.port = start_metrics_server(port, host, self.registry)
        assert self.port is not None
        return self.port

    def close(self) -> None:
        """Stop the /metrics endpoint, if started."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def _code_name(context: grpc.ServicerContext, error: BaseException | None) -> str:
    """The status code a call ended with, as gRPC will report it."""
    if isinstance(error, GeneratorExit):  # the stream was abandoned: the client went away
        return grpc.StatusCode.CANCELLED.name
    code = context.code()
    if code is not None:  # set by context.abort or set_code
        return code.name if isinstance(code, grpc.StatusCode) else str(code)
    if not context.is_active():  # the client went away (its request stream may have raised)
        return grpc.StatusCode.CANCELLED.name
    if error is not None:
        return grpc.StatusCode.UNKNOWN.name
    return grpc.StatusCode.OK.name


def _client_cancelled(context: grpc.ServicerContext) -> bool:
    """Whether the client cancelled the call, asked once the call has ended.

    A client's cancel can reach a handler that waits on its request stream as the stream's
    normal end (grpc marks the call cancelled a moment later, when its close event is
    polled), so a handler can return normally from a cancelled call. Once the call has ended,
    the sync server's context records the cancel on its state; it has no public test for it
    (is_active() is False after any end), hence the guarded read."""
    state = getattr(context, "_state", None)
    return getattr(state, "client", None) == "cancelled"


class _Round:
    """When the last request message of a bidirectional stream came (None: answered)."""

    __slots__ = ("received_at",)

    def __init__(self) -> None:
        self.received_at: float | None = None


class MethodMetrics:
    """The metrics of one method's calls: its status codes, its latency and, for streams, its
    messages (sent, received, and the time from a request message to its answer)."""

    def __init__(self, metrics: Metrics, service: str, method: str, handler: Any) -> None:
        self.requests = metrics.requests
        self.service, self.method = service, method
        self.request_streaming = handler.request_streaming
        self.latency = metrics.latency.labels(service, method)
        messages = metrics.stream_messages
        if handler.request_streaming:
            self.received = messages.labels(service, method, "received")
        if handler.response_streaming:
            self.sent = messages.labels(service, method, "sent")
        if handler.request_streaming and handler.response_streaming:
            self.message_latency = metrics.message_latency.labels(service, method)

    def count(self, code: str) -> None:
        self.requests.labels(self.service, self.method, code).inc()

    def _count_at_end(self, context: grpc.ServicerContext) -> None:
        self.count(grpc.StatusCode.CANCELLED.name if _client_cancelled(context) else "OK")

    def finish(
        self, context: grpc.ServicerContext, started: float, error: BaseException | None
    ) -> None:
        """A call ended (error: what it raised): its latency and status code."""
        self.latency.observe(time.perf_counter() - started)
        code = _code_name(context, error)
        # A request stream that ended normally may have been a cancel (see _client_cancelled):
        # its code is counted when the call has ended.
        if self.request_streaming and code == grpc.StatusCode.OK.name:
            if not context.add_callback(lambda: self._count_at_end(context)):
                self._count_at_end(context)  # the call has ended already
            return
        self.count(code)

    def counted(self, requests: Iterator[Any], round_: _Round) -> Iterator[Any]:
        """The request stream, each message counted and its arrival noted."""
        for request in requests:
            self.received.inc()
            round_.received_at = time.perf_counter()
            yield request

    @contextlib.contextmanager
    def measured(self, context: grpc.ServicerContext) -> Iterator[None]:
        """Time the call within, and count its status code when it ends (see finish)."""
        started = time.perf_counter()
        try:
            yield
        except BaseException as exc:
            self.finish(context, started, exc)
            raise
        self.finish(context, started, None)

    def unary(self, inner: Callable[..., Any], request_streaming: bool) -> Callable[..., Any]:
        """A handler answering one message, measured."""

        def call(request: Any, context: grpc.ServicerContext) -> Any:
            with self.measured(context):
                if request_streaming:
                    request = self.counted(request, _Round())
                return inner(request, context)

        return call

    def streaming(self, inner: Callable[..., Any], request_streaming: bool) -> Callable[..., Any]:
        """A handler answering a stream, measured (each answer counted, and timed from the
        request message it answers when requests stream too)."""

        def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with self.measured(context):
                round_ = _Round()
                if request_streaming:
                    request = self.counted(request, round_)
                for response in inner(request, context):
                    self.sent.inc()
                    if round_.received_at is not None:
                        self.message_latency.observe(time.perf_counter() - round_.received_at)
                        round_.received_at = None
                    yield response

        return call


def add_metrics_arguments(parser: argparse.ArgumentParser) -> None:
    """--metrics-port and --metrics-host of a serve command."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off; 0 picks a "
        "free port, logged)",
    )
    parser.add_argument(
        "--metrics-host", default=None, help="address of the metrics endpoint (default: --host)"
    )


def metrics_from_args(args: argparse.Namespace) -> Metrics | None:
    """The service's Metrics with its endpoint started, or None without --metrics-port.
    OSError (naming the address) if the endpoint cannot be bound."""
    if args.metrics_port is None:
        return None
    host = args.metrics_host or args.host
    if not 0 <= args.metrics_port <= 65535:
        raise OSError(f"--metrics-port must be in 0..65535, got {args.metrics_port}")
    metrics = Metrics()
    try:
        port = metrics.serve(args.metrics_port, host)
    except OSError as exc:
        raise OSError(f"cannot serve metrics on {host}:{args.metrics_port}: {exc}") from exc
    log.info("metrics at http://%s:%d/metrics", host, port)
    return metrics
