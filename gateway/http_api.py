"""The gateway's HTTP API: the seed's ``/health`` and ``/generate``, and OpenAI-compatible
completions, beside the gRPC server in the same process.

Routes (JSON in and out; streams are server-sent events ending with ``data: [DONE]``):
- ``GET /health``: 200 ``{"status": "ok", "model": NAME}`` while the verifier answers its health
  checks and the tokenizers agree (as the gRPC health), else 503. Open even when a bearer token
  is required.
- ``GET /v1/models``: the one served model.
- ``POST /generate``: a GenerateRequest as JSON -> ``{text, token_ids, finish_reason, stats}``.
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's requests and answers
  (see gateway.openai_format), ``"stream": true`` for server-sent events.

Every request runs through GatewayServicer.generation, the code path of the gRPC Generate: the
same validation, concurrency limit, coordinator and error classes. Errors are OpenAI-style
``{"error": {"message", "type", "param", "code"}}`` with the HTTP status of the error class
(400 bad request, 401 no or wrong token, 404, 412 tokenizer mismatch, 429 over capacity, 503
backend down, 500 anything else), never a traceback. A client that disconnects ends its
generation between two rounds and frees its verifier session.

Every request is served under a request id, as a gRPC call is (speculant.request_context): the
client's ``X-Request-Id`` header when it is a clean one, else a new id; it is sent back in the
answer's ``X-Request-Id`` header, carried to the draft and verifier services, and named by
every log line of the request, among them one access line (method, path, status, time).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc

from gateway.coordinator import GenerationResult, StreamChunk
from gateway.openai_format import (
    ApiRequest,
    ResponseWriter,
    generate_response,
    parse_generate_request,
    parse_openai_request,
    renamed,
)
from gateway.server import GatewayServicer
from speculant.auth import bearer_matches, expected_bearer
from speculant.errors import (
    InvalidArgumentError,
    OutOfRangeError,
    SpeculantError,
    UnavailableError,
)
from speculant.grpc_server import MAX_MESSAGE_BYTES, status_details
from speculant.request_context import clean_request_id, new_request_id, request_id_scope
from speculant.tls import ServerTls
from speculant.v1 import gateway_pb2

log = logging.getLogger(__name__)

MAX_BODY_BYTES = MAX_MESSAGE_BYTES
REQUEST_ID_HEADER = "X-Request-Id"
IDLE_TIMEOUT_S = 120.0  # an idle keep-alive connection is closed after this

# gRPC status code of a library error -> HTTP status and OpenAI error type.
HTTP_ERRORS: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (412, "failed_precondition"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (503, "service_unavailable"),
}
INTERNAL = (500, "internal_error")


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


def http_error(exc: BaseException, request: ApiRequest | None = None) -> HttpError:
    """The HttpError for an exception raised while serving (logged if unexpected)."""
    if isinstance(exc, HttpError):
        return exc
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


def _client_gone(connection: socket.socket) -> bool:
    """Whether the client closed its end (polled between rounds; never blocks)."""
    if isinstance(connection, ssl.SSLSocket):
        return False  # no peeking under TLS: a gone client is noticed at the next write
    try:
        poller = select.poll()  # not select.select: no limit on descriptor numbers
        poller.register(connection, select.POLLIN)
        events = poller.poll(0)
        if not events:
            return False
        if events[0][1] & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
            return True
        return connection.recv(1, socket.MSG_PEEK) == b""  # readable: end of stream or data
    except OSError:
        return True


class HttpApi:
    """Routes and answers; one instance per server, shared by its handler threads."""

    def __init__(
        self,
        servicer: GatewayServicer,
        *,
        auth_token: str | None = None,
        model_name: str | None = None,
    ) -> None:
        """auth_token: require ``Authorization: Bearer <auth_token>`` (not on /health).
        model_name: the name /v1/models and the answers give (default: the verifier's)."""
        self.servicer = servicer
        self._expected = None if auth_token is None else expected_bearer(auth_token)
        self._model_name = model_name
        self._routes: dict[tuple[str, str], Callable[[_Handler], None]] = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/models"): self._models,
            ("POST", "/generate"): self._generate,
            ("POST", "/v1/completions"): lambda h: self._openai(h, chat=False),
            ("POST", "/v1/chat/completions"): lambda h: self._openai(h, chat=True),
        }
        self.created = int(time.time())

    def model_name(self) -> str:
        """The served model's name (asks the verifier once the backends are up)."""
        if self._model_name is None:
            self.servicer.coordinator()  # the backends answer and their tokenizers agree
            self._model_name = self.servicer.verifier.info.model_name
        return self._model_name

    def handle(self, handler: _Handler, method: str) -> None:
        """Answer one request (a connection may carry several, one after another), under its
        request id."""
        handler.request_id = (
            clean_request_id(handler.headers.get(REQUEST_ID_HEADER)) or new_request_id()
        )
        handler.status_sent = None
        started = time.perf_counter()
        path = handler.path.split("?", 1)[0]
        with request_id_scope(handler.request_id):
            try:
                self._answer(handler, method, path)
            finally:
                log.info(
                    "HTTP %s %s -> %s in %.1f ms",
                    method,
                    path,
                    handler.status_sent or "no answer",
                    (time.perf_counter() - started) * 1e3,
                )
                handler.request_id = None  # the connection's next request gets its own

    def _answer(self, handler: _Handler, method: str, path: str) -> None:
        handler.streaming = False
        routes = self._routes
        route = routes.get((method, path))
        try:
            if route is None:
                if any(p == path for _, p in routes):
                    raise HttpError(
                        405, "invalid_request_error", f"{method} is not allowed on {path}"
                    )
                raise HttpError(404, "not_found_error", f"no such endpoint: {method} {path}")
            if path != "/health":
                self._authenticate(handler)
            route(handler)
        except Exception as exc:
            if handler.streaming:  # the status is sent: nothing more to say
                handler.close_connection = True
                return
            error = http_error(exc)
            handler.send_json(error.status, error.body())

    def _authenticate(self, handler: _Handler) -> None:
        if self._expected is None:
            return
        if not bearer_matches(handler.headers.get("Authorization"), self._expected):
            raise HttpError(401, "authentication_error", "missing or bad bearer token")

    def _health(self, handler: _Handler) -> None:
        try:
            if self.servicer.problem is not None:  # from the gateway's last backend check
                raise UnavailableError(self.servicer.problem)
            self.servicer.coordinator()  # the backends answer and their tokenizers agree
            name = self.model_name()
        except Exception as exc:
            handler.send_json(503, {"status": "unavailable", "error": status_details(exc)})
            return
        handler.send_json(200, {"status": "ok", "model": name})

    def _models(self, handler: _Handler) -> None:
        model = {
            "id": self.model_name(),
            "object": "model",
            "created": self.created,
            "owned_by": "speculant",
        }
        handler.send_json(200, {"object": "list", "data": [model]})

    def _run(
        self, handler: _Handler, request: gateway_pb2.GenerateRequest
    ) -> Iterator[StreamChunk | GenerationResult]:
        return self.servicer.generation(request, cancelled=lambda: _client_gone(handler.connection))

    def _generate(self, handler: _Handler) -> None:
        request = parse_generate_request(handler.read_json())
        with contextlib.closing(self._run(handler, request)) as items:
            for item in items:
                if isinstance(item, GenerationResult):
                    handler.send_json(200, generate_response(item))

    def _openai(self, handler: _Handler, *, chat: bool) -> None:
        request = parse_openai_request(handler.read_json(), chat=chat)
        writer = ResponseWriter(request, self.model_name())
        with contextlib.closing(self._run(handler, request.generate)) as items:
            try:
                first = next(items, None)  # validation, tokenizing, prefill: errors answer here
            except Exception as exc:
                raise http_error(exc, request) from exc
            if first is None:
                return  # the client went away
            if request.stream:
                self._stream(handler, writer, request, itertools.chain([first], items))
                return
            for item in itertools.chain([first], items):
                if isinstance(item, GenerationResult):
                    handler.send_json(200, writer.response(item))

    @staticmethod
    def _stream(
        handler: _Handler,
        writer: ResponseWriter,
        request: ApiRequest,
        items: Iterator[StreamChunk | GenerationResult],
    ) -> None:
        """Server-sent events: chunks as tokens are accepted, the finish, [DONE]. The status
        is sent first, so an error during the rounds is sent as an event ``{"error": ...}``."""
        handler.start_events()
        try:
            try:
                opening = writer.first_chunk()
                if opening is not None:
                    handler.send_event(opening)
                for item in items:
                    if isinstance(item, GenerationResult):
                        handler.send_event(writer.final_chunk(item))
                        if request.include_usage:
                            handler.send_event(writer.usage_chunk(item))
                    elif item.text_delta:
                        handler.send_event(writer.text_chunk(item.text_delta))
            except OSError:
                raise
            except Exception as exc:
                handler.send_event(http_error(exc, request).body())
            handler.send_event_data("[DONE]")
            handler.end_events()
        except OSError:  # the client went away; closing `items` frees the verifier session
            handler.close_connection = True


