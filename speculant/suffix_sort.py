"""Building a suffix index (see :mod:`speculant.suffix_index`): sorting a stream's entries by
backward string, merging sorted entry arrays, and what the sorted entries say about the corpus
(the ranges whose successor counts are tabled, the statistics of each order).

Sorting is prefix doubling: the rank of every position's first h backward tokens, then of its
first 2h from the pair (rank of its first h, rank of the first h of the position h before), one
sort per doubling, until h reaches MAX_CONTEXT (six sorts); a last stable sort orders the entries
by rank, ties (strings equal for MAX_CONTEXT tokens, or ended) by position.
"""

from __future__ import annotations

import numba
import numpy as np

from speculant.suffix_index import MAX_CONTEXT, back_token


def document_lengths(stream: np.ndarray, sep: int) -> np.ndarray:
    """For every position p, how many tokens of p's document end at p (0 at a SEP): the
    length of its backward string, int64 [n]."""
    n = stream.shape[0]
    positions = np.arange(n, dtype=np.int64)
    is_sep = stream == sep
    last_sep = np.where(is_sep, positions, -1)
    np.maximum.accumulate(last_sep, out=last_sep)
    lengths = positions - last_sep
    lengths[is_sep] = 0
    return lengths


def sort_entries(stream: np.ndarray, sep: int, entries: np.ndarray) -> np.ndarray:
    """entries (positions of stream, ascending) sorted by backward string, the first
    MAX_CONTEXT tokens, ties by position: a new uint32 array."""
    n = stream.shape[0]
    lengths = document_lengths(stream, sep)
    rank, h = _packed_prefixes(stream, lengths)
    while h < MAX_CONTEXT:
        # the rank of the first h tokens of the backward string starting h before (0 where
        # the string has ended by then)
        second = np.zeros(n, dtype=np.int64)
        second[h:] = rank[:-h]
        second[lengths <= h] = 0
        key = rank * np.int64(rank.max() + 1) + second
        rank = _ranks(key)
        h *= 2
    order = np.argsort(rank[entries], kind="stable")  # entries ascending: ties by position
    return entries[order].astype(np.uint32)


def _ranks(key: np.ndarray) -> np.ndarray:
    """Dense ranks of key (int64 [n]): equal keys one rank, 0 for the smallest."""
    n = key.shape[0]
    order = np.argsort(key)  # equal keys get one rank: their order does not matter
    ordered = key[order]
    changes = np.empty(n, dtype=np.int64)
    changes[0] = 0
    np.not_equal(ordered[1:], ordered[:-1], out=changes[1:])
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.cumsum(changes)
    return rank


