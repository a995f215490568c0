"""The gateway's engine: generations over a draft tier and a verifier, whatever the door.

:class:`GenerationEngine` owns what every front door shares: the slots of ``max_concurrent``
generations, the backends' health, finding the draft tier, the tokenizers' agreement and the
request defaults. Its :meth:`~GenerationEngine.generate` takes a transport-free
:class:`~gateway.generation.PromptRequest` and yields StreamChunks, then one GenerationResult.
The doors are thin: the gRPC servicer (gateway.api.server) and the HTTP app (gateway.api.app)
each turn their wire format into a PromptRequest and the engine's typed errors
(speculant.errors) into their status codes.

At start-up (and again whenever the check has not yet succeeded, e.g. a backend was down) the
engine compares the graph's tokenizer fingerprint with the verifier's and refuses to generate
on a mismatch (FAILED_PRECONDITION naming both tokenizers).

Drafts are an optimisation: while no draft replica answers (the draft tier is down at the
gateway's start, say), the engine serves verifier-only (empty drafts: exactly the target's
output, one token per forward) and asks the draft tier for its graph again at each backend
check; once one answers and its tokenizer is the verifier's, requests draft again. Both switches
are logged. While the verifier does not answer its health check, new generations are refused
at once (UNAVAILABLE).

**Request defaults**: the engine is the one place that turns what a client asks for into what
the coordinator runs. :meth:`RequestDefaults.prepare` fills every field a :class:`PromptRequest`
leaves unset from the serving defaults (a :class:`DraftConfig` and a :class:`GenerationConfig`:
the gateway's flags and ``SPECULANT_*`` variables, or the embedded decoder's configs) and
tokenizes the prompt: chat messages (and a request's tools) are rendered with the serving chat
template (the gateway's ``--chat-template FILE``) when there is one, else with the tokenizer's.
The resulting :class:`GenerationRequest` is validated by the coordinator as its rounds begin, so
every door (gRPC, HTTP, the embedded library) refuses the same requests with the same errors.

A prompt too long for the model's context is refused before tokenizing it. Tokenizing costs
time and memory in proportion to the text (a 15 MB prompt: 16 s and 2 GB), so the gateway first
compares the prompt's length in characters with a bound that no prompt which
fits the context can reach: a token stands for at most *max token chars* characters (its
vocabulary entry's length, added tokens included: a byte-level or byte-fallback entry is at
least as long as the text it decodes to), so a prompt of n tokens has at most
n * max_token_chars characters. The bound allows SLACK times that, for normalizers that fold
characters before tokenizing; a prompt under it is tokenized and checked exactly, token by token.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import Any

import grpc

from gateway.generation import GenerationRequest, GenerationResult, PromptRequest, StreamChunk
from gateway.interfaces import (
    DraftTierGraph,
    RemoteDraftTier,
    RemoteVerifier,
    TierLearner,
)
from gateway.metrics import GatewayMetrics
from gateway.rounds.coordinator import Coordinator
from speculant.config import (
    MAX_DRAFT_CONTEXT,
    DraftConfig,
    DraftParams,
    GenerationConfig,
    SamplingControls,
)
from speculant.cost_profile import CostProfile, verify_cost_profile
from speculant.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    RemoteError,
    ResourceExhaustedError,
    SpeculantError,
    UnavailableError,
)
from speculant.graph_catalog import NO_GRAPH, check_graph_name
from speculant.prompting import encode_prompt, rendered_with_tools, token_id_prompt
from speculant.request_context import request_deadline
from speculant.tokenizer import TokenizerLoadError, load_tokenizer, tokenizer_fingerprint
from speculant.types import DraftProposal, DraftTarget

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0  # deadline of the backend checks


MAX_TOKENS_LIMIT = 1 << 20
SLACK = 4  # the prompt-character bound's allowance for normalizers (see the module)
DRAFT_FIELDS = frozenset(f.name for f in fields(DraftParams))


@dataclass(frozen=True)
class PromptLimits:
    """What the tokenizer and the model allow: ``chars`` bounds a prompt's characters before
    tokenizing (0: no bound; see :func:`check_prompt_chars`)."""

    vocab_size: int
    max_context_length: int
    chars: int = 0


@dataclass(frozen=True)
class RequestDefaults:
    """The values a request gets for the fields it leaves unset."""

    draft: DraftConfig = field(default_factory=DraftConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    chat_template: str | None = None  # renders every chat request (None: the tokenizer's)

    def prepare(
        self, request: PromptRequest, tokenizer: object, limits: PromptLimits
    ) -> GenerationRequest:
        """The tokenized request with every unset field filled (InvalidArgumentError naming
        the first field that cannot be)."""
        defaults = self.generation
        max_tokens = defaults.max_tokens if request.max_tokens is None else request.max_tokens
        if max_tokens > MAX_TOKENS_LIMIT:
            raise InvalidArgumentError("max_tokens", f"must be <= {MAX_TOKENS_LIMIT}")
        return GenerationRequest(
            prompt_ids=self._prompt_ids(request, tokenizer, limits),
            max_tokens=max_tokens,
            temperature=defaults.temperature
            if request.temperature is None
            else request.temperature,
            seed=defaults.seed if request.seed is None else request.seed,
            stop=request.stop or tuple(defaults.stop),
            draft=self.draft_params(request.draft),
            sampling=SamplingControls(  # the request's controls over the defaults
                **SamplingControls.of_settings(defaults).set_fields()
                | request.sampling.set_fields()
            ),
            top_logprobs=(
                defaults.top_logprobs if request.top_logprobs is None else request.top_logprobs
            ),
            constraint=request.constraint,
        )

    def draft_params(self, given: Mapping[str, object]) -> DraftParams:
        """The request's drafting fields over the defaults. Mixing parameters set neither in
        the request nor in the defaults stay unset (None): the drafter then uses its graph's
        tuned defaults."""
        for name in given:
            if name not in DRAFT_FIELDS:
                raise InvalidArgumentError(f"draft.{name}", "unrecognized drafting field")
        values = asdict(DraftParams.from_config(self.draft)) | given
        values["strategy"] = given.get("strategy") or self.draft.strategy
        return DraftParams(**values)

    def _prompt_ids(
        self, request: PromptRequest, tokenizer: object, limits: PromptLimits
    ) -> list[int]:
        messages = [dict(m) for m in request.messages]
        if request.prompt_token_ids:
            return token_id_prompt(
                request.prompt_token_ids, request.prompt, messages, limits.vocab_size
            )
        tools = [dict(t) for t in request.tools] if messages else []
        if limits.chars:
            check_prompt_chars(
                request.prompt, messages, limits.chars, limits.max_context_length, tools
            )
        ids = encode_prompt(
            tokenizer,  # type: ignore[arg-type]
            request.prompt,
            messages or None,
            tools=tools or None,
            chat_template=self.chat_template,
        )
        if request.tools_must_show and not rendered_with_tools(
            tokenizer,  # type: ignore[arg-type]
            messages,
            tools,
            self.chat_template,
        ):
            raise InvalidArgumentError(
                "tool_choice",
                "'auto' needs a chat template that shows the model its tools, and this one "
                "does not: serve with --chat-template FILE (e.g. "
                "deploy/chat-templates/chatml-tools.jinja), or ask for 'required' or a named "
                "function",
            )
        return ids


def max_token_chars(tokenizer: object) -> int:
    """The most characters one token of the tokenizer stands for (at least 1)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))  # type: ignore[attr-defined]
    return max((len(t) for t in tokens if isinstance(t, str)), default=1) or 1


