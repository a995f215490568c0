"""The library's request and result types of one generation: what to generate (a tokenized
prompt, limits, sampling and drafting parameters), what streams back, and what it ends with."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.stats import GenerationStats
from gateway.stopping import FinishReason
from speculant.errors import InvalidArgumentError
from speculant.types import DraftParams, SamplingControls, TokenLogprobs, check_top_logprobs

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000  # per stop string


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
