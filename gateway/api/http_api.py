"""The gateway's HTTP API: ``/health``, ``/generate``, OpenAI-compatible completions and
``/metrics``, beside the gRPC server in the same process.

A Starlette (ASGI) app (served by gateway.api.http_server: uvicorn on an event loop of its own
thread; bodies, errors and event streams in gateway.api.http_io). Routes (JSON in
and out; streams are server-sent events ending with ``data: [DONE]``):
- ``GET /health``: 200 ``{"status": "ok", "model": NAME}`` while the verifier answers its health
  checks and the tokenizers agree (as the gRPC health), else 503. Open even when a bearer token
  is required.
- ``GET /metrics``: the gateway's Prometheus metrics (its registry, as ``--metrics-port``
  serves it; open, as vLLM's).
- ``GET /v1/models``: the served model, and one ``<model>:<graph>`` entry per graph of the draft
  tier's catalog (a request naming one drafts from that graph, as vLLM serves LoRA adapters).
- ``POST /generate``: a GenerateRequest as JSON -> ``{text, token_ids, finish_reason, stats}``.
- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's requests and answers
  (see gateway.api.openai_format and gateway.api.http_answers), ``"stream": true`` for server-sent
  events.
- ``GET /admin/graphs``, ``POST /admin/graphs`` (``{"name", "path"}``) and ``DELETE
  /admin/graphs/NAME``: the catalog (gateway.api.admin), with the admin token only (403 while
  the gateway has none).

Every generation runs through GenerationEngine.generate, as the gRPC Generate does (the same
defaults, validation, concurrency limit, coordinator and error classes), in a worker thread
(gateway.api.http_runs): an answer with n choices takes n of the gateway's slots. Errors are
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

import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import Any

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
from gateway.api.http_answers import ResponseWriter, generate_response
from gateway.api.http_io import EventStream, HttpError, event, http_error, on_disconnect, read_json
from gateway.api.http_runs import ChoiceRuns
from gateway.api.openai_format import (
    ApiRequest,
    parse_generate_request,
    parse_openai_request,
)
from gateway.api.server import prompt_request_from_pb
from gateway.engine import GenerationEngine
from gateway.generation import GenerationResult
from speculant.auth import ADMIN_OFF, ClientTokens, bearer_matches, expected_bearer
from speculant.errors import InvalidArgumentError, UnavailableError
from speculant.grpc_server import SHUTTING_DOWN, status_details
from speculant.request_context import clean_request_id, new_request_id, request_id_scope

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
ADMIN = "admin"  # a route that needs the admin token
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
            ("POST", "/v1/completions", self._completions, True),
            ("POST", "/v1/chat/completions", self._chat, True),
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
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidArgumentError("request", "the body must be a JSON object")
        for field_name in body:
            if field_name not in ("name", "path"):
                raise InvalidArgumentError(field_name, "unrecognized field (name, path)")
        name, path = body.get("name"), body.get("path")
        for field_name, value in (("name", name), ("path", path)):
            if not isinstance(value, str) or not value:
                raise InvalidArgumentError(field_name, "must be a non-empty string")
        answer = await run_in_threadpool(self._admin.add, name, path)
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

    async def _completions(self, request: Request) -> Response | EventStream:
        return await self._openai(request, chat=False)

    async def _chat(self, request: Request) -> Response | EventStream:
        return await self._openai(request, chat=True)

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
            yield event(chunk)
        async for choice in runs.items():
            item = choice.item
            if isinstance(item, GenerationResult):
                results[choice.index] = item
                for chunk in writer.final_chunks(choice.index, item):
                    yield event(chunk)
            elif item.text_delta or choice.entries:
                for chunk in writer.text_chunks(choice.index, item.text_delta, choice.entries):
                    yield event(chunk)
        finished = [r for r in results if r is not None]
        if request.include_usage and len(finished) == runs.count:
            yield event(writer.usage_chunk(finished))
    except Exception as exc:
        yield event(http_error(exc, request).body())
    yield event("[DONE]")


def _message_dict(message: Any) -> dict[str, Any]:
    """A protobuf message as JSON with its field names as in the proto (every field shown)."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
