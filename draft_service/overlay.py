"""Context overlay: n-gram successor counts of one request's own context, combined with the graph.

Terms. The *context* is the request's prompt plus the tokens generated so far (what the
coordinator sends when ``overlay_weight`` > 0); draft tokens are not part of it. For a tail t
(the last <= max_order tokens of context + draft so far) and an order o, the context's successor
counts are

    c_ctx,o(x) = #{ positions i of the context : context[i-o:i] == t[-o:] and context[i] == x }

(an occurrence needs a successor inside the context, so the context's own end never counts).

The rule (one for every mixing mode). With w = overlay_weight, at each order o

    c_o(x) = c_graph,o(x) + w * c_ctx,o(x)

and an order *matches* when either source has a successor there. The selected mixing (seed,
backoff or witten-bell; :mod:`draft_service.mixing`) then runs on these combined counts exactly
as on graph counts: C_o = sum c_o, T_o = number of distinct x with c_o(x) > 0, P_o = c_o / C_o.
So a context seen only in this request (a character's unusual name) matches at high orders and,
with witten-bell, keeps C_o / (C_o + b T_o) of the mass there; w = 0 is the graph alone.

Index: :class:`ContextIndex` links each context position to the previous one holding the same
token, so the successors of a tail are found by visiting the earlier occurrences of its last
token and following each back as far as it matches (up to max_order): O(occurrences x max_order)
per draft position, with no key built per n-gram. It is built incrementally: each round of a
request only indexes the tokens added since its last round, as :class:`ContextIndexCache` finds
the index of the previous round again by content (an index whose context is a prefix of the new
one); O(1) per new context token, 12 bytes a token, at most ``capacity`` indexes per drafter.
"""

from __future__ import annotations

import threading

import numba
import numpy as np

from speculant.graph_format import KEY_DTYPE

# Context tokens the cache of one drafter keeps indexed, in all.
MAX_CACHED_TOKENS = 131_072


class Combined:
    """The combined counts of the matching orders, highest order first (each order's ids
    distinct), and which source listed which successors (for :meth:`source_of`)."""

    __slots__ = ("_graph_ids", "_overlay_ids", "_overlay_set", "counts", "ids", "orders")

    def __init__(
        self,
        orders: list[int],
        ids: list[np.ndarray],
        counts: list[np.ndarray],
        graph_ids: list[np.ndarray],
        overlay_ids: list[np.ndarray],
    ) -> None:
        self.orders = orders
        self.ids = ids
        self.counts = counts
        self._graph_ids = graph_ids
        self._overlay_ids = overlay_ids
        self._overlay_set: set[int] | None = None  # the overlay's successors, made on demand

    def source_of(self, token: int) -> str:
        """ "graph", "overlay" or "both": which sources list token as a successor at one of the
        orders q was mixed from (where its probability mass came from). A token q gives mass
        to is listed by one of them at least, so one the overlay does not list is the graph's."""
        if self._overlay_set is None:  # the context's few successors: a set, once
            self._overlay_set = {x for ids in self._overlay_ids for x in ids.tolist()}
        if token not in self._overlay_set:
            return "graph"
        in_graph = any(bool((ids == token).any()) for ids in self._graph_ids)
        return "both" if in_graph else "overlay"


Extra = tuple[tuple[int, np.ndarray, np.ndarray], ...]  # ((order, ids [u], counts [u]), ...)


def as_arrays(found: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]) -> Extra:
    """ContextIndex.successors' tuples as (order, ids int64 [u], counts float64 [u]) arrays."""
    return tuple(
        (
            order,
            np.array([x for x, _ in items], dtype=np.int64),
            np.array([c for _, c in items], dtype=np.float64),
        )
        for order, items in found
    )


def combine(
    graph_orders: list[int],
    graph_ids: list[np.ndarray],
    graph_counts: list[np.ndarray],
    extra: Extra,
    weight: float,
    every_order: bool,
) -> Combined:
    """The counts c_graph,o + weight * c_extra,o (float64) of every matching order.

    every_order=False keeps only the highest matching order (backoff). Both inputs are highest
    order first; each order's ids are distinct in either. An order only one of them has keeps
    its own ids; where both list successors, see :func:`merge_order` (ids not sorted).
    """
    by_order: dict[int, list] = {}
    for o, ids, counts in zip(graph_orders, graph_ids, graph_counts, strict=True):
        by_order[o] = [ids, counts, None, None]
    for o, ids, counts in extra:
        entry = by_order.setdefault(o, [None, None, None, None])
        entry[2], entry[3] = ids, counts
    orders = sorted(by_order, reverse=True)
    if not every_order:
        orders = orders[:1]
    out_ids: list[np.ndarray] = []
    out_counts: list[np.ndarray] = []
    from_graph: list[np.ndarray] = []
    from_extra: list[np.ndarray] = []
    for o in orders:
        g_ids, g_counts, e_ids, e_counts = by_order[o]
        if e_ids is None:
            from_graph.append(g_ids)
            out_ids.append(g_ids)
            out_counts.append(g_counts.astype(np.float64))
            continue
        from_extra.append(e_ids)
        if g_ids is None:
            out_ids.append(e_ids)
            out_counts.append(e_counts * weight)
            continue
        from_graph.append(g_ids)
        ids, counts = merge_order(g_ids, g_counts, e_ids, e_counts, weight)
        out_ids.append(ids)
        out_counts.append(counts)
    return Combined(orders, out_ids, out_counts, from_graph, from_extra)


