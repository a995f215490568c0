"""The gateway's HTTP API: ``/health``, ``/generate``, OpenAI-compatible completions and
``/metrics``, beside the gRPC server in the same process.

A Starlette (ASGI) app served by uvicorn on an event loop of its own thread. Routes (JSON in
and out; streams are server-sent events ending with ``data: [DONE]``):
- ``GET /health``: 200 ``{"status": "ok", "model": NAME}`` while the verifier answers its health
  checks and the tokenizers agree (as the gRPC health), else 503. Open even when a bearer token
  is required.
- ``GET /metrics``: the gateway's Prometheus metrics (its registry, as ``--metrics-port``
  serves it; open, as vLLM's).
- ``GET /v1/models``: the one served model.
- ``POST /generate``: a GenerateRequest as JSON -> ``{text, token_ids, finish_reason, stats}``.
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's requests and answers
  (see gateway.openai_format and gateway.http_answers), ``"stream": true`` for server-sent
  events.

Every generation runs through GatewayServicer.generation, the code path of the gRPC Generate
(the same validation, concurrency limit, coordinator and error classes), in a worker thread
(gateway.http_runs): an answer with n choices takes n of the gateway's slots. Errors are
OpenAI-style ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status of the
error class (400 bad request, 401 no or wrong token, 404, 405, 412 tokenizer mismatch, 413 body
over MAX_BODY_BYTES, 429 over capacity, 503 backend down or the gateway stopping, 500 anything
else), never a
traceback. A client that disconnects ends its generations between two rounds and frees their
verifier sessions.

Every request is served under a request id, as a gRPC call is (speculant.request_context): the
client's ``X-Request-Id`` header when it is a clean one, else a new id; it is sent back in the
answer's ``X-Request-Id`` header, carried to the draft and verifier services, and named by
every log line of the request, among them one access line (method, path, status, time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.coordinator import GenerationResult
from gateway.http_answers import ResponseWriter, generate_response
from gateway.http_runs import ChoiceRuns
from gateway.json_depth import TooDeep, check_depth
from gateway.openai_format import (
    ApiRequest,
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
from speculant.grpc_server import MAX_MESSAGE_BYTES, SHUTTING_DOWN, status_details
from speculant.request_context import clean_request_id, new_request_id, request_id_scope
from speculant.tls import ServerTls

log = logging.getLogger(__name__)

MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # a bigger request body is refused (413)
REQUEST_ID_HEADER = "X-Request-Id"
# uvicorn's bounds: an idle keep-alive connection is closed after KEEP_ALIVE_S; beyond
# MAX_CONNECTIONS connections (and requests) at once new ones get a 503; on stop, requests in
# flight get GRACEFUL_STOP_S to end.
KEEP_ALIVE_S = 30
MAX_CONNECTIONS = 1024
BACKLOG = 256
GRACEFUL_STOP_S = 5
START_TIMEOUT_S = 30.0

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
    gateway.json_depth allows; 413 over MAX_BODY_BYTES)."""
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


def _event(body: dict[str, Any] | str) -> bytes:
    """One server-sent event (a JSON object, or the final "[DONE]")."""
    data = body if isinstance(body, str) else json.dumps(body)
    return f"data: {data}\n\n".encode()


@contextlib.asynccontextmanager
async def _on_disconnect(receive: Receive, gone: Callable[[], None]) -> AsyncIterator[None]:
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
                async with _on_disconnect(receive, self.gone):
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    async for data in events:  # once gone, they end after the current round
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
            except OSError:  # the client went away mid-send
                self.gone()


Endpoint = Callable[[Request], Awaitable[Response | EventStream]]


