"""The library's request and result types of one generation: what a client asks for
(:class:`PromptRequest`, before tokenizing and defaults), what to generate (a tokenized
:class:`GenerationRequest`: limits, sampling and drafting parameters), what streams back, and
what it ends with (:class:`FinishReason`, :class:`GenerationStats`).

A *round* is one verifier forward pass: the prefill, then one Verify per draft. tau (tokens per
round) = generated tokens / rounds is the figure peers report as tokens per target forward.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from speculant.config import DraftParams, SamplingControls, SessionOptions, check_top_logprobs
from speculant.constraint import Constraint
from speculant.errors import InvalidArgumentError
from speculant.types import TokenLogprobs

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000  # per stop string
# Every part of a round, in the order a round runs them; "round" is their sum.
PARTS = ("draft", "draft_hop", "sizer", "forward", "verify_hop", "gateway")
FIELDS = ("round", *PARTS)


class FinishReason(StrEnum):
    """Why generation ended (mirrors speculant.v1.FinishReason)."""

    EOS = "eos"  # the model emitted an end-of-sequence token (not returned)
    MAX_TOKENS = "max_tokens"
    STOP = "stop"  # a stop string was generated (not returned)
    CONTEXT_LENGTH = "context_length"  # the model's context window is full


@dataclass(frozen=True)
class PromptRequest:
    """A generation as a client asks for it, whatever the door (gRPC, HTTP, the library):
    the prompt untokenized, and None (or empty) wherever the serving defaults apply
    (:meth:`gateway.engine.RequestDefaults.prepare` fills them and validates).

    Exactly one of ``prompt``, ``messages`` (chat messages, ``{"role", "content"}`` and, as
    Hugging Face's chat templates take them, an assistant's ``tool_calls`` or a tool's
    ``tool_call_id``; rendered with the chat template) and ``prompt_token_ids`` is given.
    ``tools``: OpenAI's function tools, passed to the chat template (which may show them to the
    model); ``tools_must_show``: refuse the request (naming ``tool_choice``) unless it does.
    ``draft``: the drafting fields the request sets (:class:`DraftParams` names; ``strategy`` a
    name, e.g. "greedy"); ``sampling``: the controls it sets (unset fields None). ``graph``
    names the graph of the draft tier's catalog it drafts from, ``tenant`` whose learned layer
    of it (:mod:`speculant.graph_catalog`).
    """

    prompt: str = ""
    messages: tuple[Mapping[str, Any], ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    draft: Mapping[str, object] = field(default_factory=dict)
    sampling: SamplingControls = field(default_factory=SamplingControls)
    top_logprobs: int | None = None
    constraint: Constraint | None = None  # what the output must match (speculant.grammar)
    tools: tuple[Mapping[str, Any], ...] = ()
    tools_must_show: bool = False
    graph: str = ""  # the graph to draft from ("": the default; "none": no graph)
    tenant: str = ""  # who asks (the name of the client's token; "": the default tenant)


@dataclass(frozen=True)
class GenerationRequest:
    """A tokenized request: what to generate and how to draft."""

    prompt_ids: list[int]
    max_tokens: int = 100
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    draft: DraftParams = field(default_factory=DraftParams)
    # top_k, top_p, min_p and the penalties (see SamplingControls; unset: the model's defaults)
    sampling: SamplingControls = field(default_factory=SamplingControls)
    top_logprobs: int | None = None  # report logprobs with this many alternatives; None: none
    constraint: Constraint | None = None  # what the output must match (speculant.grammar)

    @property
    def session_options(self) -> SessionOptions:
        """What the verifier session samples with (see SessionOptions)."""
        return SessionOptions(
            self.temperature, self.sampling, self.seed, self.top_logprobs, self.constraint
        )

    def validate(self) -> GenerationRequest:
        """Raise InvalidArgumentError naming the first bad field."""
        if not self.prompt_ids:
            raise InvalidArgumentError("prompt", "must not be empty")
        if self.max_tokens < 0:
            raise InvalidArgumentError("max_tokens", f"must be >= 0, got {self.max_tokens}")
        if not (self.temperature >= 0 and self.temperature < float("inf")):
            raise InvalidArgumentError(
                "temperature", f"must be a finite number >= 0, got {self.temperature}"
            )
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise InvalidArgumentError("seed", f"must be in 0..2^64-1, got {self.seed}")
        if len(self.stop) > MAX_STOP_STRINGS or any(
            not 0 < len(s) <= MAX_STOP_CHARS for s in self.stop
        ):
            raise InvalidArgumentError(
                "stop",
                f"at most {MAX_STOP_STRINGS} stop strings, none of them empty or longer than "
                f"{MAX_STOP_CHARS} characters",
            )
        self.sampling.validate()
        check_top_logprobs(self.top_logprobs)
        if self.constraint is not None:
            self.constraint.validate()
        try:
            self.draft.validate()
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"draft.{exc.field}", exc.problem) from exc
        return self


@dataclass
class StreamChunk:
    """Tokens accepted since the last chunk and their text (never a split character)."""

    token_ids: list[int]
    text_delta: str
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked


class RoundTimes:
    """Where each round's time goes: every Verify round's parts of one generation, one array of
    seconds per field (FIELDS; GenerationStats.round_times in gateway.proto), as the
    coordinator's RoundClock (gateway.rounds.coordinator) times them.

    The parts of a round (seconds; they add up to the round's wall time, ``round``):

    - ``draft``: the drafter's own work (DraftProposal.seconds: the draft service's
      ``ProposeResponse.draft_seconds``, or the in-process drafter's);
    - ``draft_hop``: the rest of the time the round waited for its draft calls: over the
      services the gRPC hop to the draft service (serialization, transport, the service's
      handling), embedded the in-process call;
    - ``sizer``: the cost-aware sizing (gateway.rounds.draft_sizing): plan, cut and observe;
    - ``forward``: the verifier's forward pass and sampling (VerifyResult.seconds:
      ``VerifyResponse.forward_seconds`` over the services);
    - ``verify_hop``: the rest of the Verify call: the gRPC hop to the verifier service, or the
      in-process call;
    - ``gateway``: everything else: the coordinator's own work (planning, the constraint's
      drafts, taking the tokens into the output and detokenizing them, bookkeeping).

    The prefill (a generation's first round) is not among them. Timing a round costs a few
    ``time.perf_counter`` calls and seven floats."""

    def __init__(self) -> None:
        self.seconds: dict[str, array] = {name: array("d") for name in FIELDS}

    def __len__(self) -> int:
        return len(self.seconds["round"])

    def add(self, parts: tuple[float, ...]) -> None:
        """One round's figures, as RoundClock.parts gives them."""
        for name, value in zip(FIELDS, parts, strict=True):
            self.seconds[name].append(value)

    def as_dict(self) -> dict[str, list[float]]:
        """{field: [seconds of each round]} (GenerationStats.round_times in gateway.proto)."""
        return {name: values.tolist() for name, values in self.seconds.items()}


@dataclass
class GenerationStats:
    """Counters and timings of one generation (mirrors speculant.v1.GenerationStats)."""

    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    total_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    draft_failures: int = 0
    accepted_from_graph: int = 0  # accepted drafts by source (DraftProposal.sources)
    accepted_from_overlay: int = 0
    accepted_from_both: int = 0
    accepted_from_grammar: int = 0  # drafts the constraint forced (gateway.rounds.constrained)
    unverified_draft_tokens: int = 0  # drafted, then cut by the sizer (gateway.rounds.draft_sizing)
    rounds_without_draft: int = 0  # Verify rounds with no draft token (plain decoding steps)
    # each Verify round's seconds by part (RoundTimes)
    round_times: RoundTimes = field(default_factory=RoundTimes)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def wasted_draft_tokens(self) -> int:
        """Draft tokens the verifier checked and rejected (drafted - accepted)."""
        return self.draft_tokens - self.accepted_tokens

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.generated_tokens / self.rounds if self.rounds else 0.0

    @property
    def other_seconds(self) -> float:
        return max(0.0, self.total_seconds - self.draft_seconds - self.verify_seconds)

    def record_round(
        self,
        drafted: int,
        accepted: int,
        sources: list[str] | tuple[str, ...] = (),
        positions: int | None = None,
    ) -> None:
        """Count one Verify round: `drafted` draft tokens spanning `positions` draft positions
        (default: drafted, a chain; a tree's depth), of which `accepted` were kept (a prefix or
        a path); sources: those of the accepted drafts, in order (possibly empty)."""
        for source in sources[:accepted]:
            if source == "overlay":
                self.accepted_from_overlay += 1
            elif source == "grammar":
                self.accepted_from_grammar += 1
            elif source == "both":
                self.accepted_from_both += 1
            else:
                self.accepted_from_graph += 1
        self.rounds += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        positions = drafted if positions is None else positions
        grow = positions - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for position in range(positions):
            self.drafted_by_position[position] += 1
        for position in range(accepted):
            self.accepted_by_position[position] += 1

    def as_dict(self, round_times: bool = False) -> dict[str, object]:
        """All figures, derived ones included (for --json output and the bench); round_times:
        with each round's seconds by part too (a list a part: kept out of the HTTP answers)."""
        figures: dict[str, object] = {
            "rounds": self.rounds,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "accepted_by_position": list(self.accepted_by_position),
            "drafted_by_position": list(self.drafted_by_position),
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_round": self.tokens_per_round,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "total_seconds": self.total_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "other_seconds": self.other_seconds,
            "draft_failures": self.draft_failures,
            "accepted_from_graph": self.accepted_from_graph,
            "accepted_from_overlay": self.accepted_from_overlay,
            "accepted_from_both": self.accepted_from_both,
            "accepted_from_grammar": self.accepted_from_grammar,
            "wasted_draft_tokens": self.wasted_draft_tokens,
            "unverified_draft_tokens": self.unverified_draft_tokens,
            "rounds_without_draft": self.rounds_without_draft,
        }
        if round_times:
            figures["round_times"] = self.round_times.as_dict()
        return figures


@dataclass
class GenerationResult:
    """The whole output of one request."""

    text: str
    token_ids: list[int]  # generated tokens only: no prompt, no final EOS
    finish_reason: FinishReason
    stats: GenerationStats
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked

    @property
    def acceptance_rate(self) -> float:
        return self.stats.acceptance_rate