# merge_order compares every extra id with every graph id up to this many pairs; beyond, it
# sorts the union instead (O(n log n)).
PAIRWISE_LIMIT = 16_384


def merge_order(
    g_ids: np.ndarray,
    g_counts: np.ndarray,
    e_ids: np.ndarray,
    e_counts: np.ndarray,
    weight: float,
) -> tuple[np.ndarray, np.ndarray]:
    """(ids [U], counts [U] float64): the union of one order's graph successors g ([T] each)
    and extra successors e ([u] each), with counts g + weight * e (0 where one has none).

    The extra side is small (a request's own context, a live layer's few successors): the ids
    of e compared with those of g pairwise ([u, T]) give the graph's ids in their order, then
    the extra ids the graph lacks; a large pair (u * T > PAIRWISE_LIMIT) takes a sorted union.
    Either way each count is the same sum, g + weight * e, in the same float64 operations.
    """
    if e_ids.size * g_ids.size > PAIRWISE_LIMIT:
        ids = np.concatenate([g_ids.astype(np.int64), e_ids])  # [T + u]
        counts = np.concatenate([g_counts.astype(np.float64), e_counts * weight])  # [T + u]
        union, where = np.unique(ids, return_inverse=True)  # [U], [T + u]
        return union, np.bincount(where, weights=counts, minlength=union.size)
    same = e_ids[:, None] == g_ids[None, :]  # [u, T]
    listed = same.any(axis=1)  # [u] e's ids the graph lists too
    counts = g_counts.astype(np.float64)  # [T] a copy
    counts[same[listed].argmax(axis=1)] += e_counts[listed] * weight  # e's ids are distinct
    new = ~listed
    if not new.any():
        return g_ids, counts
    ids = np.concatenate([g_ids.astype(np.int64), e_ids[new]])  # [U]
    return ids, np.concatenate([counts, e_counts[new] * weight])  # [U]