class HttpApi:
    """Routes and answers: :attr:`app` is the ASGI application."""

    def __init__(
        self,
        servicer: GatewayServicer,
        *,
        auth_token: str | None = None,
        model_name: str | None = None,
        registry: CollectorRegistry | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        """auth_token: require ``Authorization: Bearer <auth_token>`` (not on /health and
        /metrics). model_name: the name /v1/models and the answers give (default: the
        verifier's). registry: the metrics /metrics serves (None: /metrics is 404).
        stopping: set when the gateway begins to stop (its ServiceServer.stopping): from then
        on /health answers 503 and new requests are refused with 503, as its gRPC calls are."""
        self.servicer = servicer
        self._stopping = stopping
        self._expected = None if auth_token is None else expected_bearer(auth_token)
        self._model_name = model_name
        self._registry = registry
        self.created = int(time.time())
        routes = [
            ("GET", "/health", self._health, False),
            ("GET", "/metrics", self._metrics, False),
            ("GET", "/v1/models", self._models, True),
            ("POST", "/generate", self._generate, True),
            ("POST", "/v1/completions", self._completions, True),
            ("POST", "/v1/chat/completions", self._chat, True),
        ]
        self.app = Starlette(
            routes=[
                Route(path, self._answering(endpoint, auth), methods=[method])
                for method, path, endpoint, auth in routes
            ],
            exception_handlers={HTTPException: self._routing_error},
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app under the request's id, with the id in the answer and one access line."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(REQUEST_ID_HEADER.lower().encode())
        request_id = clean_request_id(given) or new_request_id()
        status: list[int] = []
        started = time.perf_counter()

        async def send_with_id(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                id_header = (REQUEST_ID_HEADER.lower().encode(), request_id.encode())
                message = {**message, "headers": [*message.get("headers", []), id_header]}
            await send(message)

        with request_id_scope(request_id):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                log.info(
                    "HTTP %s %s -> %s in %.1f ms",
                    scope["method"],
                    scope["path"],
                    status[0] if status else "no answer",
                    (time.perf_counter() - started) * 1e3,
                )

    async def _routing_error(self, _request: Request, exc: Exception) -> Response:
        return http_error(exc).response()

    def _answering(self, endpoint: Endpoint, auth: bool) -> Callable[[Request], Awaitable[Any]]:
        """endpoint, behind the token check (when auth), with its errors answered as JSON."""

        async def answer(request: Request) -> Response | EventStream:
            try:
                if auth:
                    self._refuse_while_stopping()
                    self._authenticate(request)
                return await endpoint(request)
            except Exception as exc:
                return http_error(exc).response()

        return answer

    def _refuse_while_stopping(self) -> None:
        if self._stopping is not None and self._stopping.is_set():
            raise UnavailableError(SHUTTING_DOWN)

    def _authenticate(self, request: Request) -> None:
        if self._expected is None:
            return
        if not bearer_matches(request.headers.get("authorization"), self._expected):
            raise HttpError(401, "authentication_error", "missing or bad bearer token")

    def model_name(self) -> str:
        """The served model's name (asks the verifier once the backends are up; blocking)."""
        if self._model_name is None:
            self.servicer.coordinator()  # the backends answer and their tokenizers agree
            self._model_name = self.servicer.verifier.info.model_name
        return self._model_name

    def _health_body(self) -> tuple[int, dict[str, Any]]:
        try:
            self._refuse_while_stopping()
            if self.servicer.problem is not None:  # from the gateway's last backend check
                raise UnavailableError(self.servicer.problem)
            self.servicer.coordinator()  # the backends answer and their tokenizers agree
            return 200, {"status": "ok", "model": self.model_name()}
        except Exception as exc:
            return 503, {"status": "unavailable", "error": status_details(exc)}

    async def _health(self, _request: Request) -> Response:
        status, body = await run_in_threadpool(self._health_body)
        return JSONResponse(body, status)

    async def _metrics(self, _request: Request) -> Response:
        if self._registry is None:
            raise HttpError(404, "not_found_error", "this gateway keeps no metrics")
        return Response(generate_latest(self._registry), media_type=CONTENT_TYPE_LATEST)

    async def _models(self, _request: Request) -> Response:
        model = {
            "id": await run_in_threadpool(self.model_name),
            "object": "model",
            "created": self.created,
            "owned_by": "speculant",
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def _generate(self, request: Request) -> Response:
        generate = parse_generate_request(await read_json(request))
        runs = ChoiceRuns(
            self.servicer, [generate], stream=False, logprobs=generate.HasField("top_logprobs")
        )
        async with _on_disconnect(request.receive, runs.cancel.set):
            await runs.start()
            answer = await runs.results()
        if answer is None:
            return Response(status_code=499)  # the client went away: nobody reads this
        return JSONResponse(generate_response(answer[0][0]))

    async def _completions(self, request: Request) -> Response | EventStream:
        return await self._openai(request, chat=False)

    async def _chat(self, request: Request) -> Response | EventStream:
        return await self._openai(request, chat=True)

    async def _openai(self, request: Request, *, chat: bool) -> Response | EventStream:
        api_request = parse_openai_request(await read_json(request), chat=chat)
        writer = ResponseWriter(api_request, await run_in_threadpool(self.model_name))
        runs = ChoiceRuns(
            self.servicer,
            api_request.generates,
            stream=api_request.stream,
            logprobs=api_request.logprobs,
        )
        try:
            async with _on_disconnect(request.receive, runs.cancel.set):
                await runs.start()  # validation, tokenizing, prefill: errors answer here
                if api_request.stream:
                    return EventStream(_stream(runs, writer, api_request), runs.cancel.set)
                answer = await runs.results()
        except Exception as exc:
            runs.cancel.set()
            raise http_error(exc, api_request) from exc
        if answer is None:
            return Response(status_code=499)  # the client went away: nobody reads this
        return JSONResponse(writer.response(*answer))


async def _stream(
    runs: ChoiceRuns, writer: ResponseWriter, request: ApiRequest
) -> AsyncIterator[bytes]:
    """Server-sent events: per choice (indexed), chunks as tokens are accepted and the finish;
    the usage if asked for; [DONE]. The status is sent first, so an error during the rounds is
    sent as an event ``{"error": ...}``."""
    results: list[GenerationResult | None] = [None] * runs.count
    try:
        for chunk in writer.opening_chunks(runs.count):
            yield _event(chunk)
        async for choice in runs.items():
            item = choice.item
            if isinstance(item, GenerationResult):
                results[choice.index] = item
                yield _event(writer.final_chunk(choice.index, item))
            elif item.text_delta or choice.entries:
                yield _event(writer.text_chunk(choice.index, item.text_delta, choice.entries))
        finished = [r for r in results if r is not None]
        if request.include_usage and len(finished) == runs.count:
            yield _event(writer.usage_chunk(finished))
    except Exception as exc:
        yield _event(http_error(exc, request).body())
    yield _event("[DONE]")


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0: a free port); OSError naming the flag."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or exc
        raise OSError(f"--http-port: cannot bind {host}:{port}: {reason}") from exc
    sock.set_inheritable(True)
    return sock


class HttpApiServer:
    """The HTTP API on host:port (port 0: a free one), served by uvicorn from a thread."""

    def __init__(
        self,
        servicer: GatewayServicer,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        auth_token: str | None = None,
        tls: ServerTls | None = None,
        model_name: str | None = None,
        registry: CollectorRegistry | None = None,
        stopping: threading.Event | None = None,
    ) -> None:
        """tls: serve HTTPS with the gateway's certificate (and require client certificates
        signed by its client CA, if any). registry: the metrics to serve at /metrics.
        stopping: see HttpApi."""
        self.api = HttpApi(
            servicer,
            auth_token=auth_token,
            model_name=model_name,
            registry=registry,
            stopping=stopping,
        )
        ssl_context = tls.ssl_context() if tls else None  # before binding: a clear error
        self._socket = _bind(host, port)
        self.host = host
        self.port = self._socket.getsockname()[1]
        self.scheme = "https" if tls else "http"
        config = uvicorn.Config(
            self.api,
            http="h11",
            loop="asyncio",
            ws="none",
            lifespan="off",
            log_config=None,  # the process's logging, as configured
            access_log=False,  # HttpApi writes one access line per request, with its id
            server_header=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=GRACEFUL_STOP_S,
            limit_concurrency=MAX_CONNECTIONS,
            backlog=BACKLOG,
        )
        config.load()
        config.ssl = ssl_context  # the same context as the gRPC server's credentials
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name="http-api", daemon=True)

    def _serve(self) -> None:
        asyncio.run(self._server.serve(sockets=[self._socket]))

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}"

    def start(self) -> HttpApiServer:
        """Serve; return once uvicorn accepts connections (RuntimeError if it does not)."""
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._socket.close()
                raise RuntimeError(f"the HTTP API did not start on {self.address}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop accepting connections; requests in flight get GRACEFUL_STOP_S to end."""
        if self._thread.is_alive():
            self._server.should_exit = True
            self._thread.join()
        self._socket.close()
