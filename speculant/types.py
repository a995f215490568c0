"""Plain data passed between the drafter, the verifier and the coordinator (no gRPC inside).

Terms used across the project:
- *draft tokens*: the tokens the drafter proposes for the next positions, d_1..d_k.
- *q*: the (sparse) distribution a draft token was drawn from by the drafter.
- *p*: the target model's distribution at a position: its logits processed by the request's
  sampling controls (penalties, temperature, top_k / top_p / min_p: :class:`SamplingControls`),
  then softmax; plain softmax(logits / temperature) when no control is set.
- *accepted* tokens: the prefix of the draft that rejection sampling keeps.
- *rejected*: the first draft token that is not kept; everything after it is discarded.
- *corrected* token: sampled from the residual distribution in place of the rejected token.
- *bonus* token: sampled from p after the last draft token when every draft token is accepted.
Each verification therefore emits accepted + 1 tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from speculant.config import (
    DEFAULT_DRAFT_K,
    DEFAULT_OVERLAY_WEIGHT,
    DEFAULT_TREE_NODES,
    MAX_DRAFT_K,
    MAX_MIXING_WEIGHT,
    MIN_MIX_TEMPERATURE,
    MIXING_MODES,
    DraftConfig,
    GenerationConfig,
    MixingName,
)
from speculant.errors import InvalidArgumentError

DraftStrategyName = Literal["greedy", "sampling"]
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
    ``min_draft_prob`` in [0, 1] (0 = off) stops a draft before the first position i whose best
    running probability q(d_1)*...*q(d_{i-1})*max q_i is below it (the first token is always
    drafted; decided before d_i is drawn, so sampled drafts stay exact).
    ``overlay_weight`` (finite, >= 0; 0 = off) adds the request's own context as a second source:
    at every order o the successor counts become c_graph,o + overlay_weight * c_context,o before
    mixing (see :mod:`draft_service.overlay`); the coordinator then sends the whole context.
    ``tree_nodes`` (0..64; 0 = a chain) drafts a tree of up to that many tokens when
    :attr:`drafts_tree` holds (see :mod:`draft_service.drafting`).
    ``adaptive_k`` (a gateway-side choice): the coordinator adapts each round's draft length to
    the request's acceptance history, between 1 and k (see :mod:`gateway.adaptive_k`).
    ``draft_size`` (a gateway-side choice): "cost" sizes each round's draft by the verifier's
    cost profile, with k and tree_nodes as limits, and verifies its best-first part that pays
    (possibly none); "fixed" verifies every drafted token (see :mod:`gateway.draft_sizing`).

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
    min_draft_prob: float = 0.0
    overlay_weight: float = DEFAULT_OVERLAY_WEIGHT
    tree_nodes: int = DEFAULT_TREE_NODES
    adaptive_k: bool = False
    draft_size: DraftSizeName = "cost"

    @property
    def drafts_tree(self) -> bool:
        """Whether drafts are trees: tree_nodes > 0 and no min_draft_prob (drafts cut by
        min_draft_prob are chains; adaptive_k sets a tree's depth; the overlay applies to both)."""
        return self.tree_nodes > 0 and self.min_draft_prob == 0

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
        if not 0.0 <= self.min_draft_prob <= 1.0:  # NaN fails too
            raise InvalidArgumentError(
                "min_draft_prob", f"must be a number in [0, 1], got {self.min_draft_prob}"
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
    def from_config(cls, config: GenerationConfig) -> SamplingControls:
        """The controls a GenerationConfig sets (the others unset)."""
        return cls(**{name: getattr(config, name) for name in SAMPLING_CONTROLS_OFF})

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
class TokenLogprobs:
    """The target's log-probability of one emitted token under p (temperature 0: the log-softmax
    of the penalised logits), and the most likely alternatives, most likely first."""

    token_id: int
    logprob: float
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass
class SparseDistribution:
    """A distribution over a few token ids: probs[i] = P(token_ids[i]); others have P = 0."""

    token_ids: np.ndarray  # [n] int64
    probs: np.ndarray  # [n] float64, sums to 1

    @classmethod
    def point_mass(cls, token_id: int) -> SparseDistribution:
        return cls(np.array([token_id], dtype=np.int64), np.array([1.0]))


@dataclass
class DraftProposal:
    """Up to k draft tokens; distributions[i] is the q that token_ids[i] was drawn from.

    distributions may be empty for greedy drafts (the gRPC client does not decode them): each q
    is then the point mass at its token, which is what the verifier assumes without them.
    """

    token_ids: list[int] = field(default_factory=list)
    distributions: list[SparseDistribution] = field(default_factory=list)
    matched_orders: list[int] = field(default_factory=list)  # highest matching order per token
    # per token: "graph", "overlay" or "both" (see draft_service.drafting); may be empty
    sources: list[str] = field(default_factory=list)
    # A draft tree: parents[i] is the index of token i's parent (< i), or -1 when token i follows
    # the context directly. Empty: a chain (token i follows token i - 1).
    parents: list[int] = field(default_factory=list)
    # The drafter's confidence: path_probs[i] = q(t_1) * ... * q(t_i) along token i's path (the
    # mixed q of each token before a greedy draft reports its point mass), so token i's own
    # q given its parent is path_probs[i] / path_probs[parent]. May be empty (older servers).
    path_probs: list[float] = field(default_factory=list)
    # Seconds the drafter spent making the draft (its own work, no RPC); 0 when unknown.
    seconds: float = 0.0

    def depths(self) -> list[int]:
        """The draft position (0-based) of each token: its depth in the tree."""
        if not self.parents:
            return list(range(len(self.token_ids)))
        depths: list[int] = []
        for parent in self.parents:
            depths.append(0 if parent < 0 else depths[parent] + 1)
        return depths

    def truncated(self, k: int) -> DraftProposal:
        """Only the draft tokens at positions < k (a shorter chain with the same seed drafts the
        same prefix; a shallower tree keeps its top levels)."""
        keep = [i for i, depth in enumerate(self.depths()) if depth < k]
        return self if len(keep) == len(self.token_ids) else self.select(keep)

    def select(self, keep: list[int]) -> DraftProposal:
        """The draft tokens at indices keep (ascending, every kept token's parent kept too),
        with the tree's parent indices renumbered."""
        new_index = {old: new for new, old in enumerate(keep)}

        def pick(values: list) -> list:
            return [values[i] for i in keep] if values else []

        return DraftProposal(
            pick(self.token_ids),
            pick(self.distributions),
            pick(self.matched_orders),
            pick(self.sources),
            [new_index.get(self.parents[i], -1) for i in keep] if self.parents else [],
            pick(self.path_probs),
            self.seconds,
        )


@dataclass
class NextRoundDraft:
    """A draft prepared for one *outcome* of verifying the current round's draft d_1..d_k: the
    verifier accepts d_1..d_j (j = accepted_count) and then emits next_token (a correction, or
    the bonus token when j = k). `proposal` is exactly what the drafter proposes for the context
    that outcome leads to, so using it changes nothing but the time spent waiting for it."""

    accepted_count: int
    next_token: int
    proposal: DraftProposal


@dataclass
class VerifyResult:
    """Outcome of one verification: accepted_count drafts kept, then one corrected/bonus token."""

    accepted_count: int
    token_ids: list[int]  # accepted drafts + the corrected or bonus token
    # indices of the accepted drafts in the draft (a tree's path); empty for a chain (0, 1, ...)
    accepted_nodes: list[int] = field(default_factory=list)
    # one per token of token_ids when the session reports logprobs, else empty
    logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass
class ModelInfo:
    """What the verifier reports about its model (GetModelInfo)."""

    model_name: str
    tokenizer_name: str
    tokenizer_fingerprint: str
    vocab_size: int
    eos_token_ids: list[int]
    max_context_length: int
    device: str
    dtype: str
    # [n - 1]: seconds of one forward over n new tokens (speculant.cost_profile); [] = unknown
    verify_cost_seconds: list[float] = field(default_factory=list)


@dataclass
class VerifierStats:
    """Counters of a verifier (GetStats)."""

    live_sessions: int = 0
    sessions_created: int = 0
    sessions_released: int = 0
    sessions_expired: int = 0
    forward_passes: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(frozen=True)
class LiveStats:
    """What the layer holds now, and what it has learned and forgotten since it started."""

    documents: int
    tokens: int
    contexts: int
    pairs: int
    estimated_bytes: int
    max_bytes: int
    learned_documents: int
    forgotten_documents: int