class _Handler(BaseHTTPRequestHandler):
    """One connection (HTTP/1.1, keep-alive): reads requests, hands them to the HttpApi."""

    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S
    server: _Server
    streaming = False  # the answer's status and headers are sent (an event stream)
    request_id: str | None = None  # the request being answered (HttpApi.handle sets it)
    status_sent: int | None = None

    def send_response(self, code: int, message: str | None = None) -> None:
        """The status line, and the request's X-Request-Id with every answer."""
        super().send_response(code, message)
        self.status_sent = code
        if self.request_id is not None:
            self.send_header(REQUEST_ID_HEADER, self.request_id)

    def do_GET(self) -> None:
        self.server.api.handle(self, "GET")

    def do_POST(self) -> None:
        self.server.api.handle(self, "POST")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def read_json(self) -> Any:
        """The request body as JSON (400 if it is not; 411 / 413 without a fitting length)."""
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.isdigit():
            self.close_connection = True
            raise HttpError(411, "invalid_request_error", "send the body with a Content-Length")
        length = int(length_header)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise HttpError(413, "invalid_request_error", f"body over {MAX_BODY_BYTES} bytes")
        data = self.rfile.read(length)
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HttpError(400, "invalid_request_error", f"invalid JSON body: {exc}") from exc

    def send_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("WWW-Authenticate", "Bearer")
        self.end_headers()
        self.wfile.write(data)

    def start_events(self) -> None:
        """Headers of a server-sent event stream (chunked transfer encoding)."""
        self.streaming = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send_event(self, body: dict[str, Any]) -> None:
        self.send_event_data(json.dumps(body))

    def send_event_data(self, data: str) -> None:
        payload = f"data: {data}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()

    def end_events(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    """A thread per connection; TLS handshakes happen in those threads, not in accept."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, address: tuple[str, int], api: HttpApi, tls: ssl.SSLContext | None):
        self.api = api
        self.tls = tls
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside a request (a refused TLS handshake, a reset)."""
        log.debug("connection from %s failed", client_address, exc_info=True)

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        if self.tls is not None:
            connection = self.tls.wrap_socket(
                connection, server_side=True, do_handshake_on_connect=False
            )
        return connection, address


class HttpApiServer:
    """The HTTP API on host:port (port 0: a free one), served from a background thread."""

    def __init__(
        self,
        servicer: GatewayServicer,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        auth_token: str | None = None,
        tls: ServerTls | None = None,
        model_name: str | None = None,
    ) -> None:
        """tls: serve HTTPS with the gateway's certificate (and require client certificates
        signed by its client CA, if any)."""
        api = HttpApi(servicer, auth_token=auth_token, model_name=model_name)
        try:
            self._server = _Server((host, port), api, tls.ssl_context() if tls else None)
        except OSError as exc:
            reason = exc.strerror or exc
            raise OSError(f"--http-port: cannot bind {host}:{port}: {reason}") from exc
        self.host = host
        self.port = self._server.server_address[1]
        self.scheme = "https" if tls else "http"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="http-api", daemon=True
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    def start(self) -> HttpApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting connections (requests in flight end with the process)."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
