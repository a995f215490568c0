"""Bounded caches of drafting steps, and the key part the mixing parameters make.

A *step* is what drafting decides after one context tail (its last graph.window tokens): for a
chain, (token, matched order, q(token)[, source]); for a tree node, (matched order, its
TREE_WIDTH likeliest successors). It depends only on the tail, on the mixing parameters
(:func:`mix_key`) and, where the overlay or the live layer add counts, on those counts; the
rounds of one generation revisit the same tails, so steps are kept.
"""

from __future__ import annotations

import contextlib

from speculant.config import DraftParams

DEFAULT_CACHE_SIZE = 32768  # steps kept per cache (their memory: docs/benchmarks.md)


class StepCache:
    """A dict of steps bounded to `size` entries, the oldest evicted first (size 0: off).

    Thread-safe enough for its job: concurrent evictions may race, and losing one is harmless
    (the bound is approximate)."""

    def __init__(self, size: int = DEFAULT_CACHE_SIZE) -> None:
        self.size = size
        self.entries: dict[tuple, tuple] = {}

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def remember(self, key: tuple, step: tuple) -> None:
        """Keep `step` under `key`, evicting the oldest entry beyond the size."""
        entries = self.entries
        if key not in entries and len(entries) >= self.size:
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del entries[next(iter(entries))]
        entries[key] = step


def mix_key(params: DraftParams) -> tuple:
    """The mixing parameters a step depends on (besides the context tail)."""
    mode = params.effective_mixing
    if mode == "backoff":
        return (mode,)
    p = params
    if mode == "witten-bell":
        return (mode, p.escape_weight)
    return (mode, p.order_bias, p.reliability_weight, p.entropy_penalty, p.mix_temperature)
