"""The live layer: n-gram counts a draft service learns from the generations it helps to serve.

Terms. A *learned document* is one finished generation's tokens, its prompt and its output, as a
gateway reports them (``DraftService/Learn``). The layer counts the n-grams of orders
1..max_order of every learned document exactly as the builder counts a corpus document
(c_live,o(x) = the number of times the order-o context was followed by x), keyed like the graph
(context ids packed as big-endian uint32), so a drafter combines them with the graph's counts:

    c_o(x) = c_graph,o(x) + weight * c_live,o(x)

(see :mod:`draft_service.overlay`, whose rule this is; ``weight`` is the layer's). A drafter
asks :meth:`LiveLayer.successors` for a tail's counts: one dict lookup per order.

Bounded: the layer estimates its memory (:meth:`LiveLayer.estimated_bytes`: its documents, its
keys, its (context, successor) pairs and its published tuples, at costs measured with
tracemalloc, see KEY_BYTES and PAIR_BYTES) and forgets its oldest documents (subtracts their
counts) while the estimate is over ``max_bytes``. Thread-safe: learning takes a lock; lookups
read published tuples and take the lock only to build one (dropping all of them first when that
would pass the cap).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from speculant.config import DEFAULT_LEARN_MEMORY_MB, DEFAULT_LEARN_WEIGHT
from speculant.graph_format import KEY_DTYPE, encode_context
from speculant.suffix_index import (
    ENTRIES_FILE,
    FIRST_FILE,
    FREQUENT_MIN,
    STREAM_FILE,
    TABLE_COUNTS_FILE,
    TABLE_IDS_FILE,
    TABLE_RANGES_FILE,
    TABLE_START_FILE,
    SuffixIndex,
    separator,
    stream_dtype,
)
from speculant.types import LiveStats

# Bytes of Python objects per context key (its bytes object, dict slots, the inner dict of
# successors) and per (context, successor) pair (a dict slot, the int objects), measured with
# tracemalloc on the counts of stories260K's continuations of tinystories prompts and of random
# token streams (32k vocabulary), rounded up: tests/test_live_layer.py checks that the estimate
# covers what tracemalloc sees.
KEY_BYTES = 320
PAIR_BYTES = 120
DOCUMENT_BYTES = 120  # a learned document's bytes object and deque slot, beyond 4 bytes a token
# A published entry: two numpy arrays (about 112 bytes each), its tuple and dict slot, and per
# successor 16 bytes of array data.
FROZEN_BYTES = 320
FROZEN_PAIR_BYTES = 16
DEFAULT_MAX_BYTES = DEFAULT_LEARN_MEMORY_MB << 20
DEFAULT_WEIGHT = DEFAULT_LEARN_WEIGHT
# The compiled drafts (draft_service.greedy_kernels) read a suffix index of the layer's
# documents, built again when the layer has changed, once the last build is old enough that
# building takes at most this share of a core: a small layer's drafts follow what it learns at
# once, a large one's (a build of 100k tokens takes about 0.1 s) within a few seconds.
INDEX_BUILD_SHARE = 0.05


class LayerIndex(NamedTuple):
    """A suffix index of the layer's documents (None: none kept), the layer's version it was
    built from, when (time.monotonic) and in how many seconds."""

    index: SuffixIndex | None
    version: int
    built_at: float
    seconds: float


Successors = tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # ((order, ((id, count),)),)


class LiveLayer:
    """Successor counts of learned documents, bounded by memory (see the module docstring)."""

    def __init__(
        self,
        max_order: int,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        weight: float = DEFAULT_WEIGHT,
        build_share: float = INDEX_BUILD_SHARE,
    ) -> None:
        if max_order < 1:
            raise ValueError(f"max_order must be >= 1, got {max_order}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if not 0 < weight < float("inf"):
            raise ValueError(f"weight must be a finite number > 0, got {weight}")
        self.max_order = max_order
        self.max_bytes = max_bytes
        self.weight = float(weight)
        self._lock = threading.Lock()
        self._counts: dict[bytes, dict[int, int]] = {}  # context -> {successor: count}
        # published successors, on demand: key -> (stamp, ids ascending, their counts)
        self._frozen: dict[bytes, tuple[int, np.ndarray, np.ndarray]] = {}
        self._stamp = 0
        self._documents: deque[bytes] = deque()  # packed tokens, oldest first
        self._tokens = 0
        self._pairs = 0
        self._frozen_bytes = 0
        self._learned = 0
        self._forgotten = 0
        self._version = 0  # changes with every document learned, forgotten or cleared
        self.build_share = build_share  # see INDEX_BUILD_SHARE (inf: build at every change)
        self._index: LayerIndex | None = None  # see compiled_index
        self._index_bytes = 0
        self._building = threading.Lock()

    # -- learning ----------------------------------------------------------------------------

    def learn(self, token_ids: Sequence[int] | np.ndarray) -> int:
        """Count one document's n-grams; forget the oldest documents while over the memory cap.
        Returns the tokens kept (a document that alone exceeds the cap keeps its last tokens;
        one shorter than two tokens has no n-gram and is not kept)."""
        packed = encode_context(token_ids)
        fits = (self.max_bytes - DOCUMENT_BYTES) // (4 + self.max_order * (KEY_BYTES + PAIR_BYTES))
        packed = packed[-4 * max(0, fits) :] if len(packed) > 4 * fits else packed
        if len(packed) < 8:
            return 0
        with self._lock:
            self._version += 1
            self._count(packed, +1)
            self._documents.append(packed)
            self._tokens += len(packed) >> 2
            self._learned += 1
            if self.estimated_bytes() > self.max_bytes:
                self._drop_frozen()
            while self._documents and self.estimated_bytes() > self.max_bytes:
                oldest = self._documents.popleft()
                self._count(oldest, -1)
                self._tokens -= len(oldest) >> 2
                self._forgotten += 1
        return len(packed) >> 2

    def _count(self, packed: bytes, delta: int) -> None:
        """Add (delta +1) or subtract (-1) one document's n-gram counts (lock held)."""
        counts, frozen, top = self._counts, self._frozen, self.max_order
        tokens = np.frombuffer(packed, dtype=KEY_DTYPE).tolist()
        for i in range(1, len(tokens)):  # token i follows the contexts ending at token i - 1
            successor = tokens[i]
            for order in range(1, min(top, i) + 1):
                key = packed[4 * (i - order) : 4 * i]
                stale = frozen.pop(key, None)
                if stale is not None:
                    self._frozen_bytes -= FROZEN_BYTES + FROZEN_PAIR_BYTES * stale[1].size
                successors = counts.get(key)
                if successors is None:
                    if delta > 0:
                        counts[key] = {successor: 1}
                        self._pairs += 1
                    continue
                count = successors.get(successor, 0) + delta
                if count > 0:
                    if count == 1 and delta > 0:
                        self._pairs += 1
                    successors[successor] = count
                else:
                    del successors[successor]
                    self._pairs -= 1
                    if not successors:
                        del counts[key]

    def _drop_frozen(self) -> None:
        """Drop every published tuple (lock held); lookups build them again."""
        self._frozen.clear()
        self._frozen_bytes = 0

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._version += 1
            self._counts.clear()
            self._drop_frozen()
            self._documents.clear()
            self._tokens = self._pairs = 0

    # -- reading -----------------------------------------------------------------------------

    def successors(self, tail: bytes) -> Successors:
        """((order, ((successor id, count), ...)), ...) for the orders whose last `order` tail
        tokens the layer has seen followed, highest order first, ids ascending; () when none.
        tail: packed like the keys."""
        return tuple(
            (order, tuple(zip(ids.tolist(), map(int, counts.tolist()), strict=True)))
            for order, ids, counts in self.lookup(tail)[0]
        )

    def lookup(
        self, tail: bytes
    ) -> tuple[tuple[tuple[int, np.ndarray, np.ndarray], ...], tuple[tuple[int, int], ...]]:
        """((order, successor ids int64 [u] ascending, counts float64 [u]), ...) for the orders
        whose last `order` tail tokens the layer has seen followed, highest order first, and
        their signature ((order, stamp), ...): a short key that equals another lookup's only
        when the counts are the same ones (each published entry gets a stamp of its own, and an
        entry is published again whenever its counts change), so a drafter's step caches can be
        keyed by it. The arrays are read-only and shared: do not modify them."""
        if not self._counts:
            return (), ()
        found = []
        signature = []
        for order in range(min(len(tail) >> 2, self.max_order), 0, -1):
            key = tail[-4 * order :]
            published = self._frozen.get(key)
            if published is None:
                if key not in self._counts:
                    continue
                published = self._publish(key)
                if published is None:
                    continue
            stamp, ids, counts = published
            found.append((order, ids, counts))
            signature.append((order, stamp))
        return tuple(found), tuple(signature)

    def _publish(self, key: bytes) -> tuple[int, np.ndarray, np.ndarray] | None:
        """Build (a new stamp, successor ids, counts) of a key, and keep it if it fits."""
        with self._lock:
            successors = self._counts.get(key)
            if successors is None:
                return None
            self._stamp += 1
            items = sorted(successors.items())
            ids = np.fromiter((x for x, _ in items), dtype=np.int64, count=len(items))
            counts = np.fromiter((c for _, c in items), dtype=np.float64, count=len(items))
            ids.flags.writeable = counts.flags.writeable = False
            published = (self._stamp, ids, counts)
            size = FROZEN_BYTES + FROZEN_PAIR_BYTES * len(items)
            if self.estimated_bytes() + size > self.max_bytes:
                self._drop_frozen()
            if self.estimated_bytes() + size <= self.max_bytes:  # else: not kept
                self._frozen[key] = published
                self._frozen_bytes += size
            return published

    # -- size --------------------------------------------------------------------------------

    def estimated_bytes(self) -> int:
        """The layer's memory, estimated (see the module docstring)."""
        return (
            4 * self._tokens
            + DOCUMENT_BYTES * len(self._documents)
            + KEY_BYTES * len(self._counts)
            + PAIR_BYTES * self._pairs
            + self._frozen_bytes
            + self._index_bytes
        )

    # -- the compiled drafts' index -----------------------------------------------------------

    def compiled_index(self, vocab_size: int) -> SuffixIndex | None:
        """A suffix index of the documents kept (speculant.suffix_index, what the compiled
        drafts read; None while none is kept), built again when the layer has changed and the
        last build is old enough (INDEX_BUILD_SHARE). While one thread builds, the others read
        the last build. Its bytes count towards the layer's memory (estimated_bytes)."""
        state = self._index
        if state is not None and (
            state.version == self._version
            or time.monotonic() - state.built_at < state.seconds / self.build_share
        ):
            return state.index
        if not self._building.acquire(blocking=state is None):
            return state.index if state is not None else None
        try:
            with self._lock:
                documents, version = list(self._documents), self._version
            started = time.monotonic()
            index = documents_index(documents, vocab_size) if documents else None
            done = time.monotonic()
            self._index = LayerIndex(index, version, done, done - started)
            self._index_bytes = 0 if index is None else sum(a.nbytes for a in index.arrays.values())
            return index
        finally:
            self._building.release()

    def documents(self) -> list[bytes]:
        """The learned documents kept, oldest first (packed big-endian uint32)."""
        with self._lock:
            return list(self._documents)

    def stats(self) -> LiveStats:
        with self._lock:
            return LiveStats(
                documents=len(self._documents),
                tokens=self._tokens,
                contexts=len(self._counts),
                pairs=self._pairs,
                estimated_bytes=self.estimated_bytes(),
                max_bytes=self.max_bytes,
                learned_documents=self._learned,
                forgotten_documents=self._forgotten,
            )


