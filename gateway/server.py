"""The gateway service: Generate and GenerateStream over the draft and verifier services.

At start-up (and again whenever the check has not yet succeeded, e.g. a backend was down) the
gateway compares the graph's tokenizer fingerprint with the verifier's and refuses to generate
on a mismatch (FAILED_PRECONDITION naming both tokenizers).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, fields

import grpc

from gateway.alignment import check_tokenizer_alignment
from gateway.clients import (
    GrpcDraftClient,
    GrpcVerifierClient,
    request_deadline,
)
from gateway.coordinator import (
    Coordinator,
    GenerationRequest,
    GenerationResult,
    StreamChunk,
    encode_prompt,
)
from gateway.metrics import GatewayMetrics
from gateway.stats import GenerationStats
from gateway.stopping import FinishReason
from speculant.config import (
    DEFAULT_DRAFT_REFRESH_S,
    DEFAULT_NEXT_ROUND_DRAFTS,
    DraftConfig,
    GenerationConfig,
)
from speculant.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    RemoteError,
    ResourceExhaustedError,
)
from speculant.grpc_server import ServiceServer, map_errors, map_stream_errors
from speculant.metrics import Metrics
from speculant.strategies import STRATEGY_FROM_PROTO
from speculant.tls import ClientTls, ServerTls
from speculant.tokenizer import TokenizerLoadError, load_tokenizer, tokenizer_fingerprint
from speculant.types import DraftParams
from speculant.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = "speculant.v1.GatewayService"

FINISH_REASON_TO_PROTO = {
    FinishReason.EOS: gateway_pb2.FINISH_REASON_EOS,
    FinishReason.MAX_TOKENS: gateway_pb2.FINISH_REASON_MAX_TOKENS,
    FinishReason.STOP: gateway_pb2.FINISH_REASON_STOP,
    FinishReason.CONTEXT_LENGTH: gateway_pb2.FINISH_REASON_CONTEXT_LENGTH,
}
# DraftOptions fields that override a DraftParams field of the same name (strategy: an enum)
_OPTION_FIELDS = tuple(f.name for f in fields(DraftParams) if f.name != "strategy")
# a request's strategy: unset (None: the gateway's default) or a name
REQUESTED_STRATEGY = {common_pb2.DRAFT_STRATEGY_UNSPECIFIED: None, **STRATEGY_FROM_PROTO}
MAX_TOKENS_LIMIT = 1 << 20


def stats_to_proto(stats: GenerationStats) -> gateway_pb2.GenerationStats:
    return gateway_pb2.GenerationStats(**stats.as_dict())


def draft_params_from_proto(options: common_pb2.DraftOptions, defaults: DraftConfig) -> DraftParams:
    """Request draft options over the configured defaults (unset optional field = default).

    Mixing parameters set neither in the request nor in the gateway's configuration stay unset
    (None): the draft service then uses its graph's tuned defaults.
    """
    if options.strategy not in REQUESTED_STRATEGY:
        raise InvalidArgumentError("draft.strategy", f"unknown strategy {options.strategy}")
    values = asdict(DraftParams.from_config(defaults))
    for name in _OPTION_FIELDS:
        if options.HasField(name):
            values[name] = getattr(options, name)
    values["strategy"] = REQUESTED_STRATEGY[options.strategy] or defaults.strategy
    return DraftParams(**values)


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    """Generate / GenerateStream: validate, tokenize, run the coordinator's rounds."""

    def __init__(
        self,
        drafter: GrpcDraftClient,
        verifier: GrpcVerifierClient,
        *,
        tokenizer_name: str | None = None,
        draft_defaults: DraftConfig | None = None,
        generation_defaults: GenerationConfig | None = None,
        max_concurrent: int = 64,
        next_round_drafts: int = DEFAULT_NEXT_ROUND_DRAFTS,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        """max_concurrent: generations in flight at once; more get RESOURCE_EXHAUSTED.
        next_round_drafts: drafts the draft service prepares for the next round while the
        verifier runs (see Coordinator; 0 = off). metrics: count generations in it."""
        self.metrics = metrics
        if next_round_drafts < 0:
            raise ValueError(f"next_round_drafts must be >= 0, got {next_round_drafts}")
        self.max_concurrent = max_concurrent
        self.next_round_drafts = next_round_drafts
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self.drafter = drafter
        self.verifier = verifier
        self.tokenizer_name = tokenizer_name
        self.draft_defaults = draft_defaults or DraftConfig()
        self.generation_defaults = generation_defaults or GenerationConfig()
        self._coordinator: Coordinator | None = None
        self._lock = threading.Lock()

    def coordinator(self) -> Coordinator:
        """The coordinator, created once the backends answer and their tokenizers agree."""
        with self._lock:
            if self._coordinator is None:
                self._coordinator = self._connect()
            return self._coordinator

    def _connect(self) -> Coordinator:
        info = self.verifier.info
        graph = self.drafter.graph_info()
        check_tokenizer_alignment(
            graph.tokenizer_name,
            graph.tokenizer_fingerprint,
            info.tokenizer_name,
            info.tokenizer_fingerprint,
        )
        try:
            tokenizer = load_tokenizer(self.tokenizer_name or info.tokenizer_name)
        except TokenizerLoadError as exc:
            if self.tokenizer_name:
                raise
            # the verifier's tokenizer, named as it loaded there (another host or directory)
            raise TokenizerLoadError(
                f"{exc}; give the gateway the verifier's tokenizer with --tokenizer NAME_OR_DIR"
            ) from exc
        if tokenizer_fingerprint(tokenizer) != info.tokenizer_fingerprint:
            raise FailedPreconditionError(
                f"the gateway's tokenizer {self.tokenizer_name or info.tokenizer_name!r} differs "
                f"from the verifier's ({info.tokenizer_name!r})"
            )
        log.info(
            "backends ready: model %s, graph of order %d (tokenizer %s)",
            info.model_name,
            graph.max_order,
            info.tokenizer_name,
        )
        return Coordinator(
            self.drafter,
            self.verifier,
            tokenizer,
            draft_context_window=graph.max_order,
            next_round_drafts=self.next_round_drafts,
        )

    def _to_request(
        self, request: gateway_pb2.GenerateRequest, coordinator: Coordinator
    ) -> GenerationRequest:
        defaults = self.generation_defaults
        max_tokens = request.max_tokens if request.HasField("max_tokens") else defaults.max_tokens
        if max_tokens > MAX_TOKENS_LIMIT:
            raise InvalidArgumentError("max_tokens", f"must be <= {MAX_TOKENS_LIMIT}")
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        return GenerationRequest(
            prompt_ids=encode_prompt(coordinator.tokenizer, request.prompt, messages or None),
            max_tokens=max_tokens,
            temperature=(
                request.temperature if request.HasField("temperature") else defaults.temperature
            ),
            seed=request.seed if request.HasField("seed") else defaults.seed,
            stop=tuple(request.stop) or tuple(defaults.stop),
            draft=draft_params_from_proto(request.draft, self.draft_defaults),
        ).validate()

    def _stream(
        self, request: gateway_pb2.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[StreamChunk | GenerationResult]:
        return self.generation(
            request,
            time_remaining_s=context.time_remaining(),
            cancelled=lambda: not context.is_active(),
        )

    def generation(
        self,
        request: gateway_pb2.GenerateRequest,
        *,
        time_remaining_s: float | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[StreamChunk | GenerationResult]:
        """Run one request: StreamChunks as tokens are accepted, then one GenerationResult.

        The entry point of every front end (gRPC here, HTTP in gateway.http_api): it takes a
        slot of max_concurrent, validates and tokenizes the request (errors are raised before
        the first item) and drives the coordinator. time_remaining_s: the request's deadline;
        cancelled: polled between rounds. Closing the iterator early releases the verifier
        session and the slot.
        """
        if not self._slots.acquire(blocking=False):
            raise ResourceExhaustedError(
                f"the gateway is running its limit of {self.max_concurrent} generations; "
                "retry later"
            )
        if self.metrics is not None:
            self.metrics.in_flight.inc()
        try:
            with request_deadline(time_remaining_s):
                coordinator = self.coordinator()
                gen_request = self._to_request(request, coordinator)
                for item in coordinator.stream(gen_request, cancelled=cancelled):
                    if isinstance(item, GenerationResult):
                        self._finished(item)
                    yield item
        except RemoteError as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE:
                self._forget_backends()
            raise
        finally:
            self._slots.release()
            if self.metrics is not None:
                self.metrics.in_flight.dec()

    def _finished(self, result: GenerationResult) -> None:
        """Log (one line per generation) and count a finished generation."""
        stats = result.stats
        log.info(
            "generated %d tokens (prompt %d) in %.3f s: %d rounds, acceptance %.2f, finish %s",
            stats.generated_tokens,
            stats.prompt_tokens,
            stats.total_seconds,
            stats.rounds,
            stats.acceptance_rate,
            result.finish_reason.value,
        )
        if self.metrics is not None:
            self.metrics.observe(stats, result.finish_reason.value)

    def _forget_backends(self) -> None:
        """The verifier went away: check the tokenizers again when it is back (it may have
        been restarted with another model)."""
        with self._lock:
            self._coordinator = None
            self.verifier.forget_info()

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
                    text_delta=item.text_delta, token_ids=item.token_ids
                )


def start_gateway(
    draft_addresses: Sequence[str],
    verifier_address: str,
    *,
    host: str = "127.0.0.1",
    port: int = 50050,
    tokenizer_name: str | None = None,
    draft_timeout_s: float = 0.25,
    draft_refresh_s: float = DEFAULT_DRAFT_REFRESH_S,
    check_backends: bool = True,
    max_concurrent: int = 64,
    next_round_drafts: int = DEFAULT_NEXT_ROUND_DRAFTS,
    draft_defaults: DraftConfig | None = None,
    auth_token: str | None = None,
    tls: ServerTls | None = None,
    backend_tls: ClientTls | None = None,
    metrics: Metrics | None = None,
) -> tuple[ServiceServer, GatewayServicer]:
    """Start a gateway server; with check_backends, fail fast on a tokenizer mismatch.
    draft_defaults: for requests that leave a drafting field unset (default: DraftConfig()).
    auth_token: clients must send ``authorization: Bearer <auth_token>`` (speculant.auth).
    tls: serve TLS; backend_tls: reach the draft and verifier services over TLS.
    metrics: count calls and generations in it (its /metrics endpoint is the caller's)."""
    servicer = GatewayServicer(
        GrpcDraftClient(
            draft_addresses, timeout_s=draft_timeout_s, tls=backend_tls, refresh_s=draft_refresh_s
        ),
        GrpcVerifierClient(verifier_address, tls=backend_tls),
        tokenizer_name=tokenizer_name,
        draft_defaults=draft_defaults,
        max_concurrent=max_concurrent,
        next_round_drafts=next_round_drafts,
        metrics=None if metrics is None else GatewayMetrics(metrics.registry),
    )
    if check_backends:
        try:
            servicer.coordinator()
        except FailedPreconditionError:
            raise
        except Exception as exc:  # a backend not up yet: check again on the first request
            log.warning("backends not ready yet (%s); will check on the first request", exc)
    # Enough worker threads that requests over the limit are answered RESOURCE_EXHAUSTED at
    # once instead of queueing for a thread.
    server = ServiceServer(
        host,
        port,
        [SERVICE_NAME],
        max_workers=max_concurrent + 8,
        auth_token=auth_token,
        tls=tls,
        metrics=metrics,
    )
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(servicer, server.grpc_server)
    server.start()
    server.set_serving()
    return server, servicer
