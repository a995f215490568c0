"""The gateway service: Generate and GenerateStream over the draft and verifier services.

At start-up (and again whenever the check has not yet succeeded, e.g. a backend was down) the
gateway compares the graph's tokenizer fingerprint with the verifier's and refuses to generate
on a mismatch (FAILED_PRECONDITION naming both tokenizers).

Drafts are an optimisation: while no draft replica answers (the draft tier is down at the
gateway's start, say), the gateway serves verifier-only (empty drafts: exactly the target's
output, one token per forward) and asks the draft tier for its graph every second; once one
answers and its tokenizer is the verifier's, requests draft again. Both switches are logged.

Health (gRPC and HTTP) follows the backends: a watcher thread checks the verifier's health every
WATCH_INTERVAL_S (deadline HEALTH_TIMEOUT_S); while it does not answer SERVING, or the tokenizers
do not agree, the gateway reports NOT_SERVING and refuses new generations at once (UNAVAILABLE).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence

import grpc

from gateway.alignment import check_tokenizer_alignment
from gateway.coordinator import Coordinator
from gateway.deadlines import request_deadline
from gateway.draft_client import GrpcDraftClient
from gateway.generation import GenerationRequest, GenerationResult, StreamChunk
from gateway.interfaces import GenerationLearner, RemoteDraftTier, RemoteVerifier
from gateway.learning import LearnReporter
from gateway.metrics import GatewayMetrics
from gateway.prompt_limits import SLACK, check_prompt_chars, max_token_chars
from gateway.stats import GenerationStats
from gateway.stopping import FinishReason
from gateway.verifier_client import DEFAULT_VERIFIER_TIMEOUT_S, GrpcVerifierClient
from speculant.config import (
    DEFAULT_DRAFT_REFRESH_S,
    DEFAULT_NEXT_ROUND_DRAFTS,
    DraftConfig,
    GenerationConfig,
)
from speculant.cost_profile import verify_cost_profile
from speculant.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    RemoteError,
    ResourceExhaustedError,
    SpeculantError,
    UnavailableError,
)
from speculant.grpc_server import ServiceServer, map_errors, map_stream_errors
from speculant.metrics import Metrics
from speculant.prompting import encode_prompt, token_id_prompt
from speculant.tls import ClientTls, ServerTls
from speculant.tokenizer import TokenizerLoadError, load_tokenizer, tokenizer_fingerprint
from speculant.types import DraftParams, DraftProposal, SamplingControls
from speculant.v1 import draft_pb2, gateway_pb2, gateway_pb2_grpc
from speculant.wire import (
    draft_options_from_pb,
    logprobs_to_pb,
    optional_top_logprobs,
    sampling_controls_from_pb,
)

log = logging.getLogger(__name__)

SERVICE_NAME = "speculant.v1.GatewayService"

FINISH_REASON_TO_PROTO = {
    FinishReason.EOS: gateway_pb2.FINISH_REASON_EOS,
    FinishReason.MAX_TOKENS: gateway_pb2.FINISH_REASON_MAX_TOKENS,
    FinishReason.STOP: gateway_pb2.FINISH_REASON_STOP,
    FinishReason.CONTEXT_LENGTH: gateway_pb2.FINISH_REASON_CONTEXT_LENGTH,
}
# DraftOptions fields that override a DraftParams field of the same name (strategy: an enum)
# a request's strategy: unset (None: the gateway's default) or a name
MAX_TOKENS_LIMIT = 1 << 20
WATCH_INTERVAL_S = 1.0  # how often the gateway checks its verifier (and a missing draft tier)
HEALTH_TIMEOUT_S = 2.0  # deadline of those checks


def stats_to_proto(stats: GenerationStats) -> gateway_pb2.GenerationStats:
    return gateway_pb2.GenerationStats(**stats.as_dict())


class NoDrafts:
    """The drafter while no draft replica answers: every draft is empty (the verifier then
    emits one token per round, the target model's own)."""

    def propose(self, context_ids: Sequence[int], params: DraftParams, seed=None) -> DraftProposal:
        return DraftProposal()


class GatewayServicer(gateway_pb2_grpc.GatewayServiceServicer):
    """Generate / GenerateStream: validate, tokenize, run the coordinator's rounds."""

    def __init__(
        self,
        drafter: RemoteDraftTier,
        verifier: RemoteVerifier,
        *,
        tokenizer_name: str | None = None,
        draft_defaults: DraftConfig | None = None,
        generation_defaults: GenerationConfig | None = None,
        max_concurrent: int = 64,
        next_round_drafts: int = DEFAULT_NEXT_ROUND_DRAFTS,
        metrics: GatewayMetrics | None = None,
        learner: GenerationLearner | None = None,
        verify_cost: str = "measured",
    ) -> None:
        """max_concurrent: generations in flight at once; more get RESOURCE_EXHAUSTED.
        verify_cost: the cost profile that sizes drafts, "measured" (the verifier's, as
        GetModelInfo reports it), "flat" or a cost profile file (see
        speculant.cost_profile.verify_cost_profile).
        next_round_drafts: drafts the draft service prepares for the next round while the
        verifier runs (see Coordinator; 0 = off). metrics: count generations in it.
        learner: gets every finished generation (gateway.learning.LearnReporter; None: the
        draft tier learns nothing from this gateway)."""
        self.metrics = metrics
        self.learner = learner
        self.verify_cost = verify_cost
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
        # The draft tier's graph, once a replica has answered (None: serving verifier-only).
        self._graph: draft_pb2.GetGraphInfoResponse | None = None
        self._draft_tier_missing_logged = False
        # Why the verifier's last health check failed (None: it answered SERVING).
        self._verifier_down: str | None = None
        # Why the gateway cannot serve, from the last backend check (None: it can).
        self.problem: str | None = None
        # (name, fingerprint, tokenizer, the most characters a token stands for)
        self._tokenizer: tuple[str, str, object, int] | None = None
        self._prompt_chars_limit = 0  # longer prompts are refused untokenized (prompt_limits)

    def coordinator(self) -> Coordinator:
        """The coordinator, created once the backends answer and their tokenizers agree
        (UnavailableError at once while the verifier's health check fails)."""
        if self._coordinator is None and self._graph is None:
            self.find_draft_tier()  # drafting from the start if a replica answers
        with self._lock:
            if self._coordinator is None:
                if self._verifier_down is not None:
                    raise UnavailableError(
                        f"the verifier at {self.verifier.address} does not answer "
                        f"({self._verifier_down}); retry later"
                    )
                self._coordinator = self._connect()
            return self._coordinator

    def _connect(self) -> Coordinator:
        info = self.verifier.info
        graph = self._graph
        if graph is not None:
            check_tokenizer_alignment(
                graph.tokenizer_name,
                graph.tokenizer_fingerprint,
                info.tokenizer_name,
                info.tokenizer_fingerprint,
            )
        tokenizer = self._load_tokenizer(info.tokenizer_name, info.tokenizer_fingerprint)
        assert self._tokenizer is not None
        self._prompt_chars_limit = SLACK * info.max_context_length * self._tokenizer[3]
        log.info(
            "backends ready: model %s, %s (tokenizer %s)",
            info.model_name,
            "verifier-only: no draft replica answers yet"
            if graph is None
            else f"graph of order {graph.max_order}",
            info.tokenizer_name,
        )
        return Coordinator(
            self.drafter if graph is not None else NoDrafts(),
            self.verifier,
            tokenizer,
            draft_context_window=graph.max_order if graph is not None else 1,
            next_round_drafts=self.next_round_drafts if graph is not None else 0,
            learner=self.learner,
            verify_cost=verify_cost_profile(self.verify_cost, info),
        )

    def _load_tokenizer(self, verifier_tokenizer: str, fingerprint: str) -> object:
        """The prompts' tokenizer (loaded once per verifier tokenizer), checked against the
        verifier's fingerprint."""
        name = self.tokenizer_name or verifier_tokenizer
        if self._tokenizer is not None and self._tokenizer[:2] == (name, fingerprint):
            return self._tokenizer[2]
        try:
            tokenizer = load_tokenizer(name)
        except TokenizerLoadError as exc:
            if self.tokenizer_name:
                raise
            # the verifier's tokenizer, named as it loaded there (another host or directory)
            raise TokenizerLoadError(
                f"{exc}; give the gateway the verifier's tokenizer with --tokenizer NAME_OR_DIR"
            ) from exc
        if tokenizer_fingerprint(tokenizer) != fingerprint:
            raise FailedPreconditionError(
                f"the gateway's tokenizer {name!r} differs "
                f"from the verifier's ({verifier_tokenizer!r})"
            )
        self._tokenizer = (name, fingerprint, tokenizer, max_token_chars(tokenizer))
        return tokenizer

    def find_draft_tier(self, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
        """Whether a draft replica has answered: until one does, ask for its graph (then the
        coordinator is made again, drafting). Never raises."""
        if self._graph is not None:
            return True
        try:
            graph = self.drafter.graph_info(timeout_s)
        except UnavailableError as exc:
            if not self._draft_tier_missing_logged:
                self._draft_tier_missing_logged = True
                log.warning("%s: serving verifier-only until a draft replica answers", exc)
            return False
        with self._lock:
            self._graph = graph
            self._coordinator = None  # made again on the next request, with drafts
        log.info(
            "draft tier answers: graph %s (version %d, order %d); drafting",
            graph.graph_path,
            graph.graph_version,
            graph.max_order,
        )
        return True

    def check_backends(self, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
        """Check the backends now: None when the gateway can serve, else why it cannot (the
        verifier does not answer SERVING, or the tokenizers disagree). While the verifier does
        not answer, new generations are refused at once."""
        status = self.verifier.health(timeout_s)
        if status != "SERVING":
            with self._lock:
                was_up, self._verifier_down = self._verifier_down is None, status
            if was_up:
                log.warning(
                    "the verifier at %s does not answer (%s)", self.verifier.address, status
                )
                self._forget_backends()
            return f"the verifier at {self.verifier.address} does not answer ({status})"
        with self._lock:
            was_down, self._verifier_down = self._verifier_down is not None, None
        if was_down:
            log.info("the verifier at %s answers again", self.verifier.address)
        self.find_draft_tier(timeout_s)
        try:
            self.coordinator()
        except SpeculantError as exc:
            return str(exc)
        return None

    def _to_request(
        self, request: gateway_pb2.GenerateRequest, coordinator: Coordinator
    ) -> GenerationRequest:
        defaults = self.generation_defaults
        max_tokens = request.max_tokens if request.HasField("max_tokens") else defaults.max_tokens
        if max_tokens > MAX_TOKENS_LIMIT:
            raise InvalidArgumentError("max_tokens", f"must be <= {MAX_TOKENS_LIMIT}")
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        if request.prompt_token_ids:
            prompt_ids = token_id_prompt(
                request.prompt_token_ids, request.prompt, messages, coordinator.vocab_size
            )
        else:
            check_prompt_chars(
                request.prompt, messages, self._prompt_chars_limit, coordinator.max_context_length
            )
            prompt_ids = encode_prompt(coordinator.tokenizer, request.prompt, messages or None)
        sampling = sampling_controls_from_pb(request.sampling)
        return GenerationRequest(
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            temperature=(
                request.temperature if request.HasField("temperature") else defaults.temperature
            ),
            seed=request.seed if request.HasField("seed") else defaults.seed,
            stop=tuple(request.stop) or tuple(defaults.stop),
            draft=draft_options_from_pb(request.draft, self.draft_defaults),
            sampling=SamplingControls(  # the request's controls over the gateway's defaults
                **SamplingControls.from_config(defaults).set_fields() | sampling.set_fields()
            ),
            top_logprobs=(
                optional_top_logprobs(request)
                if request.HasField("top_logprobs")
                else defaults.top_logprobs
            ),
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
    next_round_drafts: int = DEFAULT_NEXT_ROUND_DRAFTS,
    draft_defaults: DraftConfig | None = None,
    auth_token: str | None = None,
    tls: ServerTls | None = None,
    backend_tls: ClientTls | None = None,
    metrics: Metrics | None = None,
    learn: bool = True,
    verify_cost: str = "measured",
) -> tuple[ServiceServer, GatewayServicer]:
    """Start a gateway server; with check_backends, fail fast on a tokenizer mismatch.
    draft_defaults: for requests that leave a drafting field unset (default: DraftConfig()).
    auth_token: clients must send ``authorization: Bearer <auth_token>`` (speculant.auth).
    tls: serve TLS; backend_tls: reach the draft and verifier services over TLS.
    verifier_timeout_s: the most a verifier call or Session step may wait for its answer.
    metrics: count calls and generations in it (its /metrics endpoint is the caller's).
    learn: report every finished generation to the draft tier (gateway.learning).
    verify_cost: the cost profile that sizes drafts (GatewayServicer's)."""
    drafter = GrpcDraftClient(
        draft_addresses, timeout_s=draft_timeout_s, tls=backend_tls, refresh_s=draft_refresh_s
    )
    servicer = GatewayServicer(
        drafter,
        GrpcVerifierClient(verifier_address, timeout_s=verifier_timeout_s, tls=backend_tls),
        tokenizer_name=tokenizer_name,
        draft_defaults=draft_defaults,
        max_concurrent=max_concurrent,
        next_round_drafts=next_round_drafts,
        metrics=None if metrics is None else GatewayMetrics(metrics.registry),
        learner=LearnReporter(drafter) if learn else None,
        verify_cost=verify_cost,
    )
    if check_backends:
        servicer.find_draft_tier()
        try:
            servicer.coordinator()
        except FailedPreconditionError:
            raise
        except Exception as exc:  # a backend not up yet: the watcher checks again
            log.warning("backends not ready yet (%s); checking every %g s", exc, WATCH_INTERVAL_S)
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
    watch_backends(servicer, server)
    return server, servicer


def watch_backends(
    servicer: GatewayServicer, server: ServiceServer, interval_s: float = WATCH_INTERVAL_S
) -> threading.Thread:
    """Report the gateway's health from its backends now, then every interval_s until the
    server stops (see GatewayServicer.check_backends); returns the watcher thread."""

    def report() -> None:
        problem = servicer.check_backends()
        servicer.problem = problem
        server.set_serving(problem is None)

    def run() -> None:
        while not server.stopping.wait(interval_s):
            try:
                report()
            except Exception:  # never let the watcher die
                log.exception("backend check failed")
        servicer.drafter.close()

    report()
    thread = threading.Thread(target=run, name="backend-watch", daemon=True)
    thread.start()
    return thread
