"""The parameters, each declared once: a request's drafting parameters and sampling controls,
and the services' settings built from them.

- Sampling controls (:class:`SamplingControls`): how the target's logits become p beside the
  temperature, their bounds, the bound on the logprob alternatives a request may ask for
  (:func:`check_top_logprobs`), and all a verifier session is started with beside its prompt
  (:class:`SessionOptions`). Terms (p) are defined in :mod:`speculant.types`.
- Settings: pydantic-settings models read from arguments, then SPECULANT_* environment
  variables. Each model reads its own prefix (``SPECULANT_DRAFT__K=10`` sets
  ``DraftConfig().k``), and :class:`SpeculantSettings` nests them all with prefix
  ``SPECULANT_`` and delimiter ``__``, so the same variable works both ways. Explicit
  constructor arguments win over the environment. Each field declares its type, bounds, default
  and one-line help (``description``), which the flags and docs/configuration.md (rendered by
  scripts/config_table.py) read; :class:`GenerationConfig`'s sampling fields are
  SamplingControls', declared there with their bounds and help.
- Drafting parameters (:class:`DraftParams`): one request's, derived from DraftConfig's fields,
  with the names and defaults they use. Terms (draft tokens, q) are defined in
  :mod:`speculant.types`. The mixing parameters a graph may carry tuned defaults for are
  TUNABLE_FIELDS; BUILTIN_TUNABLE_DEFAULTS are the values used where neither the request nor the
  graph sets one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import NoneType
from typing import Any, Literal, NamedTuple, get_args, get_origin, get_type_hints

from pydantic import Field, create_model
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, SettingsConfigDict

from speculant.constraint import Constraint
from speculant.errors import InvalidArgumentError

MAX_TOP_LOGPROBS = 20  # most alternatives a request may ask for with each token's logprob


def _control(off: float, help: str, **bounds: float) -> Any:
    """A sampling control's declaration: unset (None) by default, the value that turns it off,
    its one-line help and its bounds (pydantic's names: ge, gt, le)."""
    return field(default=None, metadata={"off": off, "help": help, "bounds": bounds})


def _admits(kind: type, bounds: Mapping[str, float], value: float) -> bool:
    """Whether value is within bounds (pydantic's ge, gt, le), finite, and whole for an int."""
    above = value >= bounds["ge"] if "ge" in bounds else value > bounds.get("gt", -math.inf)
    whole = kind is not int or float(value).is_integer()
    return above and value <= bounds.get("le", math.inf) and not math.isinf(value) and whole


def _range(kind: type, bounds: Mapping[str, float]) -> str:
    """The values bounds admit, e.g. "in 1..64", "an integer >= 0", "a number in (0, 1]"."""
    what = "an integer" if kind is int else "a number"
    low, high = bounds.get("ge", bounds.get("gt")), bounds.get("le")
    if kind is int and "ge" in bounds and high is not None:
        return f"in {low}..{high}"
    if high is None:
        return f"{what} {'>=' if 'ge' in bounds else '>'} {low:g}"
    return f"{what} in {'[' if 'ge' in bounds else '('}{low:g}, {high:g}]"


@dataclass(frozen=True)
class SamplingControls:
    """How p is made from the target's logits at each position, beside the temperature.

    Applied in Hugging Face ``generate``'s order: ``repetition_penalty``, then OpenAI's
    ``presence_penalty`` / ``frequency_penalty``, then the temperature, ``top_k``, ``top_p`` and
    ``min_p``. Occurrences count the prompt and every token before the position. Temperature 0
    (greedy) takes the argmax of the penalised logits. Each field declares its help, its bounds
    and the value that turns it off (read as :data:`SAMPLING_CONTROLS`: by validation, the
    flags, GenerationConfig and docs/configuration.md).

    None: the model's own default (its generation_config.json) where it sets one, else off
    (see :meth:`resolved`).
    """

    top_k: int | None = _control(0, "keep the k most likely tokens", ge=0)
    top_p: float | None = _control(
        1.0, "nucleus: keep the smallest most-likely set with mass >= top_p", gt=0.0, le=1.0
    )
    min_p: float | None = _control(
        0.0, "drop tokens below min_p times the largest probability", ge=0.0, le=1.0
    )
    # the bounds: a logit divided by a tinier penalty could overflow float32
    repetition_penalty: float | None = _control(
        1.0,
        "Hugging Face's: the logit l of a token that occurred becomes l / penalty if l > 0, "
        "else l * penalty",
        ge=0.01,
        le=100.0,
    )
    presence_penalty: float | None = _control(
        0.0, "OpenAI's: a token's logit drops by this if it occurred", ge=-2.0, le=2.0
    )
    frequency_penalty: float | None = _control(
        0.0, "OpenAI's: a token's logit drops by this times its occurrences", ge=-2.0, le=2.0
    )

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
        for name, control in SAMPLING_CONTROLS.items():
            value = getattr(self, name)
            if value is not None and not control.admits(value):  # NaN fails every check
                raise InvalidArgumentError(name, f"must be {control.range}, got {value}")
        return self


class SamplingControl(NamedTuple):
    """One field of SamplingControls as it declares it, with its type (int or float)."""

    kind: type
    off: float
    help: str
    bounds: dict[str, float]  # pydantic's names: ge, gt, le

    def admits(self, value: float) -> bool:
        """Whether value is within the bounds (and whole, for an int)."""
        return _admits(self.kind, self.bounds, value)

    @property
    def range(self) -> str:
        """The values it takes, e.g. "a number in (0, 1] (1 = off)"."""
        return f"{_range(self.kind, self.bounds)} ({self.off:g} = off)"

    @property
    def meaning(self) -> str:
        """Its help and range, as the flags and docs/configuration.md give it."""
        return f"{self.help}; {self.range}"


SAMPLING_CONTROLS: dict[str, SamplingControl] = {
    f.name: SamplingControl(
        next(t for t in get_args(get_type_hints(SamplingControls)[f.name]) if t is not NoneType),
        **f.metadata,
    )
    for f in fields(SamplingControls)
}
# The value of each sampling control that turns it off.
SAMPLING_CONTROLS_OFF: dict[str, float] = {
    name: control.off for name, control in SAMPLING_CONTROLS.items()
}
_MODEL_DEFAULT = "; none: the model's generation_config value, else off"


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


DraftStrategyName = Literal["greedy", "sampling"]
# How the successor distributions of the matching orders become one q (draft_service.mixing):
# "seed" = the seed's attentive score softmax, "backoff" = the highest matching order alone,
# "witten-bell" = interpolated Witten-Bell over the matching orders.
MixingName = Literal["seed", "backoff", "witten-bell"]
MIXING_MODES: tuple[str, ...] = get_args(MixingName)
DraftSizeName = Literal["cost", "fixed"]
DRAFT_SIZES: tuple[str, ...] = get_args(DraftSizeName)
# The mixing parameters' help ends with this (see TUNABLE_FIELDS).
_TUNED = " (set nowhere: the graph's tuned value, if it has one)"
MAX_DRAFT_K = 64
# The default draft: a tree of up to DEFAULT_TREE_NODES tokens, at most k deep; tree_nodes=0 gives
# a chain of k. Why these: docs/benchmarks.md "Why the defaults".
DEFAULT_DRAFT_K = 16
DEFAULT_TREE_NODES = 64
# The context overlay's weight (draft_service.overlay): a context n-gram counts this many graph
# counts. The model repeats its own context (names, identifiers, whole phrases), so its counts
# earn a high weight (docs/benchmarks.md "Why the defaults"). The coordinator uses the overlay
# only where its measured gain pays its drafting time (gateway.rounds.draft_sizing).
DEFAULT_OVERLAY_WEIGHT = 512.0
# Bounds of the mixing weights and the seed formula's temperature: beyond them counts and scores
# overflow float64 (a weight near 1.8e308 times a count is inf) and q becomes NaN.
MAX_MIXING_WEIGHT = 1e6
MIN_MIX_TEMPERATURE = 1e-6
# How often the draft service looks for a newly published graph (draft_service.reload), and how
# often the gateway resolves dns:NAME:PORT draft replicas again (gateway.backends), in
# seconds.
DEFAULT_RELOAD_INTERVAL_S = 2.0
DEFAULT_DRAFT_REFRESH_S = 10.0
# The context window `--long-context` suggests: the longest match of up to this many tokens joins
# the orders drafts mix (speculant.graph_reader, a format 2 graph; off by default).
LONG_CONTEXT = 16
# The longest context a graph lookup matches (the suffix index's sort depth,
# speculant.suffix_index): the most context tokens any graph's drafting reads.
MAX_DRAFT_CONTEXT = 64
# Input bounds of the internal services, checked before any work (INVALID_ARGUMENT naming the
# field): context tokens a Propose request may carry (the gateway sends the last max_order
# tokens, or with the context overlay the whole context, clipped to this; the overlay indexes
# them at about 1.5 KB a token), and draft tokens a Verify may score (a tree's cost in the
# forward pass grows with its square; the gateway sends at most MAX_DRAFT_K).
DEFAULT_MAX_CONTEXT_TOKENS = 65_536
DEFAULT_MAX_DRAFT_TOKENS = 64
# Online learning in the draft tier (draft_service.learning): the live layer's memory cap and
# the weight of its counts against the graph's (docs/benchmarks.md "Why the defaults").
DEFAULT_LEARN_MEMORY_MB = 256
DEFAULT_LEARN_WEIGHT = 4.0


class GraphConfig(BaseSettings):
    """How the builder makes a graph (``SPECULANT_GRAPH__*``)."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_GRAPH__", extra="forbid")

    tokenizer_name: str = ""
    max_order: int = Field(5, ge=1, le=64)  # the longest context drafts mix (suffix_index)
    graph_path: str = "graph"


class DraftConfig(BaseSettings):
    """How the draft service proposes tokens (``SPECULANT_DRAFT__*``).

    ``mixing`` picks how the matching orders are combined into q when ``attentive_mix`` is
    true: "witten-bell" (interpolated Witten-Bell, an order o keeps
    C_o / (C_o + escape_weight * T_o) of the mass, T_o its distinct successors; escape_weight 1
    is the classic rule), "seed" (the seed project's formula: each matching order
    o, with successor counts of total C_o, distribution P_o and entropy H_o in nats, scores
    ``order_bias*ln(o) + reliability_weight*ln(1+C_o) - entropy_penalty*H_o`` and
    q = sum_o softmax(score/mix_temperature)_o * P_o) or "backoff" (the highest matching order
    alone); ``attentive_mix=False`` forces "backoff" whatever ``mixing`` says. The overlay:
    draft_service/overlay.py; trees: draft_service.drafting; draft sizes:
    gateway.rounds.draft_sizing.

    Graph defaults: the mixing parameters (mixing, escape_weight and the four ``seed`` weights)
    that are not set explicitly (as arguments or SPECULANT_DRAFT__* variables) take the values
    ``speculant tune --write`` stored in the graph, else the defaults below.
    """

    model_config = SettingsConfigDict(env_prefix="SPECULANT_DRAFT__", extra="forbid")

    k: int = Field(
        DEFAULT_DRAFT_K,
        ge=1,
        le=MAX_DRAFT_K,
        description="draft tokens per round: a chain's length, a tree's depth (with draft_size "
        "cost: a limit)",
    )
    strategy: DraftStrategyName = Field(
        "greedy", description="draft the likeliest token (argmax q), or sample it from q"
    )
    attentive_mix: bool = Field(
        True, description="mix all matching orders; false: the highest matching order only"
    )
    order_bias: float = Field(
        1.0, ge=0.0, le=MAX_MIXING_WEIGHT, description="seed mixing: weight of ln(order)" + _TUNED
    )
    mix_temperature: float = Field(
        1.0,
        ge=MIN_MIX_TEMPERATURE,
        allow_inf_nan=False,
        description="seed mixing: softmax temperature over the order scores" + _TUNED,
    )
    reliability_weight: float = Field(
        1.0,
        ge=0.0,
        le=MAX_MIXING_WEIGHT,
        description="seed mixing: weight of ln(1 + count)" + _TUNED,
    )
    entropy_penalty: float = Field(
        0.5, ge=0.0, le=MAX_MIXING_WEIGHT, description="seed mixing: weight of -entropy" + _TUNED
    )
    mixing: MixingName = Field(
        "witten-bell",
        description="how the matching orders are mixed into q; attentive_mix false forces backoff"
        + _TUNED,
    )
    escape_weight: float = Field(
        8.0,
        gt=0.0,
        le=MAX_MIXING_WEIGHT,
        description="witten-bell: an order keeps C / (C + escape_weight * T) of the mass (T: its "
        "distinct successors) and lends the rest to the lower orders; 1 = classic" + _TUNED,
    )
    overlay_weight: float = Field(
        DEFAULT_OVERLAY_WEIGHT,
        ge=0.0,
        le=MAX_MIXING_WEIGHT,
        description="context overlay: per order, counts = graph + this * the request's own "
        "context (0 = off; with draft_size cost, used in the rounds where it measures faster)",
    )
    tree_nodes: int = Field(
        DEFAULT_TREE_NODES,
        ge=0,
        le=MAX_DRAFT_K,
        description="draft a tree of up to this many tokens, k levels deep, verified in one "
        "forward pass (0 = a chain of k; with draft_size cost: a limit)",
    )
    draft_size: DraftSizeName = Field(
        "cost",
        description="cost: verify, each round, the part of the draft that pays under the "
        "verifier's cost profile (k and tree_nodes are limits; possibly none: a plain step); "
        "fixed: verify every drafted token (sampled drafts always are)",
    )


class VerifierConfig(BaseSettings):
    """How the verifier loads and runs the target model (``SPECULANT_VERIFIER__*``)."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_VERIFIER__", extra="forbid")

    model_name: str = Field("", description="hub name or local folder of the model")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the model runs (auto: cuda when available, else cpu)"
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="weights' dtype (auto: the checkpoint's on a GPU, float32 on a CPU)"
    )
    hf_token: str | None = Field(None, description="Hugging Face token for gated models")
    download_mode: Literal["auto", "offline", "force"] = Field(
        "auto",
        description="Hugging Face downloads: auto uses the cache and the network, offline only "
        "the local cache or folder, force re-downloads",
    )
    session_ttl_s: float = Field(
        300.0, gt=0, description="idle sessions (KV caches) expire after this many seconds"
    )
    max_sessions: int = Field(
        64,
        ge=1,
        description="live sessions of Session streams (the gateway's generations), one server "
        "thread each; more: RESOURCE_EXHAUSTED",
    )
    max_unary_sessions: int = Field(
        16,
        ge=0,
        description="live sessions made by unary Prefill calls (direct clients), capped apart",
    )
    torch_threads: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads (none: torch's default; serve-verifier then uses the "
        "usable cores but one on a CPU)",
    )
    lean_forward: bool = Field(
        True,
        description="run Llama models through verifier_service.lean_llama (the same torch "
        "operations without transformers' per-call Python), where a check at load shows "
        "identical logits",
    )
    max_batch: int = Field(
        8,
        ge=1,
        le=256,
        description="Verify calls of concurrent sessions run together in one forward pass, up to "
        "this many (1 = every call on its own; verifier_service.batching)",
    )
    max_draft_tokens: int = Field(
        DEFAULT_MAX_DRAFT_TOKENS,
        ge=1,
        le=4096,
        description="draft tokens one Verify may carry (more: INVALID_ARGUMENT, before any work)",
    )
    cost_probe_s: float = Field(
        2.0,
        ge=0.0,
        description="seconds the start-up measurement of the cost profile may take (forwards of "
        "1 and 2 new tokens are always timed; verifier_service.cost_probe)",
    )


