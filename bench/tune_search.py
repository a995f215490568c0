"""The candidate search of ``speculant tune`` (:mod:`bench.tune`): which mixing settings are
tried, and how each is scored by replaying greedy speculative decoding against the traces
(:mod:`bench.greedy_sim`).

A *candidate* is a DraftParams with every mixing parameter set explicitly (the built-in defaults
where a candidate does not choose), of the draft shape scored. Candidates: ``backoff``;
``witten-bell`` over ESCAPE_WEIGHTS, refined around the best; ``seed`` by coordinate search over
SEED_GRID, from the built-in weights, for at most SEED_PASSES passes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from bench.greedy_sim import GreedyTrace, SimResult, verify_all
from speculant.config import BUILTIN_TUNABLE_DEFAULTS, DraftParams

ESCAPE_WEIGHTS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
SEED_GRID: dict[str, tuple[float, ...]] = {
    "order_bias": (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0),
    "reliability_weight": (0.0, 0.25, 0.5, 1.0, 2.0),
    "entropy_penalty": (0.0, 0.25, 0.5, 1.0, 2.0),
    "mix_temperature": (0.25, 0.5, 1.0, 2.0, 4.0),
}
SEED_PASSES = 2


def explicit_params(shape: DraftParams, **mixing: Any) -> DraftParams:
    """Greedy DraftParams of shape's k, tree_nodes and overlay_weight with every mixing
    parameter set (the built-in defaults overridden by `mixing`), every drafted token verified
    (the replay's draft size)."""
    return verify_all(
        DraftParams(
            k=shape.k,
            tree_nodes=shape.tree_nodes,
            overlay_weight=shape.overlay_weight,
            **(BUILTIN_TUNABLE_DEFAULTS | mixing),
        )
    ).validate()


def mixing_of(params: DraftParams) -> dict[str, Any]:
    """The mixing parameters that matter for params' mode (the others are left out)."""
    mode = params.effective_mixing
    if mode == "witten-bell":
        return {"mixing": mode, "escape_weight": params.escape_weight}
    if mode == "seed":
        return {"mixing": mode} | {name: getattr(params, name) for name in SEED_GRID}
    return {"mixing": mode}


_SHORT_NAMES = {
    "escape_weight": "b",
    "order_bias": "ob",
    "reliability_weight": "rw",
    "entropy_penalty": "ep",
    "mix_temperature": "t",
}


def describe(params: DraftParams) -> str:
    """A short name of a candidate: its mode and parameters."""
    values = mixing_of(params)
    mode = values.pop("mixing")
    return " ".join([mode, *(f"{_SHORT_NAMES[k]}={v:g}" for k, v in values.items())])


class Scorer:
    """Scores candidates on a set of traces (cached by parameters)."""

    def __init__(
        self,
        simulate: Callable[[DraftParams, list[GreedyTrace]], SimResult],
        traces: list[GreedyTrace],
        metric: str,
    ) -> None:
        self._simulate = simulate
        self.traces = traces
        self.metric = metric
        self.results: dict[DraftParams, SimResult] = {}
        self.order: list[DraftParams] = []  # in the order tried

    def __call__(self, params: DraftParams) -> float:
        if params not in self.results:
            self.results[params] = self._simulate(params, self.traces)
            self.order.append(params)
        return self.score(self.results[params])

    def score(self, result: SimResult) -> float:
        return result.tau if self.metric == "tau" else result.acceptance


def best_of(scorer: Scorer, candidates: Iterable[DraftParams]) -> DraftParams:
    """The candidate of the highest score (ties: the first)."""
    best: DraftParams | None = None
    for params in candidates:
        if best is None or scorer(params) > scorer(best):
            best = params
    assert best is not None
    return best


def search(
    scorer: Scorer, shape: DraftParams, progress: Callable[[str], None]
) -> dict[str, DraftParams]:
    """The best candidate of every mode on the scorer's traces, keyed by mode, "default" (the
    built-in settings, tried first) and "seed built-in" (the seed formula's built-in weights);
    shape: the draft shape scored (its k and tree_nodes)."""
    default = explicit_params(shape)
    scorer(default)
    best: dict[str, DraftParams] = {"default": default}
    best["backoff"] = explicit_params(shape, mixing="backoff")
    progress(f"backoff: {scorer(best['backoff']):.3f}")
    grid = [explicit_params(shape, escape_weight=b) for b in ESCAPE_WEIGHTS]
    wb = best_of(scorer, [default, *grid])
    b = wb.escape_weight or 1.0
    wb = best_of(scorer, [wb, *(explicit_params(shape, escape_weight=b * f) for f in (0.7, 1.4))])
    best["witten-bell"] = wb
    progress(f"witten-bell: {describe(wb)}: {scorer(wb):.3f}")
    seed = best["seed built-in"] = explicit_params(shape, mixing="seed")
    for _ in range(SEED_PASSES):
        start = seed
        for name, values in SEED_GRID.items():
            seed = best_of(scorer, [seed, *(replace(seed, **{name: v}) for v in values)])
        if seed == start:
            break
    best["seed"] = seed
    progress(f"seed: {describe(seed)}: {scorer(seed):.3f}")
    return best
