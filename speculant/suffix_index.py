"""A suffix index of a token stream: successor counts of contexts of any length up to a cap,
and how it is built.

Terms. The *stream* is the graph's corpus as one array of token ids, its documents separated
by SEP (the largest value of the stream's dtype, never a token id). An *entry* is a position p
of the stream whose token is followed, in the same document, by a counted successor
``stream[p + 1]``; the context of order o *ending* at p is ``stream[p - o + 1 : p + 1]`` when
those o tokens are in p's document. The *backward string* of p is ``stream[p], stream[p - 1],
...`` up to its document's start: the contexts ending at p, read from their last token.

The *suffix array* ``entries`` lists the entries sorted by backward string (the first MAX_CONTEXT
tokens; ties, and strings that end first, by position), so the entries whose contexts of order o
equal a given one are one range [lo, hi) of it, and a context one token longer (further back)
has a sub-range of its range: a lookup narrows the range token by token from the last, one
binary search each (the stream's dtype is 2 or 4 bytes a token, the array 4: 6 to 8 bytes a
token, whatever the order). The successor counts of a range are the (weighted) counts of
``stream[p + 1]`` over its entries; for ranges of at least ``frequent_min`` entries they are
read from a table built with the index (counting them would read too much of the stream).

The kernels are compiled with numba (no Python per step of a search): a lookup of every order
of a context costs a few microseconds.

Building one (the second half of this module): sorting a stream's entries by
backward string, merging sorted entry arrays, and what the sorted entries say about the corpus
(the ranges whose successor counts are tabled, the statistics of each order).

Sorting is prefix doubling: the rank of every position's first h backward tokens, then of its
first 2h from the pair (rank of its first h, rank of the first h of the position h before), one
sort per doubling, until h reaches MAX_CONTEXT (six sorts); a last stable sort orders the entries
by rank, ties (strings equal for MAX_CONTEXT tokens, or ended) by position.

Why so long: the searches and the sort share one definition of the entries' order (the
backward string and its cap); kept in one room, the reader checks it once.
"""

from __future__ import annotations

from collections.abc import Iterator

import numba
import numpy as np

from speculant.config import MAX_DRAFT_CONTEXT

MAX_CONTEXT = MAX_DRAFT_CONTEXT  # the longest context a lookup matches (the sort's depth)
FREQUENT_MIN = 32  # ranges of this many entries or more get their successor counts tabled
ENTRY_DTYPE = np.dtype("<u4")  # stream positions in the suffix array (streams < 4 Gi tokens)


def stream_dtype(vocab_size: int) -> np.dtype:
    """The stream's dtype for a vocabulary: 2 bytes a token when the ids and SEP fit."""
    return np.dtype("<u2") if vocab_size < 0xFFFF else np.dtype("<u4")


def separator(dtype: np.dtype) -> int:
    """SEP of a stream dtype: its largest value."""
    return int(np.iinfo(dtype).max)


@numba.njit(cache=True, nogil=True, inline="always")
def back_token(stream, sep, position, depth):
    """The backward string of `position` at `depth`: the token `depth` places before it, or -1
    past its document's start (callers stop at the first -1)."""
    q = position - depth
    if q < 0:
        return -1
    token = stream[q]
    if token == sep:
        return -1
    return np.int64(token)


@numba.njit(cache=True, nogil=True)
def narrow(stream, sep, entries, lo, hi, depth, token):
    """The sub-range of entries[lo:hi] (which agree on their first `depth` backward tokens)
    whose backward token at `depth` is `token`: (lo', hi'), empty when lo' == hi'."""
    a, b = np.int64(lo), np.int64(hi)
    while a < b:  # the first entry at or after token
        mid = (a + b) >> 1
        if back_token(stream, sep, entries[mid], depth) < token:
            a = mid + 1
        else:
            b = mid
    start = a
    b = np.int64(hi)
    while a < b:  # the first entry after token
        mid = (a + b) >> 1
        if back_token(stream, sep, entries[mid], depth) <= token:
            a = mid + 1
        else:
            b = mid
    return start, a


