"""The project's server interceptors (request ids, metrics, malformed requests, authentication,
shutdown) are :class:`HandlerInterceptor`s: each looks at a method's handler and wraps its
behaviour or replaces it with one that refuses the call.

A handler has one behaviour of four kinds: unary_unary and stream_unary return one response,
unary_stream and stream_stream yield responses; request_streaming says whether the first
argument is a request iterator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

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
