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

Index: :class:`ContextIndex` keeps c_ctx,o for every n-gram of the context in a dict keyed like
the graph (big-endian uint32 ids), so a draft position costs one dict lookup per order instead of
a search of the context. It is built incrementally: each round of a request only counts the
tokens added since its last round, as :class:`ContextIndexCache` finds the index of the previous
round again by content (an index whose context is a prefix of the new one). Cost: O(max_order)
per new context token and per draft position; memory O(n * max_order) per cached index (n =
context length), at most ``capacity`` indexes per drafter.
"""

from __future__ import annotations

import threading

import numpy as np

from speculant.graph_format import KEY_DTYPE

# Context tokens the cache of one drafter keeps indexed, in all (about 200 MB at most).
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
    """The successor counts of one context's n-grams, kept up to date as the context grows.

    When token i is appended, it is counted as the successor of the n-grams ending at token
    i - 1 (orders 1..max_order), so an index of n tokens holds at most n * max_order
    keys. Keys are the n-grams packed as
    big-endian uint32, the graph's key layout, so a drafter's packed tail is looked up as is.
    Not thread-safe: one caller at a time (:class:`ContextIndexCache` hands it out).
    """

    __slots__ = ("_counts", "_frozen", "length", "max_order", "packed")

    def __init__(self, max_order: int) -> None:
        self.max_order = max_order
        self.packed = b""  # the context so far, 4 bytes per token
        self.length = 0
        self._counts: dict[bytes, dict[int, int]] = {}  # n-gram -> {successor: count}
        self._frozen: dict[bytes, tuple[tuple[int, int], ...]] = {}  # sorted items, on demand

    def extend(self, packed_tokens: bytes) -> None:
        """Append tokens (packed like the keys) to the context and count them."""
        if not packed_tokens:
            return
        data = self.packed + packed_tokens
        tokens = np.frombuffer(packed_tokens, dtype=KEY_DTYPE).tolist()
        counts, frozen, top = self._counts, self._frozen, self.max_order
        for offset, token in enumerate(tokens):
            i = self.length + offset  # token i follows the n-grams ending at token i - 1
            for order in range(1, min(top, i) + 1):
                key = data[4 * (i - order) : 4 * i]
                successors = counts.get(key)
                if successors is None:
                    counts[key] = {token: 1}
                else:
                    successors[token] = successors.get(token, 0) + 1
                    frozen.pop(key, None)
        self.packed = data
        self.length += len(tokens)

    def successors(self, tail: bytes) -> tuple[tuple[int, tuple[tuple[int, int], ...]], ...]:
        """((order, ((successor id, count), ...)), ...) for the orders whose last `order` tail
        tokens occur in the context with a successor, highest order first, ids ascending
        within an order; () when none does. Hashable (it keys the drafter's step caches).

        tail: the last <= max_order tokens, packed like the keys (big-endian uint32).
        """
        found = []
        for order in range(min(len(tail) >> 2, self.max_order), 0, -1):
            key = tail[-4 * order :]
            items = self._frozen.get(key)
            if items is None:
                successors = self._counts.get(key)
                if successors is None:
                    continue  # a longer n-gram never matches where a shorter one does not
                items = self._frozen[key] = tuple(sorted(successors.items()))
            found.append((order, items))
        return tuple(found)


class ContextIndexCache:
    """Context indexes of recent requests, found again by content, so that each round of a
    request only counts the tokens added since its last round.

    A request's context only grows between rounds, so an index whose context is a prefix of
    the new one is extended instead of rebuilt. :meth:`checkout` takes the index with the
    longest such prefix out of the cache (so no two callers ever hold the same index) and
    :meth:`checkin` puts it back. Bounded: at most ``capacity`` indexes, the least recently
    returned dropped first (finding one compares the new context with each, a memcmp of the
    shorter), and at most ``max_tokens`` context tokens in all (an index costs about 1.3-1.6
    KB per token, measured on random contexts; one longer than max_tokens is not kept). An
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
