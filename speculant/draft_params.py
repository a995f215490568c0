"""Per-request drafting parameters (:class:`DraftParams`) and the names and defaults they use.

Terms (draft tokens, q) are defined in :mod:`speculant.types`. The mixing parameters a graph may
carry tuned defaults for are TUNABLE_FIELDS; BUILTIN_TUNABLE_DEFAULTS are the values used where
neither the request nor the graph sets one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from speculant.config import (
    DEFAULT_DRAFT_K,
    DEFAULT_OVERLAY_WEIGHT,
    DEFAULT_TREE_NODES,
    MAX_DRAFT_K,
    MAX_MIXING_WEIGHT,
    MIN_MIX_TEMPERATURE,
    MIXING_MODES,
    DraftConfig,
    DraftStrategyName,
    MixingName,
)
from speculant.errors import InvalidArgumentError

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
