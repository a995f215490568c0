"""Mixing: one proposal distribution q from the successor counts of several matching orders.

Terms. An *order* o is a context length in tokens; it *matches* when the last o context tokens
were seen in the corpus, with successor counts c_o (a vector over its successor ids, each id at
most once). For every matching order o:
    C_o = sum(c_o)                      (the context's total count)
    T_o = len(c_o)                      (its number of distinct successors, "types")
    P_o = c_o / C_o                     (the order's maximum-likelihood next-token distribution)
    H_o = -sum(P_o * ln P_o)            (its entropy in nats) = ln C_o - sum(c_o ln c_o) / C_o
Every mode is a linear mixture q = sum_o w_o * P_o (sparse: over the union of the orders'
successor ids) with weights w_o >= 0 summing to 1; the modes differ in w:

- ``seed`` (the seed's attentive formula):
    score_o = order_bias * ln(o) + reliability_weight * ln(1 + C_o) - entropy_penalty * H_o
    w = softmax(score / mix_temperature)
  C_o never grows with o, so the count term favours the short contexts.
- ``backoff``: w = 1 at the highest matching order, 0 elsewhere (q = P of that order).
- ``witten-bell`` (interpolated Witten-Bell): over the matching orders o_1 < o_2 < ... < o_m,
  recursively from the lowest upward, with b = escape_weight (1 = the classic rule),
    Q_1 = P_{o_1},   Q_j = (c_{o_j} + b T_{o_j} * Q_{j-1}) / (C_{o_j} + b T_{o_j}),   q = Q_m.
  With lambda_j = C_{o_j} / (C_{o_j} + b T_{o_j}) (the weight the order trusts its own counts with)
  that is w_{o_m} = lambda_m, w_{o_j} = lambda_j * prod_{i>j} (1 - lambda_i), w_{o_1} =
  prod_{i>1} (1 - lambda_i): a long context keeps most of the mass unless it has been followed by
  many distinct tokens relative to its count (then it is unreliable and lends mass downward).

Everything is vectorised over the concatenated successor lists (no Python loop over successors,
a fixed number of numpy calls per draft position); the union of ids is found without sorting,
through a per-thread scratch array indexed by token id.
"""

from __future__ import annotations

import math
import threading
from itertools import accumulate

import numpy as np

from speculant.config import DraftParams


def order_weights(
    orders: list[int], totals: list[float], entropies: list[float], params: DraftParams
) -> list[float]:
    """The ``seed`` weights: w = softmax(score / mix_temperature) over the matching orders.

    Plain floats, m <= 10 orders, highest order first (as every list here). Unset (None)
    weights take the built-in defaults (the drafter fills them before, see Drafter.resolve).
    """
    params = params.with_defaults()  # self when every weight is set
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


def witten_bell_weights(
    totals: list[float], types: list[int], escape_weight: float = 1.0
) -> list[float]:
    """The ``witten-bell`` weights from C_o (totals) and T_o (types), highest order first.

    w_j = lambda_j * (mass the higher orders left), lambda_j = C_j / (C_j + b T_j) with
    b = escape_weight; the lowest matching order takes all that is left (lambda = 1), so the
    weights sum to 1.
    """
    weights: list[float] = []
    left = 1.0  # prod over the higher orders of (1 - lambda)
    for c, t in zip(totals[:-1], types[:-1], strict=True):
        trust = c / (c + escape_weight * t)
        weights.append(left * trust)
        left *= 1.0 - trust
    weights.append(left)
    return weights