def documents_index(documents: list[bytes], vocab_size: int) -> SuffixIndex:
    """A suffix index of documents (packed big-endian uint32 ids), as the builder indexes a
    corpus (speculant.suffix_index): each document followed by SEP, every position with a
    successor in its document an entry, the ranges of at least FREQUENT_MIN entries tabled.
    Ids outside the vocabulary are dropped with their documents' tails (the graph's ids are
    all the drafts know). Its arrays are read-only, like a graph's."""
    from speculant.suffix_index import (
        common_prefixes,
        first_offsets,
        frequent_ranges,
        range_tables,
        sort_entries,
    )

    dtype = stream_dtype(vocab_size)
    sep = separator(dtype)
    pieces = []
    for packed in documents:
        ids = np.frombuffer(packed, dtype=KEY_DTYPE).astype(np.int64)
        outside = np.flatnonzero(ids >= vocab_size)
        pieces.append(ids[: outside[0]] if outside.size else ids)
    sizes = np.array([p.size for p in pieces], dtype=np.int64)
    stream = np.full(int(sizes.sum()) + len(pieces), sep, dtype=dtype)  # [N]
    starts = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]])
    for piece, start in zip(pieces, starts.tolist(), strict=True):
        stream[start : start + piece.size] = piece
    followed = np.zeros(stream.shape[0], dtype=bool)  # a token followed in its document
    followed[:-1] = (stream[:-1] != sep) & (stream[1:] != sep)
    entries = sort_entries(stream, sep, np.flatnonzero(followed))
    lcp = common_prefixes(stream, sep, entries)
    lo, hi = frequent_ranges(lcp, FREQUENT_MIN)
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    no_weights = np.empty(0, np.uint8)
    table_start, table_ids, table_counts = range_tables(
        stream, entries, no_weights, lo, hi, vocab_size
    )
    arrays = {
        STREAM_FILE: stream,
        ENTRIES_FILE: entries,
        FIRST_FILE: first_offsets(stream, entries, vocab_size),
        TABLE_RANGES_FILE: np.stack([lo, hi], axis=1).astype(np.uint32),
        TABLE_START_FILE: table_start.astype(np.uint64),
        TABLE_IDS_FILE: table_ids,
        TABLE_COUNTS_FILE: table_counts,
    }
    for array in arrays.values():
        array.flags.writeable = False
    index = SuffixIndex(arrays)
    index.frequent_min = FREQUENT_MIN
    return index
