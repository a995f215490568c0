"""The drafting core: draft tokens from an n-gram graph (a plain library, no gRPC).

Terms:
- *backoff*: at each draft position, look up the last n tokens of the context for
  n = max_order down to 1 (one LMDB get per order) and draft from the highest order that matches;
  after each drafted token the context grows by it and is matched again.
- *matched order*: the highest order whose context matched at a position.
- *dead end*: no order matches; drafting stops there and the draft is partial (possibly empty).
- *q*: the distribution the drafted token was drawn from. With attentive mixing (the default), the
  mix of every matching order's successor distribution (see :mod:`draft_service.mixing`); without,
  the successor distribution of the matched order alone. ``greedy`` drafts argmax q (ties: lowest
  token id), and the q it reports is then a point mass at that token, since that is the
  distribution it was drawn from; ``sampling`` draws from q with a numpy Generator and reports q.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Sequence

import lmdb
import numpy as np

from draft_service.graph import NGramGraph
from draft_service.mixing import Mixer
from speculant.errors import InvalidArgumentError
from speculant.types import DraftParams, DraftProposal, SparseDistribution

_U32 = np.dtype("<u4")
_PACK_ONE = struct.Struct(">I").pack
_DEAD_END = (-1, 0)
DEFAULT_CACHE_SIZE = 32768  # greedy steps kept (a few MB at most)


class Drafter:
    """Proposes up to k draft tokens continuing a context, from one opened graph (thread-safe)."""

    def __init__(self, graph: NGramGraph, *, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        self.graph = graph
        self.max_order = graph.max_order
        self.vocab_size = graph.vocab_size
        self._mixer = Mixer(graph.vocab_size)
        # Greedy steps depend only on the last max_order tokens and the mixing parameters, and
        # consecutive rounds of one generation revisit them: a bounded cache (FIFO eviction) of
        # (tail, mixing parameters) -> (token, matched order), or _DEAD_END.
        self.cache_size = cache_size
        self._greedy_cache: dict[tuple, tuple[int, int]] = {}

    def validate_context(self, context_ids: Sequence[int] | np.ndarray) -> None:
        """InvalidArgumentError naming ``context_token_ids`` unless every id is in [0, vocab)."""
        if len(context_ids) == 0:
            return
        if isinstance(context_ids, np.ndarray):
            if context_ids.dtype.kind not in "iu":
                raise InvalidArgumentError(
                    "context_token_ids", f"must be integers, got dtype {context_ids.dtype}"
                )
            low, high = int(context_ids.min()), int(context_ids.max())
        else:
            low, high = min(context_ids), max(context_ids)
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise InvalidArgumentError(
                "context_token_ids",
                f"token id {bad} is outside the graph's vocabulary [0, {self.vocab_size})",
            )

    def propose(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        seed: int | None = None,
    ) -> DraftProposal:
        """Up to params.k draft tokens continuing context_ids, each with its q and matched order.

        seed only affects the sampling strategy (None: nondeterministic).
        """
        params.validate()
        self.validate_context(context_ids)
        if seed is not None and seed < 0:
            raise InvalidArgumentError("seed", f"must be >= 0, got {seed}")
        max_order = self.max_order
        tail_ids = [int(t) for t in context_ids[max(0, len(context_ids) - max_order) :]]
        tail = struct.pack(f">{len(tail_ids)}I", *tail_ids)  # last <= max_order ids, big-endian
        txn, dbs = self.graph.raw_lookup()
        mix = params.attentive_mix
        greedy = params.strategy == "greedy"
        rng = None if greedy else np.random.default_rng(seed)
        proposal = DraftProposal()
        cache = self._greedy_cache if greedy and self.cache_size > 0 else None
        mix_key = _mix_key(params)
        for _ in range(params.k):
            if greedy:
                step = cache.get((tail, mix_key)) if cache is not None else None
                if step is None:
                    step = self._greedy_step(tail, txn, dbs, params)
                    if cache is not None:
                        self._remember((tail, mix_key), step)
                token, order = step
                if order == 0:
                    break  # dead end: a partial (possibly empty) draft
                dist = SparseDistribution.point_mass(token)
            else:
                orders, values = _match(tail, txn, dbs, mix)
                if not orders:
                    break
                ids, q = self._mixer.mix(orders, *_decode(values), params)
                token, dist = _sample(ids, q, rng)
                order = orders[0]
            proposal.token_ids.append(token)
            proposal.distributions.append(dist)
            proposal.matched_orders.append(order)
            tail = (tail + _PACK_ONE(token))[-4 * max_order :]
        return proposal

    def _greedy_step(
        self, tail: bytes, txn: lmdb.Transaction, dbs: list, params: DraftParams
    ) -> tuple[int, int]:
        """(argmax q, matched order) after tail; (-1, 0) at a dead end."""
        orders, values = _match(tail, txn, dbs, params.attentive_mix)
        if not orders:
            return _DEAD_END
        return self._mixer.argmax(orders, *_decode(values), params), orders[0]

    def _remember(self, key: tuple, step: tuple[int, int]) -> None:
        """Insert into the greedy cache, evicting the oldest entry beyond cache_size."""
        cache = self._greedy_cache
        if len(cache) >= self.cache_size:
            # Concurrent evictions may race; losing one is harmless (the bound is approximate).
            with contextlib.suppress(KeyError, RuntimeError, StopIteration):
                del cache[next(iter(cache))]
        cache[key] = step

    def next_distribution(
        self, context_ids: Sequence[int], params: DraftParams
    ) -> tuple[SparseDistribution, int] | None:
        """(q, matched order) for the next token after context_ids, or None at a dead end.

        q here is the mixed (or highest-order) distribution itself, whatever the strategy.
        """
        params.validate()
        self.validate_context(context_ids)
        tail_ids = [int(t) for t in list(context_ids)[-self.max_order :]]
        txn, dbs = self.graph.raw_lookup()
        orders, values = _match(
            struct.pack(f">{len(tail_ids)}I", *tail_ids), txn, dbs, params.attentive_mix
        )
        if not orders:
            return None
        ids, q = self._mixer.mix(orders, *_decode(values), params)
        return SparseDistribution(ids.astype(np.int64), q), orders[0]


def _mix_key(params: DraftParams) -> tuple:
    """The parameters a greedy step depends on (besides the context tail)."""
    if not params.attentive_mix:
        return (False,)
    p = params
    return (True, p.order_bias, p.reliability_weight, p.entropy_penalty, p.mix_temperature)


def _match(
    tail: bytes, txn: lmdb.Transaction, dbs: list, every_order: bool
) -> tuple[list[int], list[memoryview]]:
    """Backoff lookup: (matching orders, their LMDB values), highest order first.

    tail holds the last <= max_order context ids as big-endian uint32 (an order-o key is its
    last 4*o bytes); every_order=False stops at the highest match.
    """
    orders: list[int] = []
    values: list[memoryview] = []
    get = txn.get
    for order in range(len(tail) >> 2, 0, -1):
        value = get(tail[-4 * order :], db=dbs[order])
        if value is not None:
            orders.append(order)
            values.append(value)
            if not every_order:
                break
    return orders, values


def _decode(values: list[memoryview]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Zero-copy views (successor ids [n] uint32, counts [n] uint32) of each LMDB value."""
    ids_list: list[np.ndarray] = []
    counts_list: list[np.ndarray] = []
    for value in values:
        flat = np.frombuffer(value, dtype=_U32)  # [2n]: n ids, then n counts
        n = flat.size >> 1
        ids_list.append(flat[:n])
        counts_list.append(flat[n:])
    return ids_list, counts_list


def _sample(
    ids: np.ndarray, q: np.ndarray, rng: np.random.Generator
) -> tuple[int, SparseDistribution]:
    """Draw one id from q by inverse CDF; return it and q (ids with q == 0 dropped)."""
    if not q.all():  # an order whose softmax weight underflowed contributes nothing
        keep = q > 0
        ids, q = ids[keep], q[keep]
    cdf = np.cumsum(q)
    index = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    index = min(index, q.size - 1)
    return int(ids[index]), SparseDistribution(ids.astype(np.int64), q)
