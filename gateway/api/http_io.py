"""The HTTP API's wire: request bodies read as JSON (bounded in size and depth), errors as
OpenAI-style bodies with the HTTP status of their error class, and server-sent event streams
that notice when the client goes away.

A body's depth (how deeply it nests) is found before it is parsed (:func:`check_depth`).
Python's json module parses arrays and objects recursively: a body nested about a thousand levels
deep (``{"prompt": [[[[...]]]]}``) raises RecursionError, and a shallower one can still raise it
later, in code that walks or prints the value. The HTTP API refuses such a body up front as a bad
request that names the field whose value nests too deeply. Real requests nest a few levels (chat
messages with content parts: five).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from gateway.api.openai_format import ApiRequest, renamed
from speculant.errors import InvalidArgumentError, OutOfRangeError, SpeculantError
from speculant.grpc_server import MAX_MESSAGE_BYTES, status_details

log = logging.getLogger(__name__)

MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # a bigger request body is refused (413)

# gRPC status code of a library error -> HTTP status and OpenAI error type.
HTTP_ERRORS: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (412, "failed_precondition"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (503, "service_unavailable"),
}
INTERNAL = (500, "internal_error")


MAX_JSON_DEPTH = 64  # arrays and objects inside one another that a request body may have

# A JSON string (its escapes included) or one bracket: the only tokens that matter for depth.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class TooDeep(ValueError):
    """The body nests more than MAX_JSON_DEPTH levels; field: the top-level key whose value does
    ("" when the body is not an object)."""

    def __init__(self, field: str, limit: int) -> None:
        where = f"{field}: " if field else ""
        super().__init__(f"{where}arrays and objects nested more than {limit} levels deep")
        self.field = field


def check_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise TooDeep if `data` (a JSON text, not yet parsed) nests deeper than `limit`.

    One regular-expression pass over strings and brackets; malformed JSON is left to the parser.
    The field named is the last string read at the top level before the value that went too
    deep opened: in an object, that value's key.
    """
    depth = 0
    in_object = False  # the body is an object (its top-level strings are keys and values)
    key = ""  # the last top-level string: the key of the value that follows it
    field = ""  # the top-level key of the value being read
    for token in _TOKENS.finditer(data):
        text = token.group()
        if text in (b"[", b"{"):
            depth += 1
            if depth == 1:
                in_object = text == b"{"
            elif depth == 2:
                field = key if in_object else ""
            if depth > limit:
                raise TooDeep(field, limit)
        elif text in (b"]", b"}"):
            depth -= 1
        elif depth == 1:
            key = text[1:-1].decode("utf-8", "replace")


class HttpError(Exception):
    """An answer other than 200: HTTP status, OpenAI error type, message, field."""

    def __init__(self, status: int, kind: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.param = param
        self.code: str | None = None

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": status_details(self),
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body(), self.status, headers)


def http_error(exc: BaseException, request: ApiRequest | None = None) -> HttpError:
    """The HttpError for an exception raised while serving (logged if unexpected)."""
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, HTTPException):  # Starlette's routing: 404, 405
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return HttpError(exc.status_code, kind, str(exc.detail))
    if not isinstance(exc, SpeculantError):
        log.error("unexpected error in the HTTP API", exc_info=exc)
        return HttpError(*INTERNAL, "internal error")
    if isinstance(exc, InvalidArgumentError) and request is not None:
        exc = renamed(exc, request.client_field(exc.field))
    status, kind = HTTP_ERRORS.get(exc.code, INTERNAL)
    error = HttpError(status, kind, str(exc))
    if isinstance(exc, InvalidArgumentError):
        error.param = exc.field
    elif isinstance(exc, OutOfRangeError):
        error.param = "messages" if request and request.chat else "prompt"
        error.code = "context_length_exceeded"
    return error


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


async def read_json(request: Request) -> Any:
    """The request body as JSON (400 if it is not, or if it nests deeper than
    check_depth allows; 413 over MAX_BODY_BYTES)."""
    too_large = HttpError(413, "invalid_request_error", f"body over {MAX_BODY_BYTES} bytes")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > MAX_BODY_BYTES:
            raise too_large
    try:
        check_depth(data)
    except TooDeep as exc:
        raise HttpError(400, "invalid_request_error", str(exc), exc.field or None) from exc
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise HttpError(400, "invalid_request_error", f"invalid JSON body: {exc}") from exc


def event(body: dict[str, Any] | str) -> bytes:
    """One server-sent event (a JSON object, or the final "[DONE]")."""
    data = body if isinstance(body, str) else json.dumps(body)
    return f"data: {data}\n\n".encode()


@contextlib.asynccontextmanager
async def on_disconnect(receive: Receive, gone: Callable[[], None]) -> AsyncIterator[None]:
    """Call gone() if the client disconnects while the block runs (the body is read)."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone()

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


class EventStream:
    """An ASGI response: the server-sent events of `events`, sent as they come; when the client
    disconnects, `gone` is called (which must make `events` end soon)."""

    def __init__(self, events: AsyncIterator[bytes], gone: Callable[[], None]) -> None:
        self.events = events
        self.gone = gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        async with contextlib.aclosing(self.events) as events:
            try:
                async with on_disconnect(receive, self.gone):
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    async for data in events:  # once gone, they end after the current round
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
            except OSError:  # the client went away mid-send
                self.gone()