class ContextIndex:
    """The overlay's index of one context, kept up to date as the context grows: for each
    position, the previous position holding the same token (-1: none), and each token's last
    position. The successors of a tail are those of the earlier occurrences of its last token
    (each followed back as far as it matches the tail, up to max_order): the compiled drafts
    (:mod:`draft_service.greedy_kernels`) read them directly, :meth:`successors` as counts.
    Appending a token is O(1); an index costs 12 bytes a token, plus 4 a vocabulary id up to
    the largest one seen. Not thread-safe: one caller at a time (:class:`ContextIndexCache`
    hands it out).
    """

    __slots__ = ("_last", "_prev", "_tokens", "length", "max_order", "packed")

    def __init__(self, max_order: int) -> None:
        self.max_order = max_order
        self.packed = b""  # the context so far, 4 bytes per token (big-endian, like the keys)
        self.length = 0
        self._tokens = np.zeros(64, np.int64)  # [capacity] the context
        self._prev = np.full(64, -1, np.int32)  # [capacity] the previous position of its token
        self._last = np.full(0, -1, np.int32)  # [largest id + 1] each token's last position

    def extend(self, packed_tokens: bytes) -> None:
        """Append tokens (packed like the keys) to the context and index them."""
        if not packed_tokens:
            return
        tokens = np.frombuffer(packed_tokens, dtype=KEY_DTYPE).astype(np.int64)  # [n]
        need = self.length + tokens.size
        if need > self._tokens.size:
            grow = max(need, 2 * self._tokens.size) - self._tokens.size
            self._tokens = np.concatenate([self._tokens, np.zeros(grow, np.int64)])
            self._prev = np.concatenate([self._prev, np.full(grow, -1, np.int32)])
        top = int(tokens.max())
        if top >= self._last.size:
            last = np.full(max(top + 1, 2 * self._last.size), -1, np.int32)
            last[: self._last.size] = self._last
            self._last = last
        _append(self._tokens, self._prev, self._last, self.length, tokens)
        self.packed += packed_tokens
        self.length = need

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(context [capacity], previous positions [capacity], last positions, length): what
        the compiled drafts read."""
        return self._tokens, self._prev, self._last, self.length

    def successors(self, tail: bytes) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
        """((order, ((successor id, count), ...)), ...) for the orders whose last `order` tail
        tokens occur in the context with a successor, highest order first, ids ascending
        within an order; () when none does. Hashable (it keys the drafter's step caches).

        tail: the last <= max_order tokens, packed like the keys (big-endian uint32).
        """
        ids = np.frombuffer(tail, dtype=KEY_DTYPE).astype(np.int64)
        orders, successors, counts, bounds = context_successors(*self.arrays(), ids, self.max_order)
        successors, counts, cut = successors.tolist(), counts.tolist(), bounds.tolist()
        return tuple(
            (order, tuple(zip(successors[a:b], counts[a:b], strict=True)))
            for order, a, b in zip(orders.tolist(), cut, cut[1:], strict=False)
        )


@numba.njit(cache=True, nogil=True)
def _append(tokens, prev, last, length, new):
    """Index the tokens `new` at positions length, length + 1, ... (capacity reserved)."""
    for i in range(new.shape[0]):
        token = new[i]
        at = length + i
        tokens[at] = token
        prev[at] = last[token]
        last[token] = at


@numba.njit(cache=True, nogil=True)
def overlay_matches(ctx, prev, last, n_ctx, tail, tail_len, max_order, succ, lengths):
    """The earlier occurrences of the last token of tail[:tail_len] in the context
    ctx[:n_ctx] that have a successor there, latest first: succ[i] its successor, lengths[i]
    how many tail tokens it matches backwards (1..max_order). Returns how many."""
    if n_ctx < 2 or tail_len == 0:
        return 0
    token = tail[tail_len - 1]
    if token >= last.shape[0]:
        return 0
    found = 0
    top = min(max_order, tail_len)
    j = np.int64(last[token])
    while j >= 0:
        if j + 1 < n_ctx:
            length = 1
            while (
                length < top and j - length >= 0 and ctx[j - length] == tail[tail_len - 1 - length]
            ):
                length += 1
            succ[found] = ctx[j + 1]
            lengths[found] = length
            found += 1
        j = np.int64(prev[j])
    return found


@numba.njit(cache=True, nogil=True)
def context_successors(ctx, prev, last, n_ctx, tail, max_order):
    """The overlay's counts after tail: (orders [m] highest first, ids [s], counts [s], bounds
    [m + 1]), order orders[j]'s successors at bounds[j]:bounds[j + 1], ids ascending."""
    succ = np.empty(max(n_ctx, 1), np.int64)
    lengths = np.empty(max(n_ctx, 1), np.int64)
    n = overlay_matches(ctx, prev, last, n_ctx, tail, tail.shape[0], max_order, succ, lengths)
    top = 0
    for i in range(n):
        top = max(top, lengths[i])
    orders = np.empty(top, np.int64)
    bounds = np.zeros(top + 1, np.int64)
    ids = np.empty(n * top, np.int64)
    counts = np.empty(n * top, np.int64)
    at = 0
    for j in range(top):
        order = top - j
        orders[j] = order
        bounds[j] = at
        picked = np.sort(succ[:n][lengths[:n] >= order])
        for i in range(picked.shape[0]):
            if at > bounds[j] and ids[at - 1] == picked[i]:
                counts[at - 1] += 1
            else:
                ids[at] = picked[i]
                counts[at] = 1
                at += 1
    bounds[top] = at
    return orders, ids[:at], counts[:at], bounds


class ContextIndexCache:
    """Context indexes of recent requests, found again by content, so that each round of a
    request only counts the tokens added since its last round.

    A request's context only grows between rounds, so an index whose context is a prefix of
    the new one is extended instead of rebuilt. :meth:`checkout` takes the index with the
    longest such prefix out of the cache (so no two callers ever hold the same index) and
    :meth:`checkin` puts it back. Bounded: at most ``capacity`` indexes, the least recently
    returned dropped first (finding one compares the new context with each, a memcmp of the
    shorter), and at most ``max_tokens`` context tokens in all (one longer than max_tokens is
    not kept). An
    index's counts are a function of its tokens alone, so whichever index is reused, the counts
    are those of the new context.
    """

    def __init__(
        self, max_order: int, capacity: int = 64, max_tokens: int = MAX_CACHED_TOKENS
    ) -> None:
        self.max_order = max_order
        self.capacity = capacity
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._indexes: list[ContextIndex] = []  # least recently returned first

    def __len__(self) -> int:
        return len(self._indexes)

    def checkout(self, packed_context: bytes) -> ContextIndex:
        """An index of exactly packed_context (reused and extended, or new); give it back with
        :meth:`checkin`."""
        best = None
        with self._lock:
            fits = [i for i, x in enumerate(self._indexes) if packed_context.startswith(x.packed)]
            if fits:
                best = self._indexes.pop(max(fits, key=lambda i: self._indexes[i].length))
        if best is None:
            best = ContextIndex(self.max_order)
        best.extend(packed_context[len(best.packed) :])
        return best

    def checkin(self, index: ContextIndex) -> None:
        """Return an index taken with :meth:`checkout` (it may serve the next round)."""
        with self._lock:
            self._indexes.append(index)
            del self._indexes[: max(0, len(self._indexes) - self.capacity)]
            held = sum(x.length for x in self._indexes)
            while self._indexes and held > self.max_tokens:
                held -= self._indexes.pop(0).length

    @property
    def tokens(self) -> int:
        """Context tokens held by the cached indexes."""
        with self._lock:
            return sum(x.length for x in self._indexes)