def check_prompt_chars(
    prompt: str,
    messages: Sequence[Mapping[str, Any]],
    limit: int,
    max_context_tokens: int,
    tools: Sequence[Mapping[str, Any]] = (),
) -> None:
    """OUT_OF_RANGE, before any tokenizing, when the prompt (or the messages' contents, their
    tool calls and the tools, which the chat template renders) has more than `limit`
    characters."""
    chars = len(prompt) + sum(_message_chars(m) for m in messages)
    chars += sum(len(json.dumps(t)) for t in tools)
    if chars > limit:
        name = "messages" if messages else "prompt"
        raise OutOfRangeError(
            f"{name}: {chars} characters cannot fit the model's context of "
            f"{max_context_tokens} tokens (at most {limit} characters with this tokenizer)"
        )


def _message_chars(message: Mapping[str, Any]) -> int:
    content = message.get("content")
    chars = len(content) if isinstance(content, str) else 0
    calls = message.get("tool_calls")
    return chars + (len(json.dumps(calls)) if calls else 0)


def check_tokenizer_alignment(
    graph_tokenizer: str, graph_fingerprint: str, model_tokenizer: str, model_fingerprint: str
) -> None:
    """Raise FailedPreconditionError naming both tokenizers unless their fingerprints match: a
    graph drafts token ids, so it must share the verifier's tokenizer."""
    if graph_fingerprint != model_fingerprint:
        raise FailedPreconditionError(
            "tokenizer mismatch: the graph was built with tokenizer "
            f"{graph_tokenizer!r} ({graph_fingerprint[:19]}...) but the verifier's model uses "
            f"{model_tokenizer!r} ({model_fingerprint[:19]}...); rebuild the graph with "
            f"`speculant build --tokenizer {model_tokenizer} ...`"
        )


class NoDrafts:
    """The drafter while no draft replica answers: every draft is empty (the verifier then
    emits one token per round, the target model's own)."""

    def propose(self, context_ids: Sequence[int], params: DraftParams, seed=None) -> DraftProposal:
        return DraftProposal()

    def close(self) -> None:
        pass


