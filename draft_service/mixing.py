"""Attentive mixing: one proposal distribution q from the successor counts of several orders.

For every matching order o, with successor counts c_o (a vector over its successor ids):
    C_o = sum(c_o)                      (the context's total count)
    P_o = c_o / C_o                     (the order's next-token distribution)
    H_o = -sum(P_o * ln P_o)            (its entropy in nats) = ln C_o - sum(c_o ln c_o) / C_o
    score_o = order_bias * ln(o) + reliability_weight * ln(1 + C_o) - entropy_penalty * H_o
    w = softmax(score / mix_temperature)            (one weight per matching order)
    q = sum_o w_o * P_o                 (sparse: over the union of the orders' successor ids)

Everything is vectorised over the concatenated successor lists (no Python loop over successors,
a fixed number of numpy calls per draft position); the union of ids is found without sorting,
through a per-thread scratch array indexed by token id.
"""

from __future__ import annotations

import math
import threading
from itertools import accumulate

import numpy as np

from speculant.types import DraftParams


def order_weights(
    orders: list[int], totals: list[float], entropies: list[float], params: DraftParams
) -> list[float]:
    """w = softmax(score / mix_temperature) over the matching orders (plain floats, m <= 10)."""
    scores = [
        params.order_bias * math.log(o)
        + params.reliability_weight * math.log1p(c)
        - params.entropy_penalty * h
        for o, c, h in zip(orders, totals, entropies, strict=True)
    ]
    top = max(scores)
    exps = [math.exp((s - top) / params.mix_temperature) for s in scores]
    norm = sum(exps)
    return [e / norm for e in exps]


class Mixer:
    """Computes q for lists of (successor ids, counts); holds bounded per-thread scratch arrays.

    The scratch arrays are sized by the vocabulary (``slot``: token id -> position) and by the
    longest concatenation seen (``positions``: 0..N-1), so memory is bounded by the graph's
    vocabulary and max order, never by the number of requests.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._local = threading.local()

    def _positions(self, n: int) -> np.ndarray:
        positions = getattr(self._local, "positions", None)
        if positions is None or positions.size < n:
            positions = self._local.positions = np.arange(max(n, 4096), dtype=np.int64)
        return positions[:n]

    def _slot(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """rep [N]: for each entry, the position of one entry (the same for all) with its id."""
        slot = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = np.zeros(self.vocab_size, dtype=np.int64)
        try:
            slot[ids] = pos  # duplicates: one of the writes lands; it elects the representative
        except IndexError:  # an id beyond the meta's vocab_size: grow once
            slot = self._local.slot = np.zeros(int(ids.max()) + 1, dtype=np.int64)
            slot[ids] = pos
        return slot[ids]

    def accumulate(
        self,
        orders: list[int],
        ids_list: list[np.ndarray],
        counts_list: list[np.ndarray],
        params: DraftParams,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ids [N], rep [N], mass [<=N]) for m >= 2 matching orders.

        ids is the concatenation of ids_list (an id may repeat across orders); rep[i] is the
        representative position of ids[i]'s id; mass[r] = q(ids[r]) at representative positions
        r and 0 elsewhere (unnormalised only by rounding).
        """
        lens = [a.size for a in counts_list]
        starts = [0, *accumulate(lens[:-1])]
        c = np.concatenate(counts_list, dtype=np.float64)  # [N] counts
        totals = np.add.reduceat(c, starts).tolist()  # [m] C_o
        if params.entropy_penalty:
            clogc = np.add.reduceat(c * np.log(c), starts).tolist()  # [m] sum c ln c
            entropies = [math.log(t) - s / t for t, s in zip(totals, clogc, strict=True)]
        else:
            entropies = [0.0] * len(orders)
        w = order_weights(orders, totals, entropies, params)
        scale = np.array([wo / t for wo, t in zip(w, totals, strict=True)])  # [m] w_o / C_o
        weighted = c * scale.repeat(lens)  # [N] w_o * P_o(id)
        ids = np.concatenate(ids_list)  # [N]
        rep = self._slot(ids, self._positions(ids.size))
        mass = np.bincount(rep, weights=weighted)
        return ids, rep, mass

    def mix(
        self,
        orders: list[int],
        ids_list: list[np.ndarray],
        counts_list: list[np.ndarray],
        params: DraftParams,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(union ids [U], q [U] float64 summing to 1) for the matching orders' successor lists.

        ids_list[i], counts_list[i] ([n_i] each) are the successors of orders[i], highest order
        first; an id appears at most once per order. Entries of the union are not sorted.
        """
        if len(orders) == 1:
            counts = counts_list[0].astype(np.float64)
            return ids_list[0], counts / counts.sum()
        ids, rep, mass = self.accumulate(orders, ids_list, counts_list, params)
        winners = np.flatnonzero(rep == self._positions(ids.size))  # [U] one entry per id
        q = mass[winners]
        q /= q.sum()
        return ids[winners], q

    def argmax(
        self,
        orders: list[int],
        ids_list: list[np.ndarray],
        counts_list: list[np.ndarray],
        params: DraftParams,
    ) -> int:
        """argmax q (ties: the lowest token id) without materialising the union."""
        if len(orders) == 1:
            return int(ids_list[0][0])  # successors are sorted by count desc, then id asc
        ids, _, mass = self.accumulate(orders, ids_list, counts_list, params)
        top = np.maximum.reduce(mass)
        return int(ids[: mass.size][mass == top].min())
