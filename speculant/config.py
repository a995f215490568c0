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
  constructor arguments win over the environment. :class:`DraftConfig` declares the drafting
  fields (type, bound, default, help); :class:`GenerationConfig`'s sampling fields are
  SamplingControls'.
- Drafting parameters (:class:`DraftParams`): one request's, derived from DraftConfig's fields,
  with the names and defaults they use. Terms (draft tokens, q) are defined in
  :mod:`speculant.types`. The mixing parameters a graph may carry tuned defaults for are
  TUNABLE_FIELDS; BUILTIN_TUNABLE_DEFAULTS are the values used where neither the request nor the
  graph sets one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_type_hints

from pydantic import Field, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

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


DraftStrategyName = Literal["greedy", "sampling"]
# How the successor distributions of the matching orders become one q (draft_service.mixing):
# "seed" = the seed's attentive score softmax, "backoff" = the highest matching order alone,
# "witten-bell" = interpolated Witten-Bell over the matching orders.
MixingName = Literal["seed", "backoff", "witten-bell"]
MIXING_MODES: tuple[str, ...] = ("seed", "backoff", "witten-bell")
MAX_DRAFT_K = 64
# The default draft: a tree of up to DEFAULT_TREE_NODES tokens, at most k deep; tree_nodes=0 gives
# a chain of k. Why these: docs/benchmarks.md "Why the defaults".
DEFAULT_DRAFT_K = 16
DEFAULT_TREE_NODES = 64
# The context overlay's weight (draft_service.overlay): a context n-gram counts this many graph
# counts. The model repeats its own context (names, identifiers, whole phrases), so its counts
# earn a high weight (docs/benchmarks.md "Why the defaults"). The coordinator uses the overlay
# only where its measured gain pays its drafting time (gateway.rounds.draft_sizing).
DEFAULT_OVERLAY_WEIGHT = 64.0
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
DEFAULT_LEARN_WEIGHT = 16.0