@numba.njit(cache=True, nogil=True)
def match_ranges(stream, sep, entries, first, tail, out_lo, out_hi):
    """The ranges of the contexts of orders 1, 2, ... ending the context `tail` (ids, oldest
    first): out_lo[o - 1], out_hi[o - 1] for every order o that matches; returns how many
    match (a longer context matches only where a shorter one does).

    first[t] .. first[t + 1] is the range of the order-1 context (t,)."""
    n = tail.shape[0]
    if n == 0:
        return 0
    token = tail[n - 1]
    if token < 0 or token + 1 >= first.shape[0]:
        return 0
    lo, hi = np.int64(first[token]), np.int64(first[token + 1])
    if lo >= hi:
        return 0
    out_lo[0], out_hi[0] = lo, hi
    matched = 1
    limit = min(n, out_lo.shape[0])
    for depth in range(1, limit):
        token = tail[n - 1 - depth]
        if token < 0:
            break
        lo, hi = narrow(stream, sep, entries, lo, hi, depth, token)
        if lo >= hi:
            break
        out_lo[matched], out_hi[matched] = lo, hi
        matched += 1
    return matched


@numba.njit(cache=True, nogil=True)
def range_successors(stream, entries, weights, lo, hi):
    """(ids [u], counts [u]) of the successors of entries[lo:hi], counts weighted (weights
    empty: 1 each), sorted by count descending, then id ascending."""
    size = hi - lo
    ids = np.empty(size, np.int64)
    for i in range(size):
        ids[i] = stream[entries[lo + i] + 1]
    order = np.argsort(ids, kind="mergesort")
    out_ids = np.empty(size, np.int64)
    out_counts = np.empty(size, np.int64)
    distinct = 0
    for j in range(size):
        i = order[j]
        w = 1 if weights.shape[0] == 0 else np.int64(weights[entries[lo + i]])
        if distinct > 0 and out_ids[distinct - 1] == ids[i]:
            out_counts[distinct - 1] += w
        else:
            out_ids[distinct] = ids[i]
            out_counts[distinct] = w
            distinct += 1
    out_ids = out_ids[:distinct]
    out_counts = out_counts[:distinct]
    # count descending, id ascending: one sort key (counts and ids < 2^31)
    key = (np.int64(0x7FFFFFFF) - out_counts) * np.int64(0x80000000) + out_ids
    ranked = np.argsort(key)
    return out_ids[ranked], out_counts[ranked]


@numba.njit(cache=True, nogil=True)
def table_row(table_lo, table_hi, lo, hi):
    """The row of the tabled range (lo, hi) (rows sorted by lo, then hi), or -1."""
    a, b = 0, table_lo.shape[0]
    while a < b:
        mid = (a + b) >> 1
        row_lo, row_hi = np.int64(table_lo[mid]), np.int64(table_hi[mid])
        if row_lo < lo or (row_lo == lo and row_hi < hi):
            a = mid + 1
        else:
            b = mid
    if a < table_lo.shape[0] and np.int64(table_lo[a]) == lo and np.int64(table_hi[a]) == hi:
        return a
    return -1


@numba.njit(cache=True, nogil=True)
def lookup(
    stream, sep, entries, weights, first, table_lo, table_hi, tail, top, mixed, longest_from,
    every_order,
):  # fmt: skip
    """Where the successor counts of the contexts ending `tail` (ids, oldest first) are, for
    the orders that match and are kept, highest first (every_order False: the highest only):
    every matching order <= mixed, and the longest match when it is longer (and at least
    longest_from), of those the ones <= top. Returns (orders [m], rows [m], ids [s], counts [s],
    bounds [m + 1]). Order orders[j]'s successors are the table's row rows[j] when it is >= 0 (a
    range of at least frequent_min entries), else ids/counts[bounds[j]:bounds[j + 1]], counted
    from the stream (sorted by count descending, then id ascending)."""
    lo = np.empty(tail.shape[0], np.int64)
    hi = np.empty(tail.shape[0], np.int64)
    matched = match_ranges(stream, sep, entries, first, tail, lo, hi)
    kept = np.empty(min(matched, mixed) + 1, np.int64)
    m = 0
    if mixed < matched <= top and matched >= longest_from:
        kept[m] = matched
        m += 1
    for order in range(min(matched, mixed, top), 0, -1):
        kept[m] = order
        m += 1
    wanted = m if every_order else min(m, 1)
    orders = kept[:wanted]
    rows = np.empty(wanted, np.int64)
    bounds = np.zeros(wanted + 1, np.int64)
    total = 0
    for j in range(wanted):  # the rows, and the room the counted ranges need
        order = orders[j]
        rows[j] = table_row(table_lo, table_hi, lo[order - 1], hi[order - 1])
        if rows[j] < 0:
            total += hi[order - 1] - lo[order - 1]
    out_ids = np.empty(total, np.int64)
    out_counts = np.empty(total, np.int64)
    at = 0
    for j in range(wanted):
        bounds[j] = at
        if rows[j] < 0:
            order = orders[j]
            ids, counts = range_successors(stream, entries, weights, lo[order - 1], hi[order - 1])
            out_ids[at : at + ids.shape[0]] = ids
            out_counts[at : at + ids.shape[0]] = counts
            at += ids.shape[0]
    bounds[wanted] = at
    return orders, rows, out_ids[:at], out_counts[:at], bounds