# The sampling controls as settings: SamplingControls' fields (declared there, validated there by
# name), each None by default: the model's generation_config value where it sets one, else off.
_SamplingSettings = create_model(
    "_SamplingSettings",
    __base__=BaseSettings,
    **{
        name: (hint, Field(None, description=SAMPLING_CONTROLS[name].help + _MODEL_DEFAULT))
        for name, hint in get_type_hints(SamplingControls).items()
    },
)


class GenerationConfig(_SamplingSettings):  # type: ignore[misc,valid-type]
    """Per-request generation parameters (``SPECULANT_GENERATION__*``), the sampling controls
    (top_k, top_p, min_p and the penalties: see SamplingControls) included."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_GENERATION__", extra="forbid")

    max_tokens: int = Field(100, ge=0, description="tokens to generate at most")
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy")
    seed: int | None = Field(
        None, ge=0, description="same request and seed, same tokens (none: a random one)"
    )
    stop: list[str] = Field(default_factory=list, description="stop strings")
    top_logprobs: int | None = Field(
        None,
        description=f"report each token's logprob and this many alternatives "
        f"(0..{MAX_TOP_LOGPROBS}; none: no logprobs)",
    )
    constraint: Constraint | None = Field(
        None,
        description="what the output must match: speculant.constraint.Constraint(kind, text, "
        "choices) of kind json_schema, json_object, regex, choice or grammar (none: free text)",
    )


class SpeculantSettings(BaseSettings):
    """All settings, nested: ``SPECULANT_DRAFT__K=10`` -> ``settings.draft.k``."""

    model_config = SettingsConfigDict(
        env_prefix="SPECULANT_", env_nested_delimiter="__", extra="ignore"
    )

    graph: GraphConfig = Field(default_factory=GraphConfig)
    draft: DraftConfig = Field(default_factory=DraftConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)


# The mixing parameters a graph may carry tuned defaults for (``speculant tune``, stored in its
# meta record under ``tuned.params``). In DraftParams they are None when the request did not
# set them: the drafter then takes the graph's tuned value, else the built-in default below.
TUNABLE_FIELDS: tuple[str, ...] = (
    "mixing",
    "escape_weight",
    "order_bias",
    "reliability_weight",
    "entropy_penalty",
    "mix_temperature",
)
BUILTIN_TUNABLE_DEFAULTS: dict[str, Any] = {
    name: DraftConfig.model_fields[name].default for name in TUNABLE_FIELDS
}


@dataclass(frozen=True)
class DraftParams:
    """Per-request drafting parameters: DraftConfig's fields, whose declarations (type, bounds,
    choices, default, help) :meth:`validate` checks against. ``attentive_mix=False`` forces
    "backoff" (:attr:`effective_mixing`); with ``overlay_weight`` > 0 the coordinator sends the
    whole context (:mod:`draft_service.overlay`); ``draft_size`` is the gateway's choice
    (:mod:`gateway.rounds.draft_sizing`).

    The mixing parameters (TUNABLE_FIELDS) are None when not set: the drafter fills them with
    its graph's tuned defaults, else the built-in ones (:meth:`with_defaults`).
    """

    k: int = DEFAULT_DRAFT_K
    strategy: DraftStrategyName = "greedy"
    attentive_mix: bool = True
    order_bias: float | None = None
    mix_temperature: float | None = None
    reliability_weight: float | None = None
    entropy_penalty: float | None = None
    mixing: MixingName | None = None
    escape_weight: float | None = None
    overlay_weight: float = DEFAULT_OVERLAY_WEIGHT
    tree_nodes: int = DEFAULT_TREE_NODES
    draft_size: DraftSizeName = "cost"

    @property
    def drafts_tree(self) -> bool:
        """Whether drafts are trees: tree_nodes > 0 (the overlay applies to chains and trees)."""
        return self.tree_nodes > 0

    @property
    def effective_mixing(self) -> str:
        """The mixing actually used: "backoff" when attentive_mix is off, else ``mixing``
        (the built-in default mode while it is unset)."""
        if not self.attentive_mix:
            return "backoff"
        return self.mixing or BUILTIN_TUNABLE_DEFAULTS["mixing"]

    @property
    def unset_fields(self) -> tuple[str, ...]:
        """The mixing parameters this request left to the drafter's defaults."""
        return tuple(name for name in TUNABLE_FIELDS if getattr(self, name) is None)

    def with_defaults(self, graph_defaults: Mapping[str, Any] | None = None) -> DraftParams:
        """Every unset mixing parameter filled: from graph_defaults (a graph's tuned values)
        where they have it, else the built-in default. Explicit values are kept."""
        unset = self.unset_fields
        if not unset:
            return self
        graph_defaults = graph_defaults or {}
        return replace(
            self,
            **{name: graph_defaults.get(name, BUILTIN_TUNABLE_DEFAULTS[name]) for name in unset},
        )

    @classmethod
    def from_config(cls, config: DraftConfig) -> DraftParams:
        """The config's values; its mixing parameters only where set explicitly (as arguments
        or SPECULANT_DRAFT__* variables), else None (the graph's tuned or built-in default)."""
        values = config.model_dump()
        for name in TUNABLE_FIELDS:
            if name not in config.model_fields_set:
                values[name] = None
        return cls(**values)

    def validate(self) -> DraftParams:
        """Raise InvalidArgumentError naming the first field outside DraftConfig's declaration
        (its choices, or its bounds; NaN and inf fail); return self when valid. Unset mixing
        parameters are the drafter's to fill."""
        for name, choices, kind, bounds in _draft_checks():
            value = getattr(self, name)
            if value is None:
                continue
            if not (value in choices if choices else _admits(kind, bounds, value)):
                info = DraftConfig.model_fields[name]
                raise InvalidArgumentError(name, f"must be {setting_range(info)}, got {value!r}")
        return self


