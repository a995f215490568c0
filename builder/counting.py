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

    def __init__(
        self, max_order: int, bits: int, chunk_tokens: int, store: RunStore, weight: int = 1
    ) -> None:
        """weight: each occurrence counts this many times (distilled continuations)."""
        self.max_order = max_order
        self.weight = weight
        self.codecs = [KeyCodec(bits, o + 1) for o in range(1, max_order + 1)]
        self.chunk_tokens = max(1, chunk_tokens)
        self.store = store
        # (tokens [n] uint32, window starts owned, first successor position counted)
        self._segments: list[tuple[np.ndarray, int, int]] = []
        self._starts = 0  # window starts buffered in _segments

    def add_document(self, ids: np.ndarray, first_successor: int = 0) -> None:
        """Count the n-grams of one document (``[n] uint32`` token ids).

        first_successor: count only the n-grams whose successor (last token) is at this position
        or later; their contexts may start before it (a distilled continuation: its n-grams,
        with contexts reaching into the prompt it continues, not the prompt's own).
        """
        total = ids.size - 1  # window starts with at least one successor
        pos = max(0, first_successor - self.max_order)  # earlier windows end before it
        while pos < total:
            take = min(self.chunk_tokens - self._starts, total - pos)
            segment = ids[pos : pos + take + self.max_order]
            self._segments.append((segment, take, first_successor - pos))
            self._starts += take
            pos += take
            if self._starts >= self.chunk_tokens:
                self.flush()

    def flush(self) -> None:
        """Count the buffered chunk and hand its per-order counts to the store."""
        if not self._segments:
            return
        lengths = np.array([seg.size for seg, _, _ in self._segments], dtype=np.int64)  # [s]
        owned = np.array([n for _, n, _ in self._segments], dtype=np.int64)  # [s]
        first = np.array([f for _, _, f in self._segments], dtype=np.int64)  # [s]
        tokens = np.concatenate([seg for seg, _, _ in self._segments])  # [n] uint32
        self._segments, self._starts = [], 0
        seg_begin = np.cumsum(lengths) - lengths  # [s]
        pos = np.arange(tokens.size, dtype=np.int64)  # [n]
        local = pos - np.repeat(seg_begin, lengths)  # [n] position inside the segment
        room = np.repeat(lengths, lengths) - local - 1  # [n] tokens after pos in its segment
        owns = local < np.repeat(owned, lengths)  # [n] window start owned by this chunk
        # [n] how far the successor must be from the window start (<= 0: any)
        to_first = np.repeat(first, lengths) - local if first.max() > 0 else None
        for order, codec in enumerate(self.codecs, start=1):
            wanted = owns & (room >= order)
            if to_first is not None:
                wanted &= to_first <= order
            starts = np.flatnonzero(wanted)  # [m] window starts of this order
            if starts.size == 0:
                continue
            keys = codec.pack_windows(tokens, starts)  # [m, words] uint64
            if keys.shape[1] == 1:
                keys = np.sort(keys[:, 0]).reshape(-1, 1)
            else:
                keys = keys[np.lexsort(keys.T[::-1])]
            first_rows = group_starts(keys)  # [u]
            counts = np.diff(np.append(first_rows, keys.shape[0])).astype(np.uint64)  # [u]
            if self.weight != 1:
                counts *= np.uint64(self.weight)
            self.store.add(order, keys[first_rows], counts)
