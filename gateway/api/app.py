"""The gateway's HTTP API: ``/health``, ``/generate``, OpenAI-compatible completions and
``/metrics``, beside the gRPC server in the same process.

A Starlette (ASGI) app (:class:`HttpApi`), served by :class:`HttpApiServer`: uvicorn on an event
loop of its own thread, on a socket bound up front (so a port in use is a clear error naming the
flag). Routes (JSON in and out; streams are server-sent events ending with ``data: [DONE]``):
- ``GET /health``: 200 ``{"status": "ok", "model": NAME}`` while the verifier answers its health
  checks and the tokenizers agree (as the gRPC health), else 503. Open even when a bearer token
  is required.
- ``GET /metrics``: the gateway's Prometheus metrics (its registry, as ``--metrics-port``
  serves it; open, as vLLM's).
- ``GET /v1/models``: the served model, and one ``<model>:<graph>`` entry per graph of the draft
  tier's catalog (a request naming one drafts from that graph, as vLLM serves LoRA adapters).
- ``POST /generate``: a GenerateRequest as JSON -> ``{text, token_ids, finish_reason, stats}``.
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's requests and answers
  (read by gateway.api.bodies and gateway.api.requests, answered by gateway.api.answers),
  ``"stream": true`` for server-sent events (gateway.api.streaming).
- ``GET /admin/graphs``, ``POST /admin/graphs`` (``{"name", "path"}``) and ``DELETE
  /admin/graphs/NAME``: the catalog (gateway.api.admin), with the admin token only (403 while
  the gateway has none).

Every generation runs through GenerationEngine.generate, as the gRPC Generate does (the same
defaults, validation, concurrency limit, coordinator and error classes), in a worker thread
(gateway.api.streaming): an answer with n choices takes n of the gateway's slots. Errors are
OpenAI-style ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status of the
error class (400 bad request or a body that is not JSON or nests too deeply, 401 no or wrong
token, 404, 405, 412 tokenizer mismatch, 413 body over MAX_BODY_BYTES, 429 over capacity, 503
backend down or the gateway stopping, 500 anything else), never a traceback. A client that
disconnects ends its generations between two rounds and frees their verifier sessions.

Every request is served under a request id, as a gRPC call is (speculant.request_context): the
client's ``X-Request-Id`` header when it is a clean one, else a new id; it is sent back in the
answer's ``X-Request-Id`` header, carried to the draft and verifier services, and named by
every log line of the request, among them one access line (method, path, status, time).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any

import uvicorn
from google.protobuf import json_format
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from gateway.api.admin import GraphAdmin
from gateway.api.answers import HttpError, ResponseWriter, generate_response, http_error
from gateway.api.bodies import AddGraphBody, TooDeep, check_depth, read_body
from gateway.api.requests import parse_generate_request, parse_openai_request
from gateway.api.server import prompt_request_from_pb
from gateway.api.streaming import ChoiceRuns, EventStream, answer_events, on_disconnect
from gateway.engine import GenerationEngine
from speculant.auth import ADMIN_OFF, ClientTokens, bearer_matches, expected_bearer
from speculant.errors import UnavailableError
from speculant.grpc_server import MAX_MESSAGE_BYTES, SHUTTING_DOWN, status_details
from speculant.request_context import clean_request_id, new_request_id, request_id_scope
from speculant.tls import ServerTls

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
ADMIN = "admin"  # a route that needs the admin token
MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # a bigger request body is refused (413)

# uvicorn's bounds: an idle keep-alive connection is closed after KEEP_ALIVE_S; beyond
# MAX_CONNECTIONS connections (and requests) at once new ones get a 503; on stop, requests in
# flight get GRACEFUL_STOP_S to end.
KEEP_ALIVE_S = 30
MAX_CONNECTIONS = 1024
BACKLOG = 256
GRACEFUL_STOP_S = 5
START_TIMEOUT_S = 30.0


Endpoint = Callable[[Request], Awaitable[Response | EventStream]]


class HttpApi:
    """Routes and answers: :attr:`app` is the ASGI application."""

    def __init__(
        self,
        engine: GenerationEngine,
        *,
        auth_token: str | ClientTokens | None = None,
        model_name: str | None = None,
        registry: CollectorRegistry | None = None,
        stopping: threading.Event | None = None,
        admin: GraphAdmin | None = None,
    ) -> None:
        """auth_token: require ``Authorization: Bearer <token>``, this token or one of these
        tenants' tokens (not on /health and /metrics). model_name: the name /v1/models and the
        answers give (default: the verifier's). registry: the metrics /metrics serves (None:
        /metrics is 404). stopping: set when the gateway begins to stop (its
        ServiceServer.stopping): from then on /health answers 503 and new requests are refused
        with 503, as its gRPC calls are. admin: the catalog's admin door (its admin token
        opens the /admin routes; None: they answer 403)."""
        self.engine = engine
        self._stopping = stopping
        self._clients = (
            ClientTokens.single(auth_token) if isinstance(auth_token, str) else auth_token
        )
        self._admin = admin
        self._admin_bearer = (
            expected_bearer(admin.admin_token)
            if admin is not None and admin.admin_token is not None
            else None
        )
        self._model_name = model_name
        self._registry = registry
        self.created = int(time.time())
        routes = [
            ("GET", "/health", self._health, False),
            ("GET", "/metrics", self._metrics, False),
            ("GET", "/v1/models", self._models, True),
            ("POST", "/generate", self._generate, True),
            ("POST", "/v1/completions", partial(self._openai, chat=False), True),
            ("POST", "/v1/chat/completions", partial(self._openai, chat=True), True),
            ("GET", "/admin/graphs", self._list_graphs, ADMIN),
            ("POST", "/admin/graphs", self._add_graph, ADMIN),
            ("DELETE", "/admin/graphs/{name}", self._remove_graph, ADMIN),
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

    def _answering(
        self, endpoint: Endpoint, auth: bool | str
    ) -> Callable[[Request], Awaitable[Any]]:
        """endpoint, behind the client token check (auth True) or the admin token's (ADMIN),
        with its errors answered as JSON."""

        async def answer(request: Request) -> Response | EventStream:
            try:
                if auth:
                    self._refuse_while_stopping()
                    if auth == ADMIN:
                        self._authenticate_admin(request)
                    else:
                        request.state.tenant = self._authenticate(request)
                return await endpoint(request)
            except Exception as exc:
                return http_error(exc).response()

        return answer

    def _refuse_while_stopping(self) -> None:
        if self._stopping is not None and self._stopping.is_set():
            raise UnavailableError(SHUTTING_DOWN)

    def _authenticate(self, request: Request) -> str:
        """The caller's tenant ("" without client tokens); 401 for a missing or bad token."""
        if self._clients is None:
            return ""
        tenant = self._clients.tenant_of(request.headers.get("authorization"))
        if tenant is None:
            raise HttpError(401, "authentication_error", "missing or bad bearer token")
        return tenant

    def _authenticate_admin(self, request: Request) -> None:
        """403 while the gateway has no admin token, 401 for a missing or bad one."""
        if self._admin_bearer is None:
            raise HttpError(403, "permission_error", ADMIN_OFF)
        if not bearer_matches(request.headers.get("authorization"), self._admin_bearer):
            raise HttpError(401, "authentication_error", "missing or bad admin token")

    def model_name(self) -> str:
        """The served model's name (asks the verifier once the backends are up; blocking)."""
        if self._model_name is None:
            self.engine.coordinator()  # the backends answer and their tokenizers agree
            self._model_name = self.engine.verifier.info.model_name
        return self._model_name

    def _health_body(self) -> tuple[int, dict[str, Any]]:
        try:
            self._refuse_while_stopping()
            if self.engine.problem is not None:  # from the gateway's last backend check
                raise UnavailableError(self.engine.problem)
            self.engine.coordinator()  # the backends answer and their tokenizers agree
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
        """The served model, then one ``<model>:<graph>`` entry per graph (its parent: the
        model, as vLLM lists LoRA adapters)."""
        name = await run_in_threadpool(self.model_name)
        models = [self._model_entry(name)]
        models += [
            self._model_entry(f"{name}:{graph}", parent=name) for graph in self.engine.graph_names()
        ]
        return JSONResponse({"object": "list", "data": models})

    def _model_entry(self, model_id: str, parent: str | None = None) -> dict[str, Any]:
        entry = {
            "id": model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "speculant",
        }
        if parent is not None:
            entry |= {"root": parent, "parent": parent}
        return entry

    async def _list_graphs(self, _request: Request) -> Response:
        assert self._admin is not None  # checked with the admin token
        answer = await run_in_threadpool(self._admin.list)
        return JSONResponse({"graphs": [_message_dict(g) for g in answer.graphs]})

    async def _add_graph(self, request: Request) -> Response:
        assert self._admin is not None
        body = read_body(AddGraphBody, await read_json(request))
        answer = await run_in_threadpool(self._admin.add, body.name, body.path)
        return JSONResponse(
            {"graph": _message_dict(answer.graph), "replaced": answer.replaced},
            201 if not answer.replaced else 200,
        )

    async def _remove_graph(self, request: Request) -> Response:
        assert self._admin is not None
        await run_in_threadpool(self._admin.remove, request.path_params["name"])
        return Response(status_code=204)

    async def _generate(self, request: Request) -> Response:
        generate = replace(
            prompt_request_from_pb(parse_generate_request(await read_json(request))),
            tenant=request.state.tenant,
        )
        runs = ChoiceRuns(
            self.engine, [generate], stream=False, logprobs=generate.top_logprobs is not None
        )
        async with on_disconnect(request.receive, runs.cancel.set):
            await runs.start()
            answer = await runs.results()
        if answer is None:
            return Response(status_code=499)  # the client went away: nobody reads this
        return JSONResponse(generate_response(answer[0][0]))

    async def _openai(self, request: Request, *, chat: bool) -> Response | EventStream:
        api_request = parse_openai_request(await read_json(request), chat=chat)
        served = await run_in_threadpool(self.model_name)
        api_request = api_request.with_graph(served, request.state.tenant)
        graph = api_request.generates[0].graph
        writer = ResponseWriter(api_request, f"{served}:{graph}" if graph else served)
        runs = ChoiceRuns(
            self.engine,
            api_request.generates,
            stream=api_request.stream,
            logprobs=api_request.logprobs,
        )
        try:
            async with on_disconnect(request.receive, runs.cancel.set):
                await runs.start()  # validation, tokenizing, prefill: errors answer here
                if api_request.stream:
                    return EventStream(answer_events(runs, writer, api_request), runs.cancel.set)
                answer = await runs.results()
        except Exception as exc:
            runs.cancel.set()
            raise http_error(exc, api_request) from exc
        if answer is None:
            return Response(status_code=499)  # the client went away: nobody reads this
        return JSONResponse(writer.response(*answer))


def _message_dict(message: Any) -> dict[str, Any]:
    """A protobuf message as JSON with its field names as in the proto (every field shown)."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


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
        engine: GenerationEngine,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        auth_token: str | ClientTokens | None = None,
        tls: ServerTls | None = None,
        model_name: str | None = None,
        registry: CollectorRegistry | None = None,
        stopping: threading.Event | None = None,
        admin: GraphAdmin | None = None,
    ) -> None:
        """tls: serve HTTPS with the gateway's certificate (and require client certificates
        signed by its client CA, if any). registry: the metrics to serve at /metrics.
        stopping, admin: see HttpApi."""
        self.api = HttpApi(
            engine,
            auth_token=auth_token,
            model_name=model_name,
            registry=registry,
            stopping=stopping,
            admin=admin,
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