def _packed_prefixes(stream: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, int]:
    """(the rank of every position's first h backward tokens, h): as many tokens as fit in
    63 bits packed into one key (6 of a 512-token vocabulary, 3 of a 49,152-token one), so the
    doubling starts further along. A token is id + 1, 0 past the string's end."""
    real = lengths > 0  # not SEP
    bits = (int(stream[real].max()) + 1 if real.any() else 1).bit_length()
    h = min(MAX_CONTEXT, max(1, 63 // bits))
    n = stream.shape[0]
    key = np.zeros(n, dtype=np.int64)
    for depth in range(h):
        token = np.zeros(n, dtype=np.int64)
        if depth < n:
            token[depth:] = stream[: n - depth].astype(np.int64) + 1
        token[lengths <= depth] = 0
        key = (key << bits) | token
    return _ranks(key), h


@numba.njit(cache=True, nogil=True)
def _compare(stream, sep, a, b):
    """-1, 0 or 1: the order of entries a and b (backward strings, then positions)."""
    for depth in range(MAX_CONTEXT):
        x = back_token(stream, sep, a, depth)
        y = back_token(stream, sep, b, depth)
        if x != y:
            return -1 if x < y else 1
        if x < 0:
            break
    if a == b:
        return 0
    return -1 if a < b else 1


@numba.njit(cache=True, nogil=True)
def merge_into(stream, sep, left, right, out):
    """Merge two sorted entry arrays of one stream into out (their total length)."""
    i = j = k = 0
    while i < left.shape[0] and j < right.shape[0]:
        if _compare(stream, sep, np.int64(left[i]), np.int64(right[j])) <= 0:
            out[k] = left[i]
            i += 1
        else:
            out[k] = right[j]
            j += 1
        k += 1
    while i < left.shape[0]:
        out[k] = left[i]
        i += 1
        k += 1
    while j < right.shape[0]:
        out[k] = right[j]
        j += 1
        k += 1


def merge_sorted(stream: np.ndarray, sep: int, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Two sorted entry arrays of one stream merged into a new sorted uint32 array."""
    out = np.empty(left.shape[0] + right.shape[0], np.uint32)
    merge_into(stream, sep, left, right, out)
    return out


@numba.njit(cache=True, nogil=True)
def common_prefixes_into(stream, sep, entries, lcp):
    """lcp [n]: lcp[i] = how many backward tokens entries i - 1 and i share (0 for i = 0),
    at most MAX_CONTEXT."""
    n = entries.shape[0]
    if n:
        lcp[0] = 0
    for i in range(1, n):
        a, b = np.int64(entries[i - 1]), np.int64(entries[i])
        depth = 0
        while depth < MAX_CONTEXT:
            x = back_token(stream, sep, a, depth)
            if x < 0 or x != back_token(stream, sep, b, depth):
                break
            depth += 1
        lcp[i] = depth


def common_prefixes(stream: np.ndarray, sep: int, entries: np.ndarray) -> np.ndarray:
    """The lcp array of sorted entries (see :func:`common_prefixes_into`), int32 [n]."""
    lcp = np.empty(entries.shape[0], np.int32)
    common_prefixes_into(stream, sep, entries, lcp)
    return lcp


@numba.njit(cache=True, nogil=True)
def first_offsets(stream, entries, vocab):
    """first [vocab + 1] uint32: the entries whose token is t are entries[first[t]:first[t+1]]
    (sorted entries are grouped by their own token, ascending)."""
    first = np.zeros(vocab + 1, np.uint32)
    for i in range(entries.shape[0]):
        first[np.int64(stream[entries[i]]) + 1] += 1
    for t in range(vocab):
        first[t + 1] += first[t]
    return first


@numba.njit(cache=True, nogil=True)
def frequent_ranges(lcp, frequent_min):
    """(lo [r], hi [r]): every range of the sorted entries that is the range of some context
    (an lcp-interval: its entries share more backward tokens with each other than with their
    neighbours; the empty context's, the whole array, excluded) and has at least frequent_min
    entries. A bottom-up walk of the intervals with a stack (Abouelhoda, Kurtz, Ohlebusch)."""
    n = lcp.shape[0]
    los = []
    his = []
    stack_depth = [np.int64(0)]
    stack_lo = [np.int64(0)]
    for i in range(1, n + 1):
        depth = np.int64(lcp[i]) if i < n else np.int64(-1)
        lo = np.int64(i - 1)
        while depth < stack_depth[-1]:
            top = stack_depth.pop()
            lo = stack_lo.pop()
            if top > 0 and i - lo >= frequent_min:
                los.append(lo)
                his.append(np.int64(i))
            if len(stack_depth) == 0:
                break
        if len(stack_depth) == 0 or depth > stack_depth[-1]:
            stack_depth.append(depth)
            stack_lo.append(lo)
    lo_out = np.empty(len(los), np.int64)
    hi_out = np.empty(len(his), np.int64)
    for k in range(len(los)):
        lo_out[k] = los[k]
        hi_out[k] = his[k]
    return lo_out, hi_out


@numba.njit(cache=True, nogil=True, inline="always")
def _reaches(stream, sep, position, order):
    """Whether position's document has `order` tokens up to it."""
    for depth in range(order):  # noqa: SIM110 (numba compiles no generator expressions)
        if back_token(stream, sep, position, depth) < 0:
            return False
    return True


@numba.njit(cache=True, nogil=True)
def order_statistics(stream, sep, entries, lcp, weights, max_order, vocab):
    """Per order o = 1..max_order: (distinct contexts, distinct (context, successor) pairs,
    weighted occurrences), int64 [max_order, 3]. An entry has an order-o context when its
    document has o tokens up to it."""
    stats = np.zeros((max_order, 3), np.int64)
    last_group = np.full(vocab, -1, np.int64)
    for order in range(1, max_order + 1):
        group = -1
        shared = MAX_CONTEXT  # lcp with the previous entry that has an order-o context
        have_previous = False
        for i in range(entries.shape[0]):
            if i > 0:
                shared = min(shared, lcp[i])
            p = np.int64(entries[i])
            if not _reaches(stream, sep, p, order):
                continue  # no order-o context here
            if not have_previous or shared < order:
                group += 1
            have_previous = True
            shared = MAX_CONTEXT
            successor = np.int64(stream[p + 1])
            if last_group[successor] != group:
                last_group[successor] = group
                stats[order - 1, 1] += 1
            stats[order - 1, 2] += 1 if weights.shape[0] == 0 else np.int64(weights[p])
        stats[order - 1, 0] = group + 1
        last_group[:] = -1
    return stats


@numba.njit(cache=True, nogil=True, inline="always")
def _count_range(stream, entries, weights, lo, hi, count, touched):
    """Add the (weighted) successors of entries[lo:hi] into count (by token); the distinct
    tokens go to touched[:returned]."""
    distinct = 0
    for i in range(lo, hi):
        s = np.int64(stream[entries[i] + 1])
        if count[s] == 0:
            touched[distinct] = s
            distinct += 1
        count[s] += 1 if weights.shape[0] == 0 else np.int64(weights[entries[i]])
    return distinct


@numba.njit(cache=True, nogil=True)
def range_tables(stream, entries, weights, lo, hi, vocab):
    """The successor counts of each range lo[r]..hi[r] (sorted by lo, then hi): (start [r + 1],
    ids [s], counts [s]), range r's successors at start[r]:start[r + 1], sorted by count
    descending, then id ascending."""
    count = np.zeros(vocab, np.int64)
    touched = np.empty(vocab, np.int64)
    starts = np.zeros(lo.shape[0] + 1, np.int64)
    for r in range(lo.shape[0]):  # first pass: how many successors each range has
        distinct = _count_range(stream, entries, weights, lo[r], hi[r], count, touched)
        count[touched[:distinct]] = 0
        starts[r + 1] = starts[r] + distinct
    ids = np.empty(starts[-1], np.uint32)
    counts = np.empty(starts[-1], np.uint32)
    for r in range(lo.shape[0]):
        distinct = _count_range(stream, entries, weights, lo[r], hi[r], count, touched)
        got = touched[:distinct].copy()
        key = (np.int64(0x7FFFFFFF) - count[got]) * np.int64(0x80000000) + got
        ranked = got[np.argsort(key)]  # count descending, then id ascending
        ids[starts[r] : starts[r + 1]] = ranked
        counts[starts[r] : starts[r + 1]] = count[ranked]
        count[got] = 0
    return starts, ids, counts