def mixture_weights(
    orders: list[int], counts: np.ndarray, lens: list[int], starts: list[int], params: DraftParams
) -> tuple[list[float], list[float]]:
    """(w [m], C [m]) for m >= 2 matching orders under params.effective_mixing.

    counts [N] float64 is the concatenation of the orders' counts, order i at
    counts[starts[i] : starts[i] + lens[i]]. Mixing parameters are set (see Drafter.resolve).
    """
    totals = np.add.reduceat(counts, starts).tolist()  # [m] C_o
    mode = params.effective_mixing
    if mode == "witten-bell":
        return witten_bell_weights(totals, lens, params.escape_weight), totals
    if mode == "backoff":
        return [1.0] + [0.0] * (len(orders) - 1), totals
    if params.entropy_penalty:
        clogc = np.add.reduceat(counts * np.log(counts), starts).tolist()  # [m] sum c ln c
        entropies = [math.log(t) - s / t for t, s in zip(totals, clogc, strict=True)]
    else:
        entropies = [0.0] * len(orders)
    return order_weights(orders, totals, entropies, params), totals


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
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """(ids [N], rep [N], mass [<=N], total) for m >= 2 matching orders.

        ids is the concatenation of ids_list (an id may repeat across orders); rep[i] is the
        representative position of ids[i]'s id; mass[r] = q(ids[r]) at representative positions
        r and 0 elsewhere (unnormalised only by rounding); total is the sum of the weights
        (the mass's sum, 1 up to rounding).
        """
        lens = [a.size for a in counts_list]
        starts = [0, *accumulate(lens[:-1])]
        c = np.concatenate(counts_list, dtype=np.float64)  # [N] counts
        w, totals = mixture_weights(orders, c, lens, starts, params)
        scale = np.array([wo / t for wo, t in zip(w, totals, strict=True)])  # [m] w_o / C_o
        weighted = c * scale.repeat(lens)  # [N] w_o * P_o(id)
        ids = np.concatenate(ids_list)  # [N]
        rep = self._slot(ids, self._positions(ids.size))
        mass = np.bincount(rep, weights=weighted)
        return ids, rep, mass, sum(w)

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
        ids, rep, mass, _ = self.accumulate(orders, ids_list, counts_list, params)
        winners = np.flatnonzero(rep == self._positions(ids.size))  # [U] one entry per id
        q = mass[winners]
        q /= q.sum()
        return ids[winners], q

    def top(
        self,
        orders: list[int],
        ids_list: list[np.ndarray],
        counts_list: list[np.ndarray],
        params: DraftParams,
        count: int,
    ) -> list[tuple[int, float]]:
        """The `count` likeliest ids under q with their q, q descending then id ascending (what
        sorting :meth:`mix`'s output gives), without materialising the union."""
        if len(orders) == 1:
            ids, mass = ids_list[0], counts_list[0].astype(np.float64)  # [n] each
            total = float(mass.sum())
        else:  # divided by the weights' sum, as the compiled drafts (greedy_kernels) divide
            ids, _, mass, total = self.accumulate(orders, ids_list, counts_list, params)
            ids = ids[: mass.size]  # mass[r] > 0 only at representative positions r
        if mass.size > count:
            cut = np.partition(mass, mass.size - count)[mass.size - count]  # count-th largest
            candidates = np.flatnonzero(mass >= cut)  # [>= count]: ties at the cut included
        else:
            candidates = np.flatnonzero(mass)
        best = candidates[np.lexsort((ids[candidates], -mass[candidates]))[:count]]
        best = best[mass[best] > 0]
        # float64 division as float(mass[r]) / total would do it, element by element
        return list(zip(ids[best].tolist(), (mass[best] / total).tolist(), strict=True))

    def argmax(
        self,
        orders: list[int],
        ids_list: list[np.ndarray],
        counts_list: list[np.ndarray],
        params: DraftParams,
        with_prob: bool = True,
    ) -> tuple[int, float]:
        """(argmax q, its probability q(argmax)) without materialising the union.

        Ties go to the lowest token id; the probability is exact up to rounding (the mixture's
        mass sums to 1 up to rounding). with_prob=False skips the one sum a single order would
        need for it and returns NaN instead.
        """
        if len(orders) == 1:
            counts = counts_list[0]  # successors are sorted by count desc, then id asc
            prob = float(counts[0]) / float(counts.sum()) if with_prob else math.nan
            return int(ids_list[0][0]), prob
        ids, _, mass, _ = self.accumulate(orders, ids_list, counts_list, params)
        top = np.maximum.reduce(mass)
        return int(ids[: mass.size][mass == top].min()), float(top)