# The index's files in a graph directory (plain .npy arrays, loaded without pickle).
STREAM_FILE = "stream.npy"  # [N] the token stream, SEP between documents
ENTRIES_FILE = "entries.npy"  # [E] uint32: the entries, sorted by backward string
FIRST_FILE = "first.npy"  # [V + 1] uint32: the range of the order-1 context (t,) starts at [t]
TABLE_RANGES_FILE = "table_ranges.npy"  # [R, 2] uint32: tabled ranges (lo, hi), sorted
TABLE_START_FILE = "table_start.npy"  # [R + 1] uint64: range r's successors at [r]:[r + 1]
TABLE_IDS_FILE = "table_ids.npy"  # [S] uint32: the tabled ranges' successors ...
TABLE_COUNTS_FILE = "table_counts.npy"  # [S] uint32: ... and their (weighted) counts
WEIGHTS_FILE = "weights.npy"  # [N] uint8: each position's weight (only in weighted graphs)
INDEX_FILES = (
    STREAM_FILE,
    ENTRIES_FILE,
    FIRST_FILE,
    TABLE_RANGES_FILE,
    TABLE_START_FILE,
    TABLE_IDS_FILE,
    TABLE_COUNTS_FILE,
)
NO_WEIGHTS = np.empty(0, np.uint8)  # every occurrence counts once


