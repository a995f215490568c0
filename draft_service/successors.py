"""The successor counts drafting mixes q from, after one context tail.

Three sources, highest order first at each: the graph's counts c_graph,o; the live layer's
(what the draft tier learned from the generations it served, :mod:`draft_service.learning`),
added as live.weight * c_live,o; and the overlay's (the request's own context,
:mod:`draft_service.overlay`), added as overlay_weight * c_context,o. Each successor's *source*
says who listed it: "graph" (the graph or the live layer: the tier's shared counts),
"overlay", or "both".
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from draft_service.learning import LiveLayer
from draft_service.mixing import Mixer
from draft_service.overlay import Combined, ContextIndex, as_arrays, combine
from speculant.config import DraftParams
from speculant.graph_reader import NGramGraph

DEAD_END = (-1, 0, 0.0)  # a greedy step where no order matches: (token, order, q)
# (matching orders, successor ids per order, counts per order, token -> its source)
Counts = tuple[list[int], list[np.ndarray], list[np.ndarray], Callable[[int], str]]


class Successors:
    """Successor counts and greedy steps after a tail, from a graph and an optional live layer
    (thread-safe: reads only)."""

    def __init__(self, graph: NGramGraph, live: LiveLayer | None, mixer: Mixer) -> None:
        self.graph = graph
        self.live = live
        self.mixer = mixer

    def learned(self, tail: bytes) -> tuple[tuple, tuple]:
        """(the live layer's successor counts for tail, their signature for cache keys), see
        LiveLayer.lookup; ((), ()) without a layer."""
        return self.live.lookup(tail) if self.live is not None else ((), ())

    def counts(self, tail: bytes, params: DraftParams, found: tuple, learned: tuple) -> Counts:
        """The counts after tail: the graph's, combined with learned (the live layer's) and
        found (the overlay's, ContextIndex.successors) when there are any; no orders at a dead
        end."""
        if not (found or learned):
            return *self.graph.match(tail, params.effective_mixing != "backoff"), from_graph
        combined = self.combined(tail, params, found, learned)
        return combined.orders, combined.ids, combined.counts, combined.source_of

    def combined(self, tail: bytes, params: DraftParams, found: tuple, learned: tuple) -> Combined:
        """The graph's counts after tail plus live.weight times learned, then plus
        overlay_weight times found: c_graph + w_live c_live + w c_ctx per order. A token the
        live layer alone lists counts as "graph", one the overlay lists as "overlay" or
        "both"."""
        every_order = params.effective_mixing != "backoff"
        orders, ids, counts = self.graph.match(tail, every_order)
        if learned:
            assert self.live is not None
            shared = combine(orders, ids, counts, learned, self.live.weight, every_order)
            orders, ids, counts = shared.orders, shared.ids, shared.counts
            if not found:
                return Combined(orders, ids, counts, ids, [])
        return combine(orders, ids, counts, as_arrays(found), params.overlay_weight, every_order)

    def greedy_step(
        self, tail: bytes, params: DraftParams, *, with_prob: bool
    ) -> tuple[int, int, float]:
        """(argmax q, matched order, q(argmax)) after tail from the graph alone; DEAD_END where
        no order matches.

        with_prob=False may leave q(argmax) NaN (for a caller that needs no path probabilities:
        saves a numpy sum per backoff step); such a cached step is recomputed when it is needed.
        """
        mode = params.effective_mixing
        match = self.graph.match
        if mode == "witten-bell" and not with_prob:  # look at the highest order first
            orders, ids, counts = match(tail, every_order=False)
            if not orders:
                return DEAD_END
            if witten_bell_decided(counts[0], params.escape_weight):
                return int(ids[0][0]), orders[0], math.nan
            lower_orders, lower_ids, lower_counts = match(tail, True, top=orders[0] - 1)
            orders, ids, counts = orders + lower_orders, ids + lower_ids, counts + lower_counts
        else:
            orders, ids, counts = match(tail, every_order=mode != "backoff")
            if not orders:
                return DEAD_END
        token, prob = self.mixer.argmax(orders, ids, counts, params, with_prob)
        return token, orders[0], prob

    def argmax_combined(self, combined: Combined, params: DraftParams) -> tuple[int, float]:
        """(argmax q, q(argmax)) over combined counts (ties: lowest id)."""
        if len(combined.orders) == 1:  # combined counts are not sorted: no shortcut
            counts = combined.counts[0]
            top = counts.max()
            return int(combined.ids[0][counts == top].min()), float(top / counts.sum())
        return self.mixer.argmax(combined.orders, combined.ids, combined.counts, params)


def witten_bell_decided(counts: np.ndarray, escape_weight: float) -> bool:
    """Whether the highest matching order alone fixes the Witten-Bell argmax.

    With that order's counts a_1 >= a_2 >= ... (C in all, T distinct), b = escape_weight and
    lambda = C / (C + b T), q(x) = lambda * a_x / C + (1 - lambda) * Q(x) for some distribution Q
    of the lower orders, so q(top) - q(y) >= (a_1 - a_2 - b T) / (C + b T) > 0 for every other y
    when a_1 - a_2 > b T: the top successor is the strict argmax whatever the lower orders say.
    """
    types = counts.shape[0]
    second = int(counts[1]) if types > 1 else 0
    return int(counts[0]) - second > escape_weight * types


def from_graph(_token: int) -> str:
    """The source of every successor when only the graph has counts."""
    return "graph"


def overlay_successors(overlay: ContextIndex | None, tail: bytes) -> tuple:
    """The overlay's successor counts for tail (ContextIndex.successors); () without one."""
    return overlay.successors(tail) if overlay is not None else ()