class GenerationEngine:
    """Validate, tokenize and run generations over remote backends, at most max_concurrent
    at once."""

    def __init__(
        self,
        drafter: RemoteDraftTier,
        verifier: RemoteVerifier,
        *,
        tokenizer_name: str | None = None,
        draft_defaults: DraftConfig | None = None,
        generation_defaults: GenerationConfig | None = None,
        max_concurrent: int = 64,
        metrics: GatewayMetrics | None = None,
        learner: TierLearner | None = None,
        verify_cost: str | CostProfile = "measured",
        tokenizer: object | None = None,
        log_generations: bool = True,
        chat_template: str | None = None,
    ) -> None:
        """tokenizer_name: the prompts' tokenizer (default: the verifier's, by its name).
        draft_defaults, generation_defaults: for the fields a request leaves unset.
        max_concurrent: generations in flight at once; more get RESOURCE_EXHAUSTED.
        metrics: count generations in it.
        learner: gets every finished generation with its graph and tenant
        (gateway.backends.LearnReporter; None: the draft tier learns nothing from
        this gateway). verify_cost: the cost profile
        that sizes drafts, "measured" (the verifier's, as GetModelInfo reports it), "flat", a cost
        profile file (see speculant.cost_profile.verify_cost_profile) or the profile itself.
        tokenizer: the verifier's own tokenizer, already loaded (in process; not checked again).
        log_generations: log one line per finished generation (a server's access log).
        chat_template: the chat template (Jinja text) every chat request is rendered with
        (None: the tokenizer's; see RequestDefaults)."""
        self.drafter = drafter
        self.verifier = verifier
        self.tokenizer_name = tokenizer_name
        self.defaults = RequestDefaults(
            draft_defaults or DraftConfig(),
            generation_defaults or GenerationConfig(),
            chat_template,
        )
        self.max_concurrent = max_concurrent
        self.metrics = metrics
        self.learner = learner
        self.verify_cost = verify_cost
        self.log_generations = log_generations
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._coordinator: Coordinator | None = None
        self._lock = threading.Lock()
        # The draft tier's default graph, once a replica has answered (None: serving
        # verifier-only), and the names of every graph it serves (refreshed at each check).
        self._graph: DraftTierGraph | None = None
        self._graph_names: frozenset[str] = frozenset()
        self._draft_tier_missing_logged = False
        # Why the verifier's last health check failed (None: it answered SERVING).
        self._verifier_down: str | None = None
        # Why the engine cannot serve, from the last backend check (None: it can).
        self.problem: str | None = None
        # (name, fingerprint, tokenizer, the most characters a token stands for)
        self._tokenizer: tuple[str, str, object, int] | None = None
        self._given_tokenizer = tokenizer

    # -- generations ---------------------------------------------------------------------

    def generate(
        self,
        request: PromptRequest,
        *,
        time_remaining_s: float | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[StreamChunk | GenerationResult]:
        """Run one request: StreamChunks as tokens are accepted, then one GenerationResult.

        It takes a slot of max_concurrent, fills the request's defaults, tokenizes and
        validates it (errors are raised before the first item) and drives the coordinator.
        time_remaining_s: the request's deadline; cancelled: polled between rounds. Closing the
        iterator early releases the verifier session and the slot.
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
                prepared = self.defaults.prepare(request, coordinator.tokenizer, self._limits())
                target = DraftTarget(self._served_graph(request.graph), request.tenant)
                drafter = self.drafter.bind(target) if self._graph is not None else NoDrafts()
                learn = None if self.learner is None else partial(self.learner.learn, target=target)
                try:
                    for item in coordinator.stream(
                        prepared,
                        cancelled=cancelled,
                        drafter=drafter,
                        learn=learn,
                        graph=self._sizing_key(target.graph),
                    ):
                        if isinstance(item, GenerationResult):
                            self._finished(item)
                        yield item
                finally:
                    drafter.close()
        except RemoteError as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE:
                self._forget_backends()
            raise
        finally:
            self._slots.release()
            if self.metrics is not None:
                self.metrics.in_flight.dec()

    def _served_graph(self, name: str) -> str:
        """The request's graph name, checked: "" (the default) and NO_GRAPH as they are, another
        name once the draft tier serves it (NotFoundError naming it and the graphs served;
        while no draft replica answers, any valid name: the request is served verifier-only)."""
        if not name or name == NO_GRAPH:
            return name
        check_graph_name(name)
        if name in self._graph_names or self._graph is None:
            return name
        try:  # added since the last check, through another gateway?
            self.drafter.graph_info(HEALTH_TIMEOUT_S, name)
        except UnavailableError:
            return name  # drafts are an optimisation: the round goes on without them
        self.refresh_graphs()
        return name

    def _sizing_key(self, name: str) -> str:
        """The graph whose requests size drafts together: "" for the default graph."""
        graph = self._graph
        return "" if graph is None or name == graph.name else name

    def refresh_graphs(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        """Ask the draft tier which graphs it serves now (kept when it does not answer)."""
        if self._graph is None:
            return
        try:
            graph = self.drafter.graph_info(timeout_s)
        except (UnavailableError, NotFoundError) as exc:
            log.debug("graph list not refreshed: %s", exc)
            return
        names = frozenset(graph.graph_names) or frozenset([graph.name])
        if names != self._graph_names:
            log.info("the draft tier serves graphs: %s", ", ".join(graph.graph_names))
        with self._lock:
            self._graph_names = names
            if self._coordinator is not None:
                self._coordinator.draft_context_window = _context_window(graph, names)

    def graph_names(self) -> list[str]:
        """The graphs the draft tier serves (as of the last check), default first ([] while no
        draft replica has answered)."""
        graph = self._graph
        if graph is None:
            return []
        default = graph.name
        return sorted(self._graph_names, key=lambda n: (n != default, n))

    def _limits(self) -> PromptLimits:
        info = self.verifier.info
        assert self._tokenizer is not None  # loaded with the coordinator
        chars = SLACK * info.max_context_length * self._tokenizer[3]
        return PromptLimits(info.vocab_size, info.max_context_length, chars)

    def _finished(self, result: GenerationResult) -> None:
        """Log (one line per generation) and count a finished generation."""
        stats = result.stats
        if self.log_generations:
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

    # -- backends ------------------------------------------------------------------------

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
        log.info(
            "backends ready: model %s, %s (tokenizer %s)",
            info.model_name,
            "verifier-only: no draft replica answers yet"
            if graph is None
            else f"graph of order {graph.max_order}",
            info.tokenizer_name,
        )
        learn = None if self.learner is None else partial(self.learner.learn, target=DraftTarget())
        return Coordinator(
            # the default graph's; each request of generate() drafts with its own target's
            self.drafter if graph is not None else NoDrafts(),
            self.verifier,
            tokenizer,
            draft_context_window=(
                _context_window(graph, self._graph_names) if graph is not None else 1
            ),
            learn=learn,
            verify_cost=(
                self.verify_cost
                if isinstance(self.verify_cost, CostProfile)
                else verify_cost_profile(self.verify_cost, info)
            ),
        )

    def _load_tokenizer(self, verifier_tokenizer: str, fingerprint: str) -> object:
        """The prompts' tokenizer (loaded once per verifier tokenizer), checked against the
        verifier's fingerprint."""
        name = self.tokenizer_name or verifier_tokenizer
        if self._tokenizer is not None and self._tokenizer[:2] == (name, fingerprint):
            return self._tokenizer[2]
        try:
            tokenizer = self._given_tokenizer or load_tokenizer(name)
        except TokenizerLoadError as exc:
            if self.tokenizer_name:
                raise
            # the verifier's tokenizer, named as it loaded there (another host or directory)
            raise TokenizerLoadError(
                f"{exc}; give the gateway the verifier's tokenizer with --tokenizer NAME_OR_DIR"
            ) from exc
        given = tokenizer is self._given_tokenizer  # the verifier's own: nothing to check
        if not given and tokenizer_fingerprint(tokenizer) != fingerprint:
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
            self._graph_names = frozenset(graph.graph_names) or frozenset([graph.name])
            self._coordinator = None  # made again on the next request, with drafts
        log.info(
            "draft tier answers: default graph %s (version %d, order %d), graphs %s; drafting",
            graph.graph_path,
            graph.graph_version,
            graph.max_order,
            ", ".join(graph.graph_names) or graph.name or "one",
        )
        return True

    def check_backends(self, timeout_s: float = HEALTH_TIMEOUT_S) -> str | None:
        """Check the backends now: None when the engine can serve, else why it cannot (the
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
        if self._graph is not None:
            self.refresh_graphs(timeout_s)
        self.find_draft_tier(timeout_s)
        try:
            self.coordinator()
        except SpeculantError as exc:
            return str(exc)
        return None

    def _forget_backends(self) -> None:
        """The verifier went away: check the tokenizers again when it is back (it may have
        been restarted with another model)."""
        with self._lock:
            self._coordinator = None
            self.verifier.forget_info()


def _context_window(graph: DraftTierGraph, names: frozenset[str]) -> int:
    """The context tokens to send the draft tier: what its default graph reads, or, when it
    serves several graphs (whose windows differ), the longest any graph can read."""
    if len(names) > 1:
        return MAX_DRAFT_CONTEXT
    return max(graph.context_window, graph.max_order)
