"""How the target's logits become p, beside the temperature: the request's sampling controls
(:class:`SamplingControls`), their bounds, the bound on the logprob alternatives a request may
ask for (:func:`check_top_logprobs`), and all a verifier session is started with beside its prompt
(:class:`SessionOptions`). Terms (p) are defined in :mod:`speculant.types`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from speculant.constraint import Constraint
from speculant.errors import InvalidArgumentError

MAX_TOP_LOGPROBS = 20  # most alternatives a request may ask for with each token's logprob
MAX_ABS_OPENAI_PENALTY = 2.0  # presence_penalty and frequency_penalty are in [-2, 2]
# repetition_penalty's range: a logit divided by a tinier one could overflow float32
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0

# The sampling controls, and the value of each that turns it off.
SAMPLING_CONTROLS_OFF: dict[str, float] = {
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}


@dataclass(frozen=True)
class SamplingControls:
    """How p is made from the target's logits at each position, beside the temperature.

    Applied in Hugging Face ``generate``'s order: ``repetition_penalty`` (HF's: a logit l of a
    token that occurred becomes l / penalty if l > 0 else l * penalty; in [0.01, 100], 1 =
    off), then OpenAI's ``presence_penalty`` / ``frequency_penalty`` (l -= presence * [count > 0] +
    frequency * count; in [-2, 2], 0 = off), then the temperature, ``top_k`` (keep the k most
    likely; 0 = off), ``top_p`` (keep the smallest most-likely set with mass >= top_p; in (0,
    1], 1 = off) and ``min_p`` (drop tokens below min_p * the largest probability; in [0, 1],
    0 = off). Occurrences count the prompt and every token before the position.
    Temperature 0 (greedy) takes the argmax of the penalised logits.

    None: the model's own default (its generation_config.json) where it sets one, else off
    (see :meth:`resolved`).
    """

    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @classmethod
    def of_settings(cls, settings: object) -> SamplingControls:
        """The controls that settings with these field names set, the others unset (a
        speculant.config.GenerationConfig, whose sampling fields are declared by this class)."""
        return cls(**{name: getattr(settings, name) for name in SAMPLING_CONTROLS_OFF})

    def resolved(self, model_defaults: Mapping[str, float] | None = None) -> SamplingControls:
        """Every field set: the request's value, else the model's default, else off."""
        model_defaults = model_defaults or {}
        return SamplingControls(
            **{
                name: value
                if (value := getattr(self, name)) is not None
                else model_defaults.get(name, off)
                for name, off in SAMPLING_CONTROLS_OFF.items()
            }
        )

    @property
    def penalises(self) -> bool:
        """Whether a penalty is on (p then depends on the tokens before each position)."""
        return (
            self.repetition_penalty not in (None, 1.0)
            or self.presence_penalty not in (None, 0.0)
            or self.frequency_penalty not in (None, 0.0)
        )

    @property
    def is_off(self) -> bool:
        """Whether every control is unset or off (p is then softmax(logits / temperature))."""
        return all(
            getattr(self, name) in (None, off) for name, off in SAMPLING_CONTROLS_OFF.items()
        )

    def set_fields(self) -> dict[str, float]:
        """The fields that are set (not None), by name."""
        return {
            name: value
            for name in SAMPLING_CONTROLS_OFF
            if (value := getattr(self, name)) is not None
        }

    def validate(self) -> SamplingControls:
        """Raise InvalidArgumentError naming the first bad field; return self when valid."""
        checks = (
            ("top_k", lambda v: v >= 0, "an integer >= 0 (0 = off)"),
            ("top_p", lambda v: 0 < v <= 1, "a number in (0, 1] (1 = off)"),
            ("min_p", lambda v: 0 <= v <= 1, "a number in [0, 1] (0 = off)"),
            (
                "repetition_penalty",
                lambda v: MIN_REPETITION_PENALTY <= v <= MAX_REPETITION_PENALTY,
                f"a number in [{MIN_REPETITION_PENALTY:g}, {MAX_REPETITION_PENALTY:g}] (1 = off)",
            ),
            *(
                (
                    name,
                    lambda v: abs(v) <= MAX_ABS_OPENAI_PENALTY,
                    f"a number in [-{MAX_ABS_OPENAI_PENALTY:g}, {MAX_ABS_OPENAI_PENALTY:g}]",
                )
                for name in ("presence_penalty", "frequency_penalty")
            ),
        )
        for name, ok, what in checks:
            value = getattr(self, name)
            if value is not None and not ok(value):  # NaN fails every check
                raise InvalidArgumentError(name, f"must be {what}, got {value}")
        if self.top_k is not None and int(self.top_k) != self.top_k:
            raise InvalidArgumentError("top_k", f"must be an integer, got {self.top_k}")
        return self


def check_top_logprobs(top_logprobs: int | None) -> None:
    """InvalidArgumentError unless top_logprobs is None (no logprobs) or in 0..MAX_TOP_LOGPROBS."""
    if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidArgumentError(
            "top_logprobs", f"must be in 0..{MAX_TOP_LOGPROBS}, got {top_logprobs}"
        )


@dataclass(frozen=True)
class SessionOptions:
    """How a verifier session samples, fixed for its whole life (a Prefill's fields beside the
    prompt): ``temperature`` (0: greedy, the argmax of p), the sampling ``controls`` (unset
    fields: the model's defaults), the ``seed`` of the session's generator (None: random) and
    ``top_logprobs``, the alternatives each token's logprobs report (None: no logprobs), and
    the ``constraint`` every emitted token must keep to (None: none; see speculant.grammar)."""

    temperature: float = 1.0
    controls: SamplingControls = field(default_factory=SamplingControls)
    seed: int | None = None
    top_logprobs: int | None = None
    constraint: Constraint | None = None


GREEDY = SessionOptions(temperature=0.0)