@functools.cache
def _draft_checks() -> tuple[tuple[str, tuple[str, ...], type, dict[str, float]], ...]:
    """(field, its choices or (), its type, its bounds) of each checked DraftConfig field, read
    from the declarations once (DraftParams.validate runs on every Propose)."""
    return tuple(
        (
            name,
            get_args(info.annotation) if get_origin(info.annotation) is Literal else (),
            info.annotation,
            _bounds(info),
        )
        for name, info in DraftConfig.model_fields.items()
        if info.annotation is not bool
    )


def _bounds(info: FieldInfo) -> dict[str, float]:
    """A field's bounds, by pydantic's names (ge, gt, le)."""
    return {
        key: getattr(m, key) for m in info.metadata for key in ("ge", "gt", "le") if hasattr(m, key)
    }


def setting_range(info: FieldInfo) -> str:
    """The values a settings field takes where it declares them: its choices (a Literal) or
    its bounds, e.g. "one of greedy, sampling", "in 1..64"; else ""."""
    if get_origin(info.annotation) is Literal:
        return f"one of {', '.join(get_args(info.annotation))}"
    kind = next(t for t in get_args(info.annotation) or (info.annotation,) if t is not NoneType)
    return _range(kind, bounds) if (bounds := _bounds(info)) and kind in (int, float) else ""
