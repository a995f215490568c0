"""Running a gRPC service: health (grpc.health.v1), server reflection, errors, every call's
interceptors, shutdown.

Every Speculant service starts through :class:`ServiceServer`, so all of them answer
``grpcurl -plaintext HOST:PORT list`` / ``describe`` without .proto files, report NOT_SERVING
until they are ready, and turn library errors into gRPC status codes the same way.

Every call passes the server's interceptors, outermost first: its request id
(:class:`RequestIdInterceptor`, speculant.request_context), its metrics
(:class:`MetricsInterceptor`, speculant.metrics), a refusal while the server stops, the bearer
tokens (:class:`BearerTokenInterceptor`, speculant.auth) and a refusal of a request that does not
parse. Each is a :class:`HandlerInterceptor`: it looks at a method's handler and wraps its
behaviour or replaces it with one that refuses the call. A handler has one behaviour of four
kinds: unary_unary and stream_unary return one response, unary_stream and stream_stream yield
responses; request_streaming says whether the first argument is a request iterator.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from speculant import termination
from speculant.auth import (
    ADMIN_OFF,
    ADMIN_PREFIX,
    OPEN_PREFIXES,
    ClientTokens,
    authorization,
    bearer_matches,
    expected_bearer,
)
from speculant.errors import InvalidArgumentError, ResourceExhaustedError, SpeculantError
from speculant.metrics import Metrics
from speculant.request_context import (
    REQUEST_ID_HEADER,
    new_request_id,
    request_id_from_metadata,
    request_id_scope,
)
from speculant.tls import ServerTls

log = logging.getLogger(__name__)

HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])

# Generous but bounded message sizes (a 100k-token context is ~0.5 MB as int32).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
# Keepalive: a client of a Speculant service pings every KEEPALIVE_TIME_MS while it has calls in
# flight and closes the connection (its calls fail UNAVAILABLE) when a ping is not answered
# within KEEPALIVE_TIMEOUT_MS: a backend that stopped answering (frozen, a host or network gone)
# fails its calls within 10 s, whatever they wait for. gRPC's own ping answers do not need the
# service's Python threads, so a slow forward pass (or a long prefill) is not mistaken for it.
KEEPALIVE_TIME_MS = 5000
KEEPALIVE_TIMEOUT_MS = 5000
CLIENT_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),  # gRPC's default: 1 minute
    ("grpc.http2.max_pings_without_data", 0),  # keep pinging during a long silent call
]
# ...and the servers accept those pings, also while no data flows (gRPC's default would answer
# a ping more often than every 5 minutes without data with GOAWAY after two strikes).
SERVER_KEEPALIVE_OPTIONS = [
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
]


# Status details travel in a trailer, and gRPC clients refuse trailers over 16 KiB (the call
# then fails RESOURCE_EXHAUSTED and the message is lost): an error message that quotes a huge
# request field is clipped (1,000 characters: at most 12 KB even as percent-encoded 4-byte
# UTF-8).
MAX_DETAILS_CHARS = 1000


def status_details(exc: BaseException | str) -> str:
    """The exception's message as status details, clipped to MAX_DETAILS_CHARS."""
    text = str(exc)
    if len(text) <= MAX_DETAILS_CHARS:
        return text
    return f"{text[: MAX_DETAILS_CHARS - 40]}... ({len(text)} characters, clipped)"


def _aborted(context: grpc.ServicerContext) -> bool:
    """Whether the handler already called context.abort (its exception must pass through)."""
    code = context.code()
    return code is not None and code != grpc.StatusCode.OK


