"""Packing n-gram rows into sortable integer keys.

An *n-gram row* of order o is o context token ids followed by the successor id (o + 1 ids). With
``bits`` bits per token id (enough for the vocabulary), ``per_word = 64 // bits`` ids fit in one
uint64 *word*; a row becomes ``words = ceil((o + 1) / per_word)`` words, ids packed first-id-in-
the-highest-bits. So comparing keys word by word (numerically) is comparing rows
lexicographically: sorting keys sorts by context, then successor, exactly LMDB's key order
(big-endian ids). Keys are ``[n, words] uint64`` arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bits_for_vocab(vocab_size: int) -> int:
    """Bits needed to store any id below vocab_size (at least 1)."""
    return max(1, int(vocab_size - 1).bit_length())


@dataclass(frozen=True)
class KeyCodec:
    """Packs rows of ``length`` token ids of ``bits`` bits each into ``[n, words]`` uint64."""

    bits: int
    length: int  # ids per row: order + 1

    @property
    def per_word(self) -> int:
        return 64 // self.bits

    @property
    def words(self) -> int:
        return -(-self.length // self.per_word)

    def _place(self, j: int) -> tuple[int, int]:
        """(word index, left shift) of the j-th id of a row."""
        return j // self.per_word, self.bits * (self.per_word - 1 - j % self.per_word)

    def pack_windows(self, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Keys of the rows tokens[s : s + length] for s in starts -> ``[m, words]`` uint64."""
        keys = np.zeros((starts.size, self.words), dtype=np.uint64)
        for j in range(self.length):
            w, shift = self._place(j)
            keys[:, w] |= tokens[starts + j].astype(np.uint64) << np.uint64(shift)
        return keys

    def pack_rows(self, rows: np.ndarray) -> np.ndarray:
        """Keys of whole rows: ``[n, length]`` ids -> ``[n, words]`` uint64."""
        keys = np.zeros((rows.shape[0], self.words), dtype=np.uint64)
        for j in range(self.length):
            w, shift = self._place(j)
            keys[:, w] |= rows[:, j].astype(np.uint64) << np.uint64(shift)
        return keys

    def unpack(self, keys: np.ndarray, first: int = 0, stop: int | None = None) -> np.ndarray:
        """Ids first..stop-1 of each row: ``[n, words]`` -> ``[n, stop - first]`` uint32."""
        stop = self.length if stop is None else stop
        out = np.empty((keys.shape[0], stop - first), dtype=np.uint32)
        mask = np.uint64((1 << self.bits) - 1)
        for j in range(first, stop):
            w, shift = self._place(j)
            out[:, j - first] = (keys[:, w] >> np.uint64(shift)) & mask
        return out

    def context_keys(self, keys: np.ndarray) -> np.ndarray:
        """The keys with the successor id zeroed: rows of one context become equal."""
        w, shift = self._place(self.length - 1)
        out = keys.copy()
        out[:, w] &= ~np.uint64(((1 << self.bits) - 1) << shift)
        return out


def sort_order(keys: np.ndarray) -> np.ndarray:
    """Stable argsort of ``[n, words]`` keys (lexicographic by word)."""
    if keys.shape[1] == 1:
        return np.argsort(keys[:, 0], kind="stable")
    return np.lexsort(keys.T[::-1])


def row_changes(sorted_keys: np.ndarray) -> np.ndarray:
    """``[n - 1]`` bool: row i + 1 differs from row i (keys sorted)."""
    if sorted_keys.shape[1] == 1:
        return sorted_keys[1:, 0] != sorted_keys[:-1, 0]
    return (sorted_keys[1:] != sorted_keys[:-1]).any(axis=1)


def group_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Indices where a run of equal keys starts (``[g]`` int64, first is 0)."""
    if sorted_keys.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([[0], np.flatnonzero(row_changes(sorted_keys)) + 1])


def reduce_sorted(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum the counts of equal keys in sorted keys -> (unique keys, counts uint64)."""
    starts = group_starts(keys)
    if starts.size == keys.shape[0]:
        return keys, counts.astype(np.uint64, copy=False)
    return keys[starts], np.add.reduceat(counts.astype(np.uint64, copy=False), starts)


def sort_reduce(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort keys and sum the counts of equal ones -> (sorted unique keys, counts uint64)."""
    order = sort_order(keys)
    return reduce_sorted(keys[order], counts[order])


def keys_le(keys: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """``[n]`` bool: key <= bound (bound: one key, ``[words]``), lexicographically."""
    less = np.zeros(keys.shape[0], dtype=bool)
    equal = np.ones(keys.shape[0], dtype=bool)
    for w in range(keys.shape[1]):
        less |= equal & (keys[:, w] < bound[w])
        equal &= keys[:, w] == bound[w]
    return less | equal
