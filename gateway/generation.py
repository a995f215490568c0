"""The library's request and result types of one generation: what a client asks for
(:class:`PromptRequest`, before tokenizing and defaults), what to generate (a tokenized
:class:`GenerationRequest`: limits, sampling and drafting parameters), what streams back, and
what it ends with."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.rounds.stats import GenerationStats
from gateway.rounds.stopping import FinishReason
from speculant.draft_params import DraftParams
from speculant.errors import InvalidArgumentError
from speculant.sampling_controls import SamplingControls, check_top_logprobs
from speculant.types import TokenLogprobs

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000  # per stop string


@dataclass(frozen=True)
class PromptRequest:
    """A generation as a client asks for it, whatever the door (gRPC, HTTP, the library):
    the prompt untokenized, and None (or empty) wherever the serving defaults apply
    (:meth:`gateway.request_defaults.RequestDefaults.prepare` fills them and validates).

    Exactly one of ``prompt``, ``messages`` (chat messages, ``{"role", "content"}``, rendered
    with the tokenizer's chat template) and ``prompt_token_ids`` is given. ``draft``: the
    drafting fields the request sets (:class:`DraftParams` names; ``strategy`` a name, e.g.
    "greedy"); ``sampling``: the controls it sets (unset fields None).
    """

    prompt: str = ""
    messages: tuple[Mapping[str, str], ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    draft: Mapping[str, object] = field(default_factory=dict)
    sampling: SamplingControls = field(default_factory=SamplingControls)
    top_logprobs: int | None = None


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