def map_errors(handler: HandlerT) -> HandlerT:
    """Decorate a unary servicer method: SpeculantError -> its status code; other -> INTERNAL."""

    @functools.wraps(handler)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(self, request, context)
        except SpeculantError as exc:
            context.abort(exc.code, status_details(exc))
        except Exception:
            if _aborted(context):
                raise
            if not context.is_active():  # the client cancelled or went away: nothing to answer
                log.debug("%s ended: the client cancelled", handler.__qualname__)
                return
            log.exception("unexpected error in %s", handler.__qualname__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {handler.__name__}")

    return wrapper  # type: ignore[return-value]


def map_stream_errors(handler: HandlerT) -> HandlerT:
    """Like map_errors, for a server-streaming method (a generator of responses)."""

    @functools.wraps(handler)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from handler(self, request, context)
        except SpeculantError as exc:
            context.abort(exc.code, status_details(exc))
        except Exception:
            if _aborted(context):
                raise
            if not context.is_active():  # the client cancelled: its request stream raised
                log.debug("%s: the client went away", handler.__qualname__)
                return
            log.exception("unexpected error in %s", handler.__qualname__)
            context.abort(grpc.StatusCode.INTERNAL, f"internal error in {handler.__name__}")

    return wrapper  # type: ignore[return-value]


# -- Interceptors: every call's plumbing --------------------------------------------------

# wrap(inner behaviour, request_streaming) -> the behaviour that replaces it
Wrap = Callable[[Callable[..., Any], bool], Callable[..., Any]]

_KINDS = (  # (behaviour, request_streaming, response_streaming)
    ("unary_unary", False, False),
    ("stream_unary", True, False),
    ("unary_stream", False, True),
    ("stream_stream", True, True),
)


def wrappable(handler: grpc.RpcMethodHandler | None) -> bool:
    """Whether handler is grpc's own (namedtuple) method handler, the kind interceptors change."""
    return handler is not None and hasattr(handler, "_replace")


def wrap_behaviour(
    handler: grpc.RpcMethodHandler, unary: Wrap, streaming: Wrap, **changes: Any
) -> grpc.RpcMethodHandler:
    """handler with its behaviour wrapped: by unary(...) when it returns one response, by
    streaming(...) when it yields responses; changes replace other fields (e.g. a
    deserializer)."""
    for kind, request_streaming, response_streaming in _KINDS:
        inner = getattr(handler, kind)
        if inner is not None:
            wrap = streaming if response_streaming else unary
            changes[kind] = wrap(inner, request_streaming)
    return handler._replace(**changes)


def refusing_handler(
    handler: grpc.RpcMethodHandler, code: grpc.StatusCode, details: str
) -> grpc.RpcMethodHandler:
    """A handler of the same call shape that refuses every call with code and details. No
    deserializer: the request is never parsed."""

    def refuse(request_or_iterator: object, context: grpc.ServicerContext) -> None:
        context.abort(code, details)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class HandlerInterceptor(grpc.ServerInterceptor):
    """A server interceptor that sees each call's method handler and returns the one to run
    (the same, a wrapped one, or one that refuses the call): subclasses define
    :meth:`intercept`."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        return self.intercept(continuation(handler_call_details), handler_call_details)

    def intercept(
        self, handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        """The handler to run for this call (None: the method does not exist)."""
        raise NotImplementedError


class RequestIdInterceptor(HandlerInterceptor):
    """Serve each call under its request id: the call's x-request-id or a new one, returned to
    the caller in the initial metadata."""

    def intercept(
        self, handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        if not wrappable(handler):
            return handler
        given = request_id_from_metadata(details.invocation_metadata)

        def begin(context: grpc.ServicerContext) -> str:
            request_id = given or new_request_id()
            # ValueError: metadata already sent; RpcError: the client has gone already.
            with contextlib.suppress(ValueError, grpc.RpcError):
                context.send_initial_metadata(((REQUEST_ID_HEADER, request_id),))
            return request_id

        def unary(inner: Callable[..., Any], _request_streaming: bool) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Any:
                with request_id_scope(begin(context)):
                    return inner(request, context)

            return call

        def streaming(inner: Callable[..., Any], _request_streaming: bool) -> Callable[..., Any]:
            def call(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                with request_id_scope(begin(context)):
                    yield from inner(request, context)

            return call

        return wrap_behaviour(handler, unary, streaming)


class MetricsInterceptor(HandlerInterceptor):
    """Counts every call by status code, times it, and counts streaming calls' messages."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def intercept(
        self, handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        if not wrappable(handler):
            return handler
        service, _, method = details.method.lstrip("/").rpartition("/")
        measured = self._metrics.method_metrics(service, method, handler)
        return wrap_behaviour(handler, measured.unary, measured.streaming)


class BearerTokenInterceptor(HandlerInterceptor):
    """Rejects calls without a client's ``authorization: Bearer <token>`` (health checks
    exempt; none needed without client tokens), and AdminService calls without the admin
    token (PERMISSION_DENIED without one configured)."""

    def __init__(self, clients: ClientTokens | None, admin_token: str | None = None) -> None:
        self._clients = clients
        self._admin = None if admin_token is None else expected_bearer(admin_token)

    def intercept(
        self, handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        if handler is None or details.method.startswith(OPEN_PREFIXES):
            return handler
        if details.method.startswith(ADMIN_PREFIX):
            if self._admin is None:
                return refusing_handler(handler, grpc.StatusCode.PERMISSION_DENIED, ADMIN_OFF)
            if bearer_matches(authorization(details.invocation_metadata), self._admin):
                return handler
            return refusing_handler(
                handler, grpc.StatusCode.UNAUTHENTICATED, "missing or bad admin token"
            )
        if self._clients is None:
            return handler
        if self._clients.tenant_of(authorization(details.invocation_metadata)) is not None:
            return handler
        # No deserializer: the request is never parsed before the caller is authenticated.
        return refusing_handler(
            handler, grpc.StatusCode.UNAUTHENTICATED, "missing or bad bearer token"
        )


# The health service name that reports only whether the process is up and serving calls at all
# (SERVING from start() to stop()): what a liveness probe asks. The overall name "" and the
# service names report readiness (a gateway whose verifier does not answer, a draft service
# whose graph was damaged: NOT_SERVING), which a restart would not cure.
LIVENESS_SERVICE = "liveness"

# Worker threads a service keeps for short calls (health checks, info, stats, unary drafts) on
# top of those its long-lived streams may hold (see CallLimit).
RESERVED_THREADS = 8


class CallLimit:
    """At most `limit` calls of one kind in progress at once; more are refused at once with
    RESOURCE_EXHAUSTED (the refusal names `what` and `hint`).

    A sync gRPC server runs every call on one of its worker threads, and an open stream holds
    its thread for as long as the client keeps it open, idle or not: streams (and unary calls
    that may wait long, for the model) are capped below the server's worker count, so that
    health checks and short calls always find a thread. A refused call costs its thread a few
    microseconds instead of waiting in the server's queue for a thread that never frees.
    """

    def __init__(self, limit: int, what: str, hint: str = "retry later") -> None:
        if limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        self.limit = limit
        self.what = what
        self.hint = hint
        self._lock = threading.Lock()
        self.in_progress = 0
        self.refused = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Count one call for the block (ResourceExhaustedError when `limit` are in progress)."""
        with self._lock:
            if self.in_progress >= self.limit:
                self.refused += 1
                raise ResourceExhaustedError(
                    f"this service is serving its limit of {self.limit} {self.what}; {self.hint}"
                )
            self.in_progress += 1
        try:
            yield
        finally:
            with self._lock:
                self.in_progress -= 1


class _Undecodable:
    """What the tolerant deserializer returns for a payload that is not a valid message."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


class MalformedRequestError(InvalidArgumentError):
    """A request message on a stream could not be decoded."""

    def __init__(self, method: str, error: str) -> None:
        super().__init__("request", f"malformed {method} message: {error}")


class MalformedRequestInterceptor(HandlerInterceptor):
    """Answer INVALID_ARGUMENT, not gRPC's INTERNAL, to request bytes that do not decode.

    gRPC's Python server aborts with INTERNAL ("Exception deserializing request!") when a
    request deserializer raises, as if the server were at fault. This wraps each method's
    deserializer so that a failure yields a marker instead, and the method's behaviour so that
    the marker ends the call with INVALID_ARGUMENT: at once for a unary request, and for a
    request stream when the handler reaches the bad message (as MalformedRequestError, which
    map_stream_errors maps like any InvalidArgumentError).
    """

    def intercept(
        self, handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        if not wrappable(handler) or handler.request_deserializer is None:
            return handler
        method = details.method
        deserialize = handler.request_deserializer

        def tolerant(data: bytes) -> Any:
            try:
                return deserialize(data)
            except Exception as exc:
                return _Undecodable(str(exc) or type(exc).__name__)

        def check(request: Any, context: grpc.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    status_details(f"request: malformed {method} message: {request.error}"),
                )
            return request

        def checked_stream(requests: Iterator[Any]) -> Iterator[Any]:
            for request in requests:
                if isinstance(request, _Undecodable):
                    raise MalformedRequestError(method, request.error)
                yield request

        def unary(inner: Callable[..., Any], request_streaming: bool) -> Callable[..., Any]:
            if not request_streaming:
                return lambda request, context: inner(check(request, context), context)

            def stream_unary(requests: Iterator[Any], context: grpc.ServicerContext) -> Any:
                try:
                    return inner(checked_stream(requests), context)
                except MalformedRequestError as exc:
                    context.abort(exc.code, status_details(exc))

            return stream_unary

        def streaming(inner: Callable[..., Any], request_streaming: bool) -> Callable[..., Any]:
            if not request_streaming:
                return lambda request, context: inner(check(request, context), context)

            def stream_stream(
                requests: Iterator[Any], context: grpc.ServicerContext
            ) -> Iterator[Any]:
                try:
                    yield from inner(checked_stream(requests), context)
                except MalformedRequestError as exc:
                    context.abort(exc.code, status_details(exc))

            return stream_stream

        return wrap_behaviour(handler, unary, streaming, request_deserializer=tolerant)


# What a call made while a server stops is answered (gRPC UNAVAILABLE, HTTP 503).
SHUTTING_DOWN = "the server is shutting down; retry elsewhere"


class RefuseWhileStoppingInterceptor(HandlerInterceptor):
    """Once `stopping` is set, refuses new calls to the service's own methods with UNAVAILABLE
    (health checks and reflection still answer: a probe then reads NOT_SERVING). Calls already
    in progress are not affected. grpc's own server.stop() refuses new calls too, but it is
    called after the health status turns NOT_SERVING; this closes the moment between."""

    def __init__(self, service_names: Iterable[str], stopping: threading.Event) -> None:
        self._prefixes = tuple(f"/{name}/" for name in service_names)
        self._stopping = stopping

    def intercept(
        self, handler: grpc.RpcMethodHandler | None, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        if (
            handler is None
            or not self._stopping.is_set()
            or not details.method.startswith(self._prefixes)
        ):
            return handler
        return refusing_handler(handler, grpc.StatusCode.UNAVAILABLE, SHUTTING_DOWN)


class ServiceServer:
    """A gRPC server with health checking and reflection for the given services.

    Usage::

        server = ServiceServer(host, port, service_names=[...])
        add_FooServicer_to_server(servicer, server.grpc_server)
        server.start()          # health: NOT_SERVING
        ...load resources...
        server.set_serving()    # health: SERVING
        server.wait_for_termination_signal()
    """

    def __init__(
        self,
        host: str,
        port: int,
        service_names: Iterable[str],
        *,
        max_workers: int = 16,
        auth_token: str | ClientTokens | None = None,
        tls: ServerTls | None = None,
        metrics: Metrics | None = None,
        admin_token: str | None = None,
    ) -> None:
        """auth_token: require ``authorization: Bearer <token>`` with this token (or one of
        these tenants' tokens) on every call but health checks (UNAUTHENTICATED otherwise);
        None = no authentication. admin_token: the token AdminService calls need (None: they
        are refused). tls: serve TLS (mutual with a client CA) instead of plaintext. metrics:
        count and time every call in it (see speculant.metrics). Every call is served under its
        request id (see speculant.request_context)."""
        self.service_names = list(service_names)
        self.metrics = metrics
        self._stopping = threading.Event()
        # Outermost first: the request id is set for everything below, and the metrics see
        # calls refused while stopping or by authentication too.
        interceptors: list[grpc.ServerInterceptor] = [RequestIdInterceptor()]
        if metrics is not None:
            interceptors.append(MetricsInterceptor(metrics))
        interceptors.append(RefuseWhileStoppingInterceptor(self.service_names, self._stopping))
        clients = ClientTokens.single(auth_token) if isinstance(auth_token, str) else auth_token
        interceptors.append(BearerTokenInterceptor(clients, admin_token))
        interceptors.append(MalformedRequestInterceptor())
        self.grpc_server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc"),
            options=GRPC_OPTIONS + SERVER_KEEPALIVE_OPTIONS,
            interceptors=interceptors,
        )
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc_server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.grpc_server
        )
        try:
            if tls is None:
                self.port = self.grpc_server.add_insecure_port(f"{host}:{port}")
            else:
                self.port = self.grpc_server.add_secure_port(f"{host}:{port}", tls.credentials())
        except RuntimeError:  # grpcio >= 1.58 raises "Failed to bind to address ..."
            self.port = 0
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}: address in use or not allowed")
        self.host = host
        self._set_status(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _set_status(self, status: int) -> None:
        self.health.set("", status)
        for name in self.service_names:
            self.health.set(name, status)

    def start(self) -> None:
        self.grpc_server.start()
        self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    @property
    def stopping(self) -> threading.Event:
        """Set once stop() has begun: the server never reports SERVING again."""
        return self._stopping

    def set_serving(self, serving: bool = True) -> None:
        """Report SERVING (or NOT_SERVING with serving=False); never SERVING once stopping."""
        if serving and not self._stopping.is_set():
            termination.started_serving()  # first: a signal from SERVING on stops gracefully
            self._set_status(health_pb2.HealthCheckResponse.SERVING)
        else:
            self._set_status(health_pb2.HealthCheckResponse.NOT_SERVING)

    def stop(self, grace: float | None = 5.0) -> None:
        """Refuse new calls (UNAVAILABLE) and report NOT_SERVING, at once; let in-flight calls
        finish for `grace` seconds."""
        self._stopping.set()
        self._set_status(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.grpc_server.stop(grace).wait()

    def wait_for_termination_signal(self, grace: float = 5.0) -> None:
        """Block until SIGINT or SIGTERM, then stop gracefully (a serve command catches them
        first, before it can report SERVING: speculant.termination)."""
        termination.wait_for_signal()
        self.stop(grace)
