"""The gateway's gRPC door: Generate and GenerateStream over the engine (gateway.engine).

The servicer turns each GenerateRequest into the library's PromptRequest
(:func:`prompt_request_from_pb`), runs it on the :class:`~gateway.engine.GenerationEngine` and
writes its chunks and result back as protobuf; the engine's typed errors become status codes
(speculant.grpc_server.map_errors). :func:`start_gateway` starts the server with its engine.

Health (gRPC and HTTP) follows the backends: a watcher thread checks them every
WATCH_INTERVAL_S (GenerationEngine.check_backends, deadline HEALTH_TIMEOUT_S); while the verifier
does not answer SERVING, or the tokenizers do not agree, the gateway reports NOT_SERVING.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from dataclasses import replace

import grpc

from gateway.api.admin import GatewayAdminServicer, GraphAdmin
from gateway.backends import (
    DEFAULT_VERIFIER_TIMEOUT_S,
    GrpcDraftClient,
    GrpcVerifierClient,
    LearnReporter,
)
from gateway.engine import GenerationEngine
from gateway.generation import (
    FinishReason,
    GenerationResult,
    GenerationStats,
    PromptRequest,
    StreamChunk,
)
from gateway.metrics import GatewayMetrics
from speculant.auth import ClientTokens, authorization, check_admin_token
from speculant.config import DEFAULT_DRAFT_REFRESH_S, DraftConfig
from speculant.errors import FailedPreconditionError
from speculant.grpc_server import ServiceServer, map_errors, map_stream_errors
from speculant.metrics import Metrics
from speculant.tls import ClientTls, ServerTls
from speculant.v1 import admin_pb2_grpc, gateway_pb2, gateway_pb2_grpc
from speculant.wire import (
    constraint_from_pb,
    draft_fields_from_pb,
    logprobs_to_pb,
    optional_top_logprobs,
    sampling_controls_from_pb,
)

log = logging.getLogger(__name__)

SERVICE_NAME = "speculant.v1.GatewayService"
ADMIN_SERVICE_NAME = "speculant.v1.AdminService"

FINISH_REASON_TO_PROTO = {
    FinishReason.EOS: gateway_pb2.FINISH_REASON_EOS,
    FinishReason.MAX_TOKENS: gateway_pb2.FINISH_REASON_MAX_TOKENS,
    FinishReason.STOP: gateway_pb2.FINISH_REASON_STOP,
    FinishReason.CONTEXT_LENGTH: gateway_pb2.FINISH_REASON_CONTEXT_LENGTH,
}
WATCH_INTERVAL_S = 1.0  # how often the gateway checks its verifier (and a missing draft tier)


def stats_to_proto(stats: GenerationStats) -> gateway_pb2.GenerationStats:
    return gateway_pb2.GenerationStats(**stats.as_dict(round_times=True))


def prompt_request_from_pb(request: gateway_pb2.GenerateRequest) -> PromptRequest:
    """A GenerateRequest as the library's request (unset optional fields: None, the engine's
    defaults)."""

    def optional(name: str) -> object:
        return getattr(request, name) if request.HasField(name) else None

    return PromptRequest(
        prompt=request.prompt,
        messages=tuple({"role": m.role, "content": m.content} for m in request.messages),
        prompt_token_ids=tuple(request.prompt_token_ids),
        max_tokens=optional("max_tokens"),  # type: ignore[arg-type]
        temperature=optional("temperature"),  # type: ignore[arg-type]
        seed=optional("seed"),  # type: ignore[arg-type]
        stop=tuple(request.stop),
        draft=draft_fields_from_pb(request.draft),
        sampling=sampling_controls_from_pb(request.sampling),
        top_logprobs=optional_top_logprobs(request),
        constraint=constraint_from_pb(request.constraint),
        graph=request.graph,
    )


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    """Generate / GenerateStream: a GenerateRequest in, the engine's generation out, for the
    tenant of the caller's token."""

    def __init__(self, engine: GenerationEngine, clients: ClientTokens | None = None) -> None:
        self.engine = engine
        self.clients = clients

    def _stream(
        self, request: gateway_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[StreamChunk | GenerationResult]:
        tenant = ""
        if self.clients is not None:  # the interceptor let only the clients' tokens in
            tenant = self.clients.tenant_of(authorization(context.invocation_metadata())) or ""
        return self.engine.generate(
            replace(prompt_request_from_pb(request), tenant=tenant),
            time_remaining_s=context.time_remaining(),
            cancelled=lambda: not context.is_active(),
        )

    @map_errors
    def Generate(
        self, request: gateway_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> gateway_pb2.GenerateResponse:
        for item in self._stream(request, context):
            if isinstance(item, GenerationResult):
                return gateway_pb2.GenerateResponse(
                    text=item.text,
                    token_ids=item.token_ids,
                    finish_reason=FINISH_REASON_TO_PROTO[item.finish_reason],
                    stats=stats_to_proto(item.stats),
                    logprobs=logprobs_to_pb(item.logprobs),
                )
        context.abort(grpc.StatusCode.CANCELLED, "generation cancelled")

    @map_stream_errors
    def GenerateStream(
        self, request: gateway_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[gateway_pb2.GenerateStreamResponse]:
        for item in self._stream(request, context):
            if isinstance(item, GenerationResult):
                yield gateway_pb2.GenerateStreamResponse(
                    finish_reason=FINISH_REASON_TO_PROTO[item.finish_reason],
                    stats=stats_to_proto(item.stats),
                )
            elif item.token_ids or item.text_delta:
                yield gateway_pb2.GenerateStreamResponse(
                    text_delta=item.text_delta,
                    token_ids=item.token_ids,
                    logprobs=logprobs_to_pb(item.logprobs),
                )


def start_gateway(
    draft_addresses: Sequence[str],
    verifier_address: str,
    *,
    host: str = "127.0.0.1",
    port: int = 50050,
    tokenizer_name: str | None = None,
    draft_timeout_s: float = 0.25,
    verifier_timeout_s: float = DEFAULT_VERIFIER_TIMEOUT_S,
    draft_refresh_s: float = DEFAULT_DRAFT_REFRESH_S,
    check_backends: bool = True,
    max_concurrent: int = 64,
    draft_defaults: DraftConfig | None = None,
    auth_token: str | ClientTokens | None = None,
    admin_token: str | None = None,
    tls: ServerTls | None = None,
    backend_tls: ClientTls | None = None,
    metrics: Metrics | None = None,
    learn: bool = True,
    verify_cost: str = "measured",
    chat_template: str | None = None,
) -> tuple[ServiceServer, GenerationEngine]:
    """Start a gateway server and its engine; with check_backends, fail fast on a tokenizer
    mismatch. draft_defaults: for requests that leave a drafting field unset.
    auth_token: clients must send ``authorization: Bearer <token>`` with this token, or one of
    these tenants' tokens (speculant.auth); admin_token: the token AdminService calls need
    (None: refused), which the gateway also sends to the draft replicas.
    tls: serve TLS; backend_tls: reach the backends over TLS. verifier_timeout_s: the most a
    verifier call or Session step may wait for its answer.
    metrics: count calls and generations in it (its /metrics endpoint is the caller's).
    learn: report every finished generation to the draft tier (gateway.backends);
    verify_cost: the cost profile that sizes drafts (GenerationEngine's); chat_template: the
    chat template every chat request is rendered with (None: the tokenizer's)."""
    drafter = GrpcDraftClient(
        draft_addresses, timeout_s=draft_timeout_s, tls=backend_tls, refresh_s=draft_refresh_s
    )
    engine = GenerationEngine(
        drafter,
        GrpcVerifierClient(verifier_address, timeout_s=verifier_timeout_s, tls=backend_tls),
        tokenizer_name=tokenizer_name,
        draft_defaults=draft_defaults,
        max_concurrent=max_concurrent,
        metrics=None if metrics is None else GatewayMetrics(metrics.registry),
        learner=LearnReporter(drafter) if learn else None,
        verify_cost=verify_cost,
        chat_template=chat_template,
    )
    if check_backends:
        _check_at_start(engine)
    clients = ClientTokens.single(auth_token) if isinstance(auth_token, str) else auth_token
    check_admin_token(admin_token, clients)
    # Enough worker threads to answer RESOURCE_EXHAUSTED at once over the limit, never queue.
    server = ServiceServer(
        host,
        port,
        [SERVICE_NAME, ADMIN_SERVICE_NAME],
        max_workers=max_concurrent + 8,
        auth_token=clients,
        admin_token=admin_token,
        tls=tls,
        metrics=metrics,
    )
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(
        GatewayServicer(engine, clients), server.grpc_server
    )
    admin_pb2_grpc.add_AdminServiceServicer_to_server(
        GatewayAdminServicer(GraphAdmin(engine, drafter, admin_token)), server.grpc_server
    )
    server.start()
    watch_backends(engine, server)
    return server, engine


def _check_at_start(engine: GenerationEngine) -> None:
    """Find the draft tier and connect now: FailedPreconditionError on a tokenizer mismatch;
    a backend not up yet is only logged (the watcher checks again)."""
    engine.find_draft_tier()
    try:
        engine.coordinator()
    except FailedPreconditionError:
        raise
    except Exception as exc:
        log.warning("backends not ready yet (%s); checking every %g s", exc, WATCH_INTERVAL_S)


def watch_backends(
    engine: GenerationEngine, server: ServiceServer, interval_s: float = WATCH_INTERVAL_S
) -> threading.Thread:
    """Report the gateway's health from its backends now, then every interval_s until the
    server stops (see GenerationEngine.check_backends); returns the watcher thread."""

    def report() -> None:
        problem = engine.check_backends()
        engine.problem = problem
        server.set_serving(problem is None)

    def run() -> None:
        while not server.stopping.wait(interval_s):
            try:
                report()
            except Exception:  # never let the watcher die
                log.exception("backend check failed")
        engine.drafter.close()

    report()
    thread = threading.Thread(target=run, name="backend-watch", daemon=True)
    thread.start()
    return thread