class SuffixIndex:
    """A graph's suffix index, its files memory-mapped read-only (thread-safe: reads only).

    ``arrays`` maps each file name to its array (over an np.memmap): the process's RSS does not
    grow with the graph; the pages belong to the page cache."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        # plain arrays over the maps: a slice of an np.memmap is a memmap, ten times dearer
        arrays = {name: np.asarray(array) for name, array in arrays.items()}
        self.arrays = arrays
        self.stream = arrays[STREAM_FILE]
        self.sep = separator(self.stream.dtype)
        self.entries = arrays[ENTRIES_FILE]
        self.first = arrays[FIRST_FILE]
        ranges = arrays[TABLE_RANGES_FILE]
        self.table_lo = ranges[:, 0]
        self.table_hi = ranges[:, 1]
        self.table_start = arrays[TABLE_START_FILE]
        self.table_ids = arrays[TABLE_IDS_FILE]
        self.table_counts = arrays[TABLE_COUNTS_FILE]
        self.weights = arrays.get(WEIGHTS_FILE, NO_WEIGHTS)
        # what the compiled drafts read (draft_service.greedy_kernels), in their order
        self.kernel_arrays = (
            self.stream,
            self.entries,
            self.weights,
            self.first,
            self.table_lo,
            self.table_hi,
            self.table_start,
            self.table_ids,
            self.table_counts,
        )

    def warm_up(self) -> None:
        """Run each lookup kernel once: the first call of a process loads their machine code
        (numba's cache, about 0.2 s) or, on a fresh install, compiles it (a few seconds), which
        a first request must not wait for."""
        tail = np.zeros(1, np.int64)
        self.match(tail, 1, True)
        range_successors(self.stream, self.entries, self.weights, 0, min(1, self.entries.shape[0]))

    def match(
        self,
        tail: np.ndarray,
        top: int,
        every_order: bool,
        mixed: int | None = None,
        longest_from: int = 0,
    ) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
        """(orders, successor ids [n] per order, counts [n] per order) of the contexts ending
        tail (int64 ids, oldest first) for the orders top .. 1 that match, highest first
        (every_order False: the highest only); successors sorted by count descending, then id
        ascending. A tabled order's arrays are views of the memory-mapped table.

        mixed: only the orders up to mixed, and the longest match over the whole tail when it
        is longer than mixed and at least longest_from tokens (None: every order up to top)."""
        if mixed is None:
            tail, mixed = tail[max(0, tail.shape[0] - top) :], top
        orders, rows, ids, counts, bounds = lookup(
            self.stream,
            self.sep,
            self.entries,
            self.weights,
            self.first,
            self.table_lo,
            self.table_hi,
            tail,
            top,
            mixed,
            longest_from,
            every_order,
        )
        ids_list: list[np.ndarray] = []
        counts_list: list[np.ndarray] = []
        cut = bounds.tolist()
        for j, row in enumerate(rows.tolist()):
            if row >= 0:
                a, b = int(self.table_start[row]), int(self.table_start[row + 1])
                ids_list.append(self.table_ids[a:b])
                counts_list.append(self.table_counts[a:b])
            else:
                ids_list.append(ids[cut[j] : cut[j + 1]])
                counts_list.append(counts[cut[j] : cut[j + 1]])
        return orders.tolist(), ids_list, counts_list

    def _groups(self, order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lo [g], hi [g], total [g]) of every context of `order` tokens (see
        :func:`context_groups`), totals weighted."""
        lo, hi = context_groups(self.stream, self.sep, self.entries, order)
        if self.weights.shape[0] == 0 or lo.size == 0:
            return lo, hi, hi - lo
        per_entry = self.weights[self.entries].astype(np.int64)  # [E]
        return lo, hi, np.add.reduceat(per_entry, lo) if lo.size else lo

    def _context(self, lo: int, order: int) -> tuple[int, ...]:
        end = int(self.entries[lo])
        return tuple(int(t) for t in self.stream[end - order + 1 : end + 1])

    def frequent_contexts(self, order: int, n: int) -> list[tuple[tuple[int, ...], int]]:
        """The n contexts of `order` tokens with the largest totals (ties: lowest ids), with
        their totals: (ids, total), by a scan of the index."""
        lo, _, totals = self._groups(order)
        if totals.size > n:  # the candidates: totals at least the n-th largest
            keep = totals >= np.partition(totals, totals.size - n)[totals.size - n]
            lo, totals = lo[keep], totals[keep]
        found = [
            (self._context(start, order), int(total))
            for start, total in zip(lo.tolist(), totals.tolist(), strict=True)
        ]
        return sorted(found, key=lambda item: (-item[1], item[0]))[:n]

    def contexts(self, order: int) -> Iterator[tuple[tuple[int, ...], np.ndarray, np.ndarray]]:
        """Every context of `order` tokens with its successors: (ids, successor ids [n],
        counts [n]), successors by count descending, then id ascending (a scan: for tests
        and tools, not the hot path)."""
        lo, hi, _ = self._groups(order)
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            ids, counts = range_successors(self.stream, self.entries, self.weights, a, b)
            yield self._context(a, order), ids, counts

    def sample_contexts(self, order: int, n: int, rng: np.random.Generator) -> list[list[int]]:
        """n contexts of the given order that occur (those ending at random entries whose
        document is long enough; fewer when few are)."""
        out: list[list[int]] = []
        stream, entries = self.stream, self.entries
        for _ in range(20 * n):
            if len(out) >= n or entries.shape[0] == 0:
                break
            end = int(entries[int(rng.integers(entries.shape[0]))])
            context = stream[max(0, end - order + 1) : end + 1].astype(np.int64)
            if context.size == order and not (context == self.sep).any():
                out.append(context.tolist())
        return out


@numba.njit(cache=True, nogil=True)
def _same_context(stream, sep, a, b, order):
    """Whether the contexts of `order` tokens ending at entries a and b are equal and whole
    (a == b: whether a has one: its document has `order` tokens up to it)."""
    for depth in range(order):
        x = back_token(stream, sep, a, depth)
        if x < 0 or x != back_token(stream, sep, b, depth):
            return False
    return True


@numba.njit(cache=True, nogil=True)
def context_groups(stream, sep, entries, order):
    """(lo [g], hi [g]): the range of sorted entries of every context of `order` tokens, in
    entry order (entries without a whole order-`order` context belong to none)."""
    los = np.empty(entries.shape[0], np.int64)
    his = np.empty(entries.shape[0], np.int64)
    groups = 0
    i = 0
    size = entries.shape[0]
    while i < size:
        start = np.int64(entries[i])
        lo = i
        i += 1
        if not _same_context(stream, sep, start, start, order):
            continue  # its document has fewer than `order` tokens up to it
        while i < size and _same_context(stream, sep, start, np.int64(entries[i]), order):
            i += 1
        los[groups] = lo
        his[groups] = i
        groups += 1
    return los[:groups], his[:groups]


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
