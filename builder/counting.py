"""Exact n-gram counting of a document stream, chunk by chunk, into sorted partial counts.

Terms: an *n-gram of order o* is a context of o tokens plus the token that follows it (o + 1
tokens), all inside one document. A *window start* is the position of an n-gram's first token.
A *chunk* gathers about ``chunk_tokens`` window starts; a document longer than that is split
into *segments*, each owning a disjoint range of window starts and carrying ``max_order`` extra
tokens of look-ahead, so every n-gram is counted exactly once (by the chunk owning its start)
and none crosses a document boundary.

Each chunk is counted with numpy (sliding windows over the concatenated segments, windows that
would run past their segment's end masked out), giving per order sorted unique keys with counts
that go to a :class:`~builder.runs.RunStore`.
"""

from __future__ import annotations

import numpy as np

from builder.keys import KeyCodec, group_starts
from builder.runs import RunStore


class NgramCounter:
    """Counts the n-grams of orders 1..max_order of documents given one by one."""

    def __init__(self, max_order: int, bits: int, chunk_tokens: int, store: RunStore) -> None:
        self.max_order = max_order
        self.codecs = [KeyCodec(bits, o + 1) for o in range(1, max_order + 1)]
        self.chunk_tokens = max(1, chunk_tokens)
        self.store = store
        self._segments: list[tuple[np.ndarray, int]] = []  # (tokens [n] uint32, window starts)
        self._starts = 0  # window starts buffered in _segments

    def add_document(self, ids: np.ndarray) -> None:
        """Count the n-grams of one document (``[n] uint32`` token ids)."""
        total = ids.size - 1  # window starts with at least one successor
        pos = 0
        while pos < total:
            take = min(self.chunk_tokens - self._starts, total - pos)
            self._segments.append((ids[pos : pos + take + self.max_order], take))
            self._starts += take
            pos += take
            if self._starts >= self.chunk_tokens:
                self.flush()

    def flush(self) -> None:
        """Count the buffered chunk and hand its per-order counts to the store."""
        if not self._segments:
            return
        lengths = np.array([seg.size for seg, _ in self._segments], dtype=np.int64)  # [s]
        owned = np.array([n for _, n in self._segments], dtype=np.int64)  # [s]
        tokens = np.concatenate([seg for seg, _ in self._segments])  # [n] uint32
        self._segments, self._starts = [], 0
        seg_begin = np.cumsum(lengths) - lengths  # [s]
        pos = np.arange(tokens.size, dtype=np.int64)  # [n]
        local = pos - np.repeat(seg_begin, lengths)  # [n] position inside the segment
        room = np.repeat(lengths, lengths) - local - 1  # [n] tokens after pos in its segment
        owns = local < np.repeat(owned, lengths)  # [n] window start owned by this chunk
        for order, codec in enumerate(self.codecs, start=1):
            starts = np.flatnonzero(owns & (room >= order))  # [m] window starts of this order
            if starts.size == 0:
                continue
            keys = codec.pack_windows(tokens, starts)  # [m, words] uint64
            if keys.shape[1] == 1:
                keys = np.sort(keys[:, 0]).reshape(-1, 1)
            else:
                keys = keys[np.lexsort(keys.T[::-1])]
            first = group_starts(keys)  # [u]
            counts = np.diff(np.append(first, keys.shape[0])).astype(np.uint64)  # [u]
            self.store.add(order, keys[first], counts)