class GraphConfig(BaseSettings):
    """How the builder makes a graph (``SPECULANT_GRAPH__*``)."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_GRAPH__", extra="forbid")

    tokenizer_name: str = ""
    max_order: int = Field(5, ge=1, le=64)  # the longest context drafts mix (suffix_index)
    graph_path: str = "graph"


class DraftConfig(BaseSettings):
    """How the draft service proposes tokens (``SPECULANT_DRAFT__*``).

    ``mixing`` picks how the matching orders are combined into q when ``attentive_mix`` is
    true: "witten-bell" (the default: interpolated Witten-Bell, an order o keeps
    C_o / (C_o + escape_weight * T_o) of the mass, T_o its distinct successors; escape_weight 1
    is the classic rule, 8 the default), "seed" (the seed project's formula: each matching order
    o, with successor counts of total C_o, distribution P_o and entropy H_o in nats, scores
    ``order_bias*ln(o) + reliability_weight*ln(1+C_o) - entropy_penalty*H_o`` and
    q = sum_o softmax(score/mix_temperature)_o * P_o) or "backoff" (the highest matching order
    alone); ``attentive_mix=False`` forces "backoff" whatever ``mixing`` says.
    ``overlay_weight`` (0 = off) mixes in the n-grams of the request's own prompt and generated
    tokens: per order, counts c_graph + overlay_weight * c_context (draft_service/overlay.py).
    ``tree_nodes`` (default 64; 0 = a chain of k) drafts a tree of up to that many tokens, k
    levels deep (see draft_service.drafting).
    ``draft_size`` "cost" (default) sizes each round's draft by the verifier's cost profile, k
    and tree_nodes being limits, and verifies the best-first part that pays (possibly none:
    a plain decoding step); "fixed" verifies every drafted token (see gateway.rounds.draft_sizing).

    Graph defaults: the mixing parameters (mixing, escape_weight and the four ``seed`` weights)
    that are not set explicitly (as arguments or SPECULANT_DRAFT__* variables) take the values
    ``speculant tune --write`` stored in the graph, else the defaults below.
    """

    model_config = SettingsConfigDict(env_prefix="SPECULANT_DRAFT__", extra="forbid")

    k: int = Field(DEFAULT_DRAFT_K, ge=1, le=MAX_DRAFT_K)
    strategy: DraftStrategyName = "greedy"
    attentive_mix: bool = True
    order_bias: float = Field(1.0, ge=0.0, le=MAX_MIXING_WEIGHT)
    mix_temperature: float = Field(1.0, ge=MIN_MIX_TEMPERATURE, allow_inf_nan=False)
    reliability_weight: float = Field(1.0, ge=0.0, le=MAX_MIXING_WEIGHT)
    entropy_penalty: float = Field(0.5, ge=0.0, le=MAX_MIXING_WEIGHT)
    mixing: MixingName = "witten-bell"
    escape_weight: float = Field(8.0, gt=0.0, le=MAX_MIXING_WEIGHT)
    overlay_weight: float = Field(DEFAULT_OVERLAY_WEIGHT, ge=0.0, le=MAX_MIXING_WEIGHT)
    tree_nodes: int = Field(DEFAULT_TREE_NODES, ge=0, le=MAX_DRAFT_K)
    draft_size: Literal["cost", "fixed"] = "cost"


class VerifierConfig(BaseSettings):
    """How the verifier loads and runs the target model (``SPECULANT_VERIFIER__*``)."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_VERIFIER__", extra="forbid")

    model_name: str = ""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    hf_token: str | None = None
    # Hugging Face download policy: "auto" uses the cache and the network, "offline" only the
    # local cache or folder, "force" re-downloads.
    download_mode: Literal["auto", "offline", "force"] = "auto"
    session_ttl_s: float = Field(300.0, gt=0)
    # Live sessions of Session streams (the gateway's generations; each holds a server thread).
    max_sessions: int = Field(64, ge=1)
    # Live sessions made by unary Prefill calls (direct clients), capped apart from the others.
    max_unary_sessions: int = Field(16, ge=0)
    # torch intra-op threads (None = torch's default). Small models on busy CPUs run best on 1.
    torch_threads: int | None = Field(None, ge=1)
    # Run Llama models through verifier_service.lean_llama (the same torch operations without
    # transformers' per-call Python; used only where a check at load shows identical logits).
    lean_forward: bool = True
    # Verify calls of concurrent sessions run together in one forward pass, up to this many
    # (1 = every call on its own); see verifier_service.batching.
    max_batch: int = Field(8, ge=1, le=256)
    # Draft tokens one Verify may carry (more: INVALID_ARGUMENT, before any work).
    max_draft_tokens: int = Field(DEFAULT_MAX_DRAFT_TOKENS, ge=1, le=4096)
    # Seconds the start-up measurement of the cost profile may take (verifier_service.cost_probe;
    # it always times forwards of 1 and 2 new tokens at least).
    cost_probe_s: float = Field(2.0, ge=0.0)


# The sampling controls as settings: SamplingControls' fields (declared there, validated there by
# name), each None by default: the model's generation_config value where it sets one, else off.
_SamplingSettings = create_model(
    "_SamplingSettings",
    __base__=BaseSettings,
    **{name: (hint, None) for name, hint in get_type_hints(SamplingControls).items()},
)


class GenerationConfig(_SamplingSettings):  # type: ignore[misc,valid-type]
    """Per-request generation parameters (``SPECULANT_GENERATION__*``), the sampling controls
    (top_k, top_p, min_p and the penalties: see SamplingControls) included."""

    model_config = SettingsConfigDict(env_prefix="SPECULANT_GENERATION__", extra="forbid")

    max_tokens: int = Field(100, ge=0)
    temperature: float = Field(1.0, ge=0.0)
    seed: int | None = Field(None, ge=0)
    stop: list[str] = Field(default_factory=list)
    top_logprobs: int | None = None  # report logprobs with this many alternatives (0..20)
    # what the output must match (speculant.constraint), e.g.
    # Constraint("json_schema", json.dumps(schema)); None: free text
    constraint: Constraint | None = None


class SpeculantSettings(BaseSettings):
    """All settings, nested: ``SPECULANT_DRAFT__K=10`` -> ``settings.draft.k``."""

    model_config = SettingsConfigDict(
        env_prefix="SPECULANT_", env_nested_delimiter="__", extra="ignore"
    )

    graph: GraphConfig = Field(default_factory=GraphConfig)
    draft: DraftConfig = Field(default_factory=DraftConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    generation: GenerationConfig = Field(default_factory=GenerationConfig)


DraftSizeName = Literal["cost", "fixed"]
DRAFT_SIZES: tuple[str, ...] = ("cost", "fixed")

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
    """Per-request drafting parameters (see :class:`speculant.config.DraftConfig`).

    ``mixing`` ("seed", "backoff", "witten-bell") picks how the matching orders are combined into
    q; ``attentive_mix=False`` forces "backoff" (see :attr:`effective_mixing`). ``escape_weight``
    (> 0, 1 = classic) scales the mass each order lends to the lower ones under "witten-bell".
    ``overlay_weight`` (finite, >= 0; 0 = off) adds the request's own context as a second source:
    at every order o the successor counts become c_graph,o + overlay_weight * c_context,o before
    mixing (see :mod:`draft_service.overlay`); the coordinator then sends the whole context.
    ``tree_nodes`` (0..64; 0 = a chain) drafts a tree of up to that many tokens when
    :attr:`drafts_tree` holds (see :mod:`draft_service.drafting`).
    ``draft_size`` (a gateway-side choice): "cost" sizes each round's draft by the verifier's
    cost profile, with k and tree_nodes as limits, and verifies its best-first part that pays
    (possibly none); "fixed" verifies every drafted token (see :mod:`gateway.rounds.draft_sizing`).

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
        """Raise InvalidArgumentError naming the first bad field; return self when valid."""
        if not 1 <= self.k <= MAX_DRAFT_K:
            raise InvalidArgumentError("k", f"must be in 1..{MAX_DRAFT_K}, got {self.k}")
        if not 0 <= self.tree_nodes <= MAX_DRAFT_K:
            raise InvalidArgumentError(
                "tree_nodes", f"must be in 0..{MAX_DRAFT_K}, got {self.tree_nodes}"
            )
        if self.strategy not in ("greedy", "sampling"):
            raise InvalidArgumentError(
                "strategy", f"must be 'greedy' or 'sampling', got {self.strategy!r}"
            )
        top = MAX_MIXING_WEIGHT
        for name in ("order_bias", "reliability_weight", "entropy_penalty"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= top:  # NaN fails too
                raise InvalidArgumentError(name, f"must be a number in [0, {top:g}], got {value}")
        if self.escape_weight is not None and not 0 < self.escape_weight <= top:
            raise InvalidArgumentError(
                "escape_weight", f"must be a number in (0, {top:g}], got {self.escape_weight}"
            )
        low = MIN_MIX_TEMPERATURE
        if self.mix_temperature is not None and not low <= self.mix_temperature < float("inf"):
            raise InvalidArgumentError(
                "mix_temperature",
                f"must be a finite number >= {low:g}, got {self.mix_temperature}",
            )
        if self.mixing is not None and self.mixing not in MIXING_MODES:
            raise InvalidArgumentError(
                "mixing", f"must be one of {', '.join(MIXING_MODES)}, got {self.mixing!r}"
            )
        if not 0 <= self.overlay_weight <= top:
            raise InvalidArgumentError(
                "overlay_weight", f"must be a number in [0, {top:g}], got {self.overlay_weight}"
            )
        if self.draft_size not in DRAFT_SIZES:
            raise InvalidArgumentError(
                "draft_size", f"must be one of {', '.join(DRAFT_SIZES)}, got {self.draft_size!r}"
            )
        return self
