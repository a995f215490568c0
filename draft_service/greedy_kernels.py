"""Greedy drafts in compiled code: chains and best-first trees from a graph's suffix index and
the request's own context (the overlay), with no Python per draft position.

The same drafts as :mod:`draft_service.chain` and :mod:`draft_service.tree` (greedy), for
``witten-bell`` and ``backoff`` mixing, where the graph has a suffix index (the drafter takes
the Python path otherwise). Terms are those of :mod:`draft_service.drafting`; q is the mixed
distribution, c_o(x) = c_graph,o(x) + w_live c_live,o(x) + w c_ctx,o(x) the combined counts of
order o (w_live the live layer's weight, w = overlay_weight), C_o their sum, T_o their distinct
tokens, s_o = w_o / C_o the scale of order o under the mixing weights w_o, so q(x) = sum_o
s_o c_o(x). The live layer's counts are read from a suffix index of its documents that it
builds again as it learns, spaced so that building takes a small share of a core
(LiveLayer.compiled_index): these drafts follow what a large layer learns within a few
seconds, where the Python drafters follow it at once.

One *step* (what a tree node offers, or one chain position) after a tail:

1. the graph's matching orders and their successor lists (suffix-array ranges, narrowed one
   token at a time; frequent ranges are rows of the index's table, successors by count
   descending, found by a hash of the ranges, each row's total count kept beside it), as
   :meth:`speculant.suffix_index.SuffixIndex.match`, and the live layer's, the same way in its
   index;
2. the overlay's: every earlier occurrence of the tail's last token in the context (a chain of
   previous occurrences per token, :class:`draft_service.overlay.ContextIndex`), each with the
   length of its match backwards and its successor;
3. the mixing weights (Witten-Bell, top order down: w_o = lambda_o * (mass the higher orders
   left), lambda_o = C_o / (C_o + b T_o), the lowest order takes the rest; backoff: the top
   order alone);
4. the `width` likeliest tokens of q. A *short* list (at most SHORT_LIST successors, or one
   counted from the stream) is read whole into per-token cells; a *long* one (a table row of
   hundreds to thousands of successors, orders 1 and 2 of frequent contexts) is read from its
   head only, the threshold algorithm of Fagin, Lotem and Naor: each token met is completed
   by a binary search of every long list in a copy of its row sorted by id (by_id_views), and
   the reads stop once the width-th best q is above what any token not met can reach (the
   sum over long lists of s_o times the count at the read position).

Each token's mass sum_o s_o c_o(x) is summed in the same order (highest order first) and with
the same float operations as :class:`draft_service.mixing.Mixer`, so the drafts are the same
tokens with the same q (tests/test_greedy_kernels.py replays contexts through both).

Why so long: one job, a draft step and the chains and trees built of steps, in compiled code
that shares its array layouts (the index's, the scratch cells', the working arrays'); split
across modules, every piece would need the layouts' constants and the others' signatures.
"""

from __future__ import annotations

import heapq
import logging
import math
import threading
from collections.abc import Sequence

import numba
import numpy as np

from draft_service.learning import LiveLayer
from draft_service.overlay import ContextIndex, overlay_matches
from draft_service.tree import TREE_WIDTH
from speculant.config import DraftParams
from speculant.graph_format import GraphFormatError
from speculant.graph_reader import LONGEST_FROM, NGramGraph
from speculant.suffix_index import SuffixIndex, match_ranges
from speculant.types import DraftProposal, point_mass

log = logging.getLogger(__name__)
COMPILING = (
    "compiling the drafts' kernels (numba): the first start after an install takes about a "
    "minute; later starts load them from numba's cache"
)
# Source codes of a drafted token (DraftProposal.sources): who listed it as a successor.
SOURCE_NAMES = ("graph", "overlay", "both")
_IN_GRAPH = 1
_IN_OVERLAY = 2
# Successors a tree step finds first (more only where its siblings are taken: greedy_tree).
FIRST_WIDTH = 2
# Lists of at most this many successors are read whole; longer table rows from their head.
SHORT_LIST = 64
# Safety margin on the stopping threshold (relative): masses are sums of a few float64
# products, each off by at most a few units in the last place.
_BOUND_SLACK = 1e-9
_NONE_READ = (-1, False, 0)  # _complete's read_from for a token read from no long list
BACKOFF = 0
WITTEN_BELL = 1
# The index's arrays, by position in SuffixIndex.kernel_arrays
_STREAM, _ENTRIES, _WEIGHTS, _FIRST, _TABLE_LO, _TABLE_HI = range(6)
_TABLE_START, _TABLE_IDS, _TABLE_COUNTS = range(6, 9)
# Where a list's tokens are (_read_list): counted from the stream, a short or a long table row
_COUNTED, _SHORT, _LONG = range(3)
# A token's marks (Scratch.marks columns): stamps, so nothing is cleared between steps
_SEEN, _EVALUATED, _FLAGS, _OVERLAY_MARK, _TYPE_MARK = range(5)


class Scratch:
    """Per-thread cells indexed by token id (sized by the vocabulary), what a step knows of a
    token side by side. marks [V, 4]: the step that last listed it (_SEEN), completed it
    (_EVALUATED), its flags, the order that last counted it in the overlay. cells [V, J + 2]
    (J = max_order + 1 orders at most): c_j(x) for the step's j-th order, then its partial
    mass (what its known counts give, for bounds), then its overlay count at the order being
    read. listed: the tokens the step has listed."""

    def __init__(self, vocab_size: int, max_orders: int) -> None:
        self.stamps = np.zeros(3, np.int64)  # the step and order counters, typed's length
        self.marks = np.zeros((vocab_size, 5), np.int64)
        self.cells = np.zeros((vocab_size, max_orders + 2), np.float64)
        self.listed = np.zeros(vocab_size, np.int64)
        self.typed = np.zeros(vocab_size, np.int64)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.stamps, self.marks, self.cells, self.listed, self.typed


_SCRATCH = threading.local()  # this thread's Scratch per (vocabulary size, orders)


def thread_scratch(vocab_size: int, max_orders: int) -> tuple:
    """This thread's scratch arrays for a vocabulary and an order count, made on first use and
    shared by every drafter of such graphs this thread drafts for (a step leaves nothing in
    them that the next one reads: stamps tell old cells apart)."""
    by_shape = getattr(_SCRATCH, "by_shape", None)
    if by_shape is None:
        by_shape = _SCRATCH.by_shape = {}
    arrays = by_shape.get((vocab_size, max_orders))
    if arrays is None:
        arrays = by_shape[vocab_size, max_orders] = Scratch(vocab_size, max_orders).arrays()
    return arrays


# The arrays of an absent overlay (ContextIndex.arrays of an empty context).
NO_OVERLAY = (np.zeros(1, np.int64), np.full(1, -1, np.int32), np.full(0, -1, np.int32), 0)


@numba.njit(cache=True, nogil=True, inline="always")
def _sum(counts):
    total = 0.0
    for i in range(counts.shape[0]):
        total += np.float64(counts[i])
    return total


@numba.njit(cache=True, nogil=True)
def by_id_views(table_start, table_ids, table_counts, table_lo, table_hi, short):
    """What the kernels derive from an index's table once: copies of the rows longer than
    `short`, each sorted by id, every row's total count, and a hash of the rows by range.
    Returns (offsets [R] (-1: a short row), ids [S'], counts [S'], totals [R], slot keys [H],
    slot rows [H]); row r's copy is at offsets[r]:offsets[r] + its size; row_of reads the
    hash (H: a power of two, at least twice R)."""
    rows = table_start.shape[0] - 1
    offsets = np.full(rows, -1, np.int64)
    totals = np.empty(rows, np.float64)
    size = 0
    for r in range(rows):
        a, b = np.int64(table_start[r]), np.int64(table_start[r + 1])
        totals[r] = _sum(table_counts[a:b])
        if b - a > short:
            offsets[r] = size
            size += b - a
    ids = np.empty(size, table_ids.dtype)
    counts = np.empty(size, table_counts.dtype)
    for r in range(rows):
        if offsets[r] < 0:
            continue
        a, b = np.int64(table_start[r]), np.int64(table_start[r + 1])
        order = np.argsort(table_ids[a:b])
        at = offsets[r]
        for i in range(b - a):
            ids[at + i] = table_ids[a + order[i]]
            counts[at + i] = table_counts[a + order[i]]
    slots = 2
    while slots < 2 * rows:
        slots *= 2
    slot_keys = np.zeros(slots, np.uint64)  # 0: empty (no row has hi == 0)
    slot_rows = np.empty(slots, np.int64)
    for r in range(rows):
        key = _range_key(table_lo[r], table_hi[r])
        h = _slot(key, slots)
        while slot_keys[h] != 0:
            h = (h + 1) & (slots - 1)
        slot_keys[h], slot_rows[h] = key, r
    return offsets, ids, counts, totals, slot_keys, slot_rows


@numba.njit(cache=True, nogil=True, inline="always")
def _range_key(lo, hi):
    """A suffix-array range as one key (both ends < 2**32)."""
    return (np.uint64(lo) << np.uint64(32)) | np.uint64(hi)


@numba.njit(cache=True, nogil=True, inline="always")
def _slot(key, slots):
    """key's first slot in a hash of `slots` (a power of two): Fibonacci hashing."""
    return np.int64((key * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)) & (slots - 1)


@numba.njit(cache=True, nogil=True, inline="always")
def row_of(views, lo, hi):
    """The table row of the range [lo, hi), or -1 (as table_row, by the views' hash)."""
    slot_keys, slot_rows = views[4], views[5]
    slots = slot_keys.shape[0]
    key = _range_key(lo, hi)
    h = _slot(key, slots)
    while slot_keys[h] != 0:
        if slot_keys[h] == key:
            return slot_rows[h]
        h = (h + 1) & (slots - 1)
    return -1


def views_of(index: SuffixIndex) -> tuple[np.ndarray, ...]:
    """The index's by-id views (by_id_views), made on first use and kept with the index
    (memory: 8 bytes a successor of the long rows, 8 a row, 16 a hash slot at 2-4 slots a
    row; docs/benchmarks.md)."""
    views = getattr(index, "by_id", None)
    if views is None:
        views = index.by_id = by_id_views(
            index.table_start, index.table_ids, index.table_counts, index.table_lo,
            index.table_hi, SHORT_LIST,
        )  # fmt: skip
    return views


@numba.njit(cache=True, nogil=True, inline="always")
def _count_of(ids, counts, a, b, x):
    """The count of id x in the id-sorted ids[a:b] (0 if absent)."""
    end = b
    while a < b:
        mid = (a + b) >> 1
        if np.int64(ids[mid]) < x:
            a = mid + 1
        else:
            b = mid
    if a < end and np.int64(ids[a]) == x:
        return np.int64(counts[a])
    return 0


@numba.njit(cache=True, nogil=True, inline="always")
def _consider(token, mass, flags, width, top_ids, top_mass, top_flags, found):
    """Insert (token, mass) into the top list (mass descending, then id ascending) of at most
    width entries holding `found`; returns the new count."""
    if mass <= 0.0:
        return found
    if found == width:
        last = found - 1
        if mass < top_mass[last] or (mass == top_mass[last] and token > top_ids[last]):
            return found
        found -= 1
    at = found
    while at > 0 and (
        mass > top_mass[at - 1] or (mass == top_mass[at - 1] and token < top_ids[at - 1])
    ):
        top_ids[at] = top_ids[at - 1]
        top_mass[at] = top_mass[at - 1]
        top_flags[at] = top_flags[at - 1]
        at -= 1
    top_ids[at] = token
    top_mass[at] = mass
    top_flags[at] = flags
    return found + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _list(x, step, scr, size):
    """List token x in this step (its cells zeroed) unless it is; returns the list's size."""
    marks, cells, listed = scr[1], scr[2], scr[3]
    if marks[x, _SEEN] != step:
        marks[x, _SEEN] = step
        marks[x, _FLAGS] = 0
        cells[x, :] = 0.0
        listed[size] = x
        size += 1
    return size


@numba.njit(cache=True, nogil=True, inline="always")
def _new_type(x, order_stamp, scr):
    """Whether x is met for the first time at this order in a short list or the overlay (then
    marked, and kept in the scratch's list of this order's tokens, scr[4][:scr[0][2]])."""
    stamps, marks, typed = scr[0], scr[1], scr[4]
    if marks[x, _TYPE_MARK] == order_stamp:
        return 0
    marks[x, _TYPE_MARK] = order_stamp
    typed[stamps[2]] = x
    stamps[2] += 1
    return 1


@numba.njit(cache=True, nogil=True, inline="always")
def _read_short(ids, counts, weight, j, order_stamp, step, scr, size):
    """Add weight times a short list's counts to the cells of order index j. Returns the list
    size."""
    marks, cells = scr[1], scr[2]
    for i in range(ids.shape[0]):
        x = np.int64(ids[i])
        size = _list(x, step, scr, size)
        cells[x, j] += np.float64(counts[i]) * weight
        marks[x, _FLAGS] |= _IN_GRAPH
    return size


@numba.njit(cache=True, nogil=True, inline="always")
def _count_range(ix, lo, hi, weight, j, order_stamp, step, scr, size):
    """Count the successors of the suffix-array range [lo, hi) (one not in the table) from the
    stream, times weight, into the cells of order index j. Returns (list size, its distinct
    tokens (those the cells had no count for: right where it is the order's first list), its
    count)."""
    stream, entries, weights = ix[_STREAM], ix[_ENTRIES], ix[_WEIGHTS]
    marks, cells = scr[1], scr[2]
    types = 0
    total = 0.0
    for i in range(lo, hi):
        position = np.int64(entries[i])
        x = np.int64(stream[position + 1])
        c = 1.0 if weights.shape[0] == 0 else np.float64(weights[position])
        size = _list(x, step, scr, size)
        if cells[x, j] == 0.0:
            types += 1
        cells[x, j] += c * weight
        marks[x, _FLAGS] |= _IN_GRAPH
        total += c
    return size, types, total


@numba.njit(cache=True, nogil=True, inline="always")
def _read_list(ix, views, frequent_min, lo, hi, weight, j, order_stamp, step, scr, size, longs):
    """Source list of order index j (the suffix-array range [lo, hi) of a graph or of the live
    layer's index): a short one (or one counted from the stream) is added to the cells,
    weight times its counts; a long one is noted in longs (read from its head later). Returns
    (list size, its distinct tokens, its count, where its tokens are: (COUNTED, lo, hi) entries
    of the suffix array, (SHORT, a, b) or (LONG, a, b) of the table))."""
    table_start, table_ids, table_counts = ix[_TABLE_START], ix[_TABLE_IDS], ix[_TABLE_COUNTS]
    long_at, long_size, long_view, read = longs
    long_at[j] = -1
    row = row_of(views, lo, hi) if hi - lo >= frequent_min else -1
    if row < 0:
        size, types, total = _count_range(ix, lo, hi, weight, j, order_stamp, step, scr, size)
        return size, types, total, _COUNTED, lo, hi
    a, b = np.int64(table_start[row]), np.int64(table_start[row + 1])
    total = views[3][row]
    if views[0][row] >= 0:  # long
        long_at[j], long_size[j], long_view[j], read[j] = a, b - a, row, 0
        return size, b - a, total, _LONG, a, b
    size = _read_short(table_ids[a:b], table_counts[a:b], weight, j, order_stamp, step, scr, size)
    return size, b - a, total, _SHORT, a, b


@numba.njit(cache=True, nogil=True)
def _type_list(ix, kind, a, b, order_stamp, scr):
    """Mark the tokens of a short or counted list as met at this order (see _new_type)."""
    if kind == _SHORT:
        for i in range(a, b):
            _new_type(np.int64(ix[_TABLE_IDS][i]), order_stamp, scr)
    elif kind == _COUNTED:
        for i in range(a, b):
            _new_type(np.int64(ix[_STREAM][np.int64(ix[_ENTRIES][i]) + 1]), order_stamp, scr)


@numba.njit(cache=True, nogil=True, inline="always")
def _in_long(x, j, views, longs):
    """Whether x is in the long list of order index j (a binary search of its by-id view)."""
    if longs[0][j] < 0:
        return False
    a = views[0][longs[2][j]]
    return _count_of(views[1], views[2], a, a + longs[1][j], x) > 0


@numba.njit(cache=True, nogil=True)
def _common(views, longs, live_views, live_longs, j):
    """How many ids the graph's and the live layer's long lists of order index j share (a
    merge of their by-id views)."""
    a, live_a = views[0][longs[2][j]], live_views[0][live_longs[2][j]]
    ids, live_ids = views[1][a : a + longs[1][j]], live_views[1][live_a : live_a + live_longs[1][j]]
    i = k = common = 0
    while i < ids.shape[0] and k < live_ids.shape[0]:
        if ids[i] == live_ids[k]:
            common += 1
            i += 1
            k += 1
        elif ids[i] < live_ids[k]:
            i += 1
        else:
            k += 1
    return common


@numba.njit(cache=True, nogil=True)
def _union_types(data, longs, live_longs, j, scr):
    """T_j: the distinct tokens of the sources of order index j: those of the long lists, and
    those of the short lists and the overlay (the typed tokens) that no long list holds."""
    views, live_views = data[1], data[3]
    typed, n_typed = scr[4], scr[0][2]
    types = 0
    for i in range(n_typed):
        x = typed[i]
        if not (_in_long(x, j, views, longs) or _in_long(x, j, live_views, live_longs)):
            types += 1
    if longs[0][j] >= 0:
        types += longs[1][j]
    if live_longs[0][j] >= 0:
        types += live_longs[1][j]
        if longs[0][j] >= 0:
            types -= _common(views, longs, live_views, live_longs, j)
    return types


@numba.njit(cache=True, nogil=True, inline="always")
def _look_up(x, j, views, longs, weight, scr):
    """Add weight times x's count in a long list of order index j (looked up by id), if any."""
    marks, cells = scr[1], scr[2]
    a = views[0][longs[2][j]]
    c = _count_of(views[1], views[2], a, a + longs[1][j], x)
    if c > 0:
        cells[x, j] += np.float64(c) * weight
        marks[x, _FLAGS] |= _IN_GRAPH


@numba.njit(cache=True, nogil=True, inline="always")
def _complete(x, m, scales, data, longs, live_longs, live_weight, step, scr, read_from):
    """Token x's mass: its counts in the long lists looked up (by id), then sum_j s_j c_j(x)
    over the orders highest first, as the mixer sums it. read_from: (order index, live or
    not, count) of the long list x was just read from, whose count needs no search (order
    index -1: none)."""
    marks, cells = scr[1], scr[2]
    marks[x, _EVALUATED] = step
    read_j, read_live, read_count = read_from
    for j in range(m):
        if longs[0][j] >= 0:
            if j == read_j and not read_live:
                cells[x, j] += np.float64(read_count) * 1.0
                marks[x, _FLAGS] |= _IN_GRAPH
            else:
                _look_up(x, j, data[1], longs, 1.0, scr)
        if live_longs[0][j] >= 0:
            if j == read_j and read_live:
                cells[x, j] += np.float64(read_count) * live_weight
                marks[x, _FLAGS] |= _IN_GRAPH
            else:
                _look_up(x, j, data[3], live_longs, live_weight, scr)
    mass = 0.0
    for j in range(m):
        mass += cells[x, j] * scales[j]
    return mass


@numba.njit(cache=True, nogil=True, inline="always")
def _orders(data, setup, t, tail_len, work):
    """The matching orders of the tail t, highest first, into work's `orders` (the union of
    the graph's, the live layer's and the overlay's; the graph's as SuffixIndex.match keeps
    them, with the longest match in long context); returns (how many, the graph's ranges
    matched, the live layer's, the overlay's occurrences)."""
    ix, _, live_ix, _, ov = data
    sep, _, max_order, window, _, _, overlay_weight, live_sep, _, live_weight = setup
    lo, hi, live_lo, live_hi, kept, succ, lengths, orders = work[:8]
    long_context = window > max_order and tail_len > max_order
    mixed = max_order if long_context else tail_len
    longest_from = LONGEST_FROM if long_context else 0
    matched = match_ranges(ix[_STREAM], sep, ix[_ENTRIES], ix[_FIRST], t, lo, hi)
    m_graph = 0
    if mixed < matched and matched >= longest_from:
        kept[m_graph] = matched
        m_graph += 1
    for order in range(min(matched, mixed), 0, -1):
        kept[m_graph] = order
        m_graph += 1
    m_live = 0
    if live_weight > 0.0:  # the live layer's orders: 1..max_order
        top = t[max(0, tail_len - max_order) :]
        m_live = match_ranges(
            live_ix[_STREAM], live_sep, live_ix[_ENTRIES], live_ix[_FIRST], top, live_lo, live_hi
        )
    n_occ = 0
    top_overlay = 0
    if overlay_weight > 0.0:
        n_occ = overlay_matches(ov[0], ov[1], ov[2], ov[3], t, tail_len, max_order, succ, lengths)
        for i in range(n_occ):
            top_overlay = max(top_overlay, lengths[i])
    m = 0
    g = 0
    for order in range(max(kept[0] if m_graph > 0 else 0, top_overlay, m_live), 0, -1):
        in_graph = g < m_graph and kept[g] == order
        if in_graph:
            g += 1
        if in_graph or order <= top_overlay or order <= m_live:
            orders[m] = order
            m += 1
    return m, m_graph, m_live, n_occ


@numba.njit(cache=True, nogil=True)
def draft_step(data, setup, tail, tail_len, width, normalise, scr, work, top_ids, top_q, top_flags):
    """One greedy step after tail[:tail_len]: fills top_ids / top_q / top_flags (the width
    likeliest tokens, q descending then id ascending) and returns (matched order, how many);
    (0, 0) at a dead end. normalise False (chains) reports the mixed mass of a multi-order step
    as it is, as Mixer.argmax does; True (trees) divides it by the weights' sum.

    data: (the graph's index arrays, their by-id views, the live layer's index arrays and
    views (the graph's again when there is no layer: live_weight 0), the overlay's arrays).

    Why so long: one pass of the mixer's arithmetic over the three sources' orders, in the
    order the mixer does it; split further, it would hand a dozen arrays between the pieces."""
    stamps, marks, cells, listed = scr[0], scr[1], scr[2], scr[3]
    ix, views, live_ix, live_views, _ = data
    _, frequent_min, _, _, mode, escape, overlay_weight, _, live_frequent_min, live_weight = setup
    lo, hi, live_lo, live_hi, kept, succ, lengths, orders, e_list, scales = work[:10]
    longs, live_longs = work[10], work[11]
    over = cells.shape[1] - 1  # the overlay-count column
    partial = over - 1  # the partial-mass column
    t = tail[:tail_len]
    m, m_graph, m_live, n_occ = _orders(data, setup, t, tail_len, work)
    if m == 0:
        return 0, 0
    if mode == BACKOFF:
        m = 1
    stamps[0] += 1
    step = stamps[0]
    size = 0  # tokens listed: by a short list or the overlay
    left = 1.0  # the mass the orders above left (Witten-Bell)
    weight_sum = 0.0
    has_long = False
    g = 0
    for j in range(m):
        order = orders[j]
        while g < m_graph and kept[g] > order:
            g += 1
        stamps[1] += 1
        order_stamp = stamps[1]
        stamps[2] = 0  # no typed tokens at this order yet
        # -- each source's list of order j: c_j = c_graph + w_live c_live + w c_ctx --
        total = 0.0
        lists = 0  # sources listing successors at this order
        types = 0  # their distinct tokens, where one source lists them all
        longs[0][j] = -1
        live_longs[0][j] = -1
        kind = live_kind = _LONG  # none: nothing to type
        a = b = live_a = live_b = 0
        if g < m_graph and kept[g] == order:
            size, types, count, kind, a, b = _read_list(
                ix, views, frequent_min, lo[order - 1], hi[order - 1], 1.0, j, order_stamp,
                step, scr, size, longs,
            )  # fmt: skip
            total += count
            lists += 1
        if order <= m_live:
            size, types_here, count, live_kind, live_a, live_b = _read_list(
                live_ix, live_views, live_frequent_min, live_lo[order - 1], live_hi[order - 1],
                live_weight, j, order_stamp, step, scr, size, live_longs,
            )  # fmt: skip
            types = types_here if lists == 0 else types
            total += count * live_weight
            lists += 1
        n_e = 0
        overlay_total = 0.0
        for i in range(n_occ):
            if lengths[i] >= order:
                x = succ[i]
                if marks[x, _OVERLAY_MARK] != order_stamp:
                    marks[x, _OVERLAY_MARK] = order_stamp
                    size = _list(x, step, scr, size)
                    cells[x, over] = 0.0
                    e_list[n_e] = x
                    n_e += 1
                cells[x, over] += 1.0
                overlay_total += 1.0
        lowest = j == m - 1
        if n_e:
            lists += 1
            if lists == 1:  # the overlay alone lists successors at this order
                types = n_e
        if lists > 1 and not lowest:  # T_j: the sources' distinct tokens
            _type_list(ix, kind, a, b, order_stamp, scr)
            _type_list(live_ix, live_kind, live_a, live_b, order_stamp, scr)
            for i in range(n_e):
                _new_type(e_list[i], order_stamp, scr)
            types = _union_types(data, longs, live_longs, j, scr)
        for i in range(n_e):
            x = e_list[i]
            cells[x, j] += cells[x, over] * overlay_weight
            marks[x, _FLAGS] |= _IN_OVERLAY
        total += overlay_total * overlay_weight
        has_long = has_long or longs[0][j] >= 0 or live_longs[0][j] >= 0
        # -- its weight --
        if m == 1:
            scales[j] = 1.0  # one order: q = c / C (the mixer's single-order path)
            weight_sum = total
        elif not lowest:
            trust = total / (total + escape * types)
            weight = left * trust
            left *= 1.0 - trust
            weight_sum += weight
            scales[j] = weight / total
        else:
            weight_sum += left
            scales[j] = left / total
    divide = weight_sum if normalise or m == 1 else 1.0
    found = 0
    if not has_long:  # every list read whole: complete every token listed
        for i in range(size):
            x = listed[i]
            mass = 0.0
            for j in range(m):
                mass += cells[x, j] * scales[j]
            found = _consider(x, mass, marks[x, _FLAGS], width, top_ids, top_q, top_flags, found)
    else:
        found = _threshold_read(
            data, m, scales, longs, live_longs, live_weight, width, step, scr, size, partial,
            top_ids, top_q, top_flags,
        )  # fmt: skip
    for i in range(found):
        top_q[i] = top_q[i] / divide
    return orders[0], found


@numba.njit(cache=True, nogil=True, inline="always")
def _gain(counts, at, j, scale):
    """What the next unread entry of long list j weighs: scale times its count (-1: read)."""
    if at[0][j] < 0 or at[3][j] >= at[1][j]:
        return -1.0
    return scale * np.float64(counts[at[0][j] + at[3][j]])


@numba.njit(cache=True, nogil=True, inline="always")
def _meet(x, m, scales, sources, width, step, scr, size, top, found, read_from):
    """A token read from a long list (read_from: see _complete): listed and completed unless
    it is already; returns (the list's size, the top list's). sources: (data, longs,
    live_longs, live_weight); top: (ids, q, flags) of the top list."""
    marks = scr[1]
    if marks[x, _EVALUATED] != step:
        size = _list(x, step, scr, size)
        data, longs, live_longs, live_weight = sources
        mass = _complete(x, m, scales, data, longs, live_longs, live_weight, step, scr, read_from)
        found = _consider(x, mass, marks[x, _FLAGS], width, top[0], top[1], top[2], found)
    return size, found


@numba.njit(cache=True, nogil=True)
def _threshold_read(
    data, m, scales, longs, live_longs, live_weight, width, step, scr, size, partial, top_ids,
    top_q, top_flags,
):  # fmt: skip
    """The width likeliest tokens where some lists are long: the heads of the long lists, the
    listed tokens that can still make the top list, then the long lists on, the one whose
    next count weighs most first, until the width-th best is above the threshold (the most a
    token met in no list yet can have). Returns how many."""
    marks, cells, listed = scr[1], scr[2], scr[3]
    sources, top = (data, longs, live_longs, live_weight), (top_ids, top_q, top_flags)
    table_ids, table_counts = data[0][_TABLE_IDS], data[0][_TABLE_COUNTS]
    live_ids, live_counts = data[2][_TABLE_IDS], data[2][_TABLE_COUNTS]
    found = 0
    for j in range(m):  # the heads of the long lists (the likeliest tokens: a strong bar)
        if longs[0][j] >= 0:
            longs[3][j] = min(width, longs[1][j])
            for i in range(longs[3][j]):
                x = np.int64(table_ids[longs[0][j] + i])
                read_from = (j, False, table_counts[longs[0][j] + i])
                size, found = _meet(
                    x, m, scales, sources, width, step, scr, size, top, found, read_from
                )
        if live_longs[0][j] >= 0:
            live_longs[3][j] = min(width, live_longs[1][j])
            for i in range(live_longs[3][j]):
                x = np.int64(live_ids[live_longs[0][j] + i])
                read_from = (j, True, live_counts[live_longs[0][j] + i])
                size, found = _meet(
                    x, m, scales, sources, width, step, scr, size, top, found, read_from
                )
    # a token no head holds counts in each long list at most what its read position holds
    most = 0.0
    for j in range(m):
        most += max(0.0, _gain(table_counts, longs, j, scales[j]))
        most += max(0.0, _gain(live_counts, live_longs, j, scales[j] * live_weight))
    for i in range(size):  # the listed tokens, each bounded by its partial mass + most
        x = listed[i]
        if marks[x, _EVALUATED] == step:
            continue
        mass = 0.0
        for j in range(m):
            mass += cells[x, j] * scales[j]
        bound = (mass + most) * (1.0 + _BOUND_SLACK)
        if found == width and bound < top_q[width - 1]:
            continue  # it can never make the top list: the width-th best only grows
        mass = _complete(x, m, scales, data, longs, live_longs, live_weight, step, scr, _NONE_READ)
        found = _consider(x, mass, marks[x, _FLAGS], width, top_ids, top_q, top_flags, found)
    while True:  # the long lists on, to the threshold
        threshold = 0.0
        best_j, best_live, best_gain = -1, False, -1.0
        for j in range(m):
            gain = _gain(table_counts, longs, j, scales[j])
            live_gain = _gain(live_counts, live_longs, j, scales[j] * live_weight)
            threshold += max(0.0, gain) + max(0.0, live_gain)
            if gain > best_gain:
                best_j, best_live, best_gain = j, False, gain
            if live_gain > best_gain:
                best_j, best_live, best_gain = j, True, live_gain
        if best_j < 0:
            break  # every long list read whole
        if found == width and top_q[width - 1] > threshold * (1.0 + _BOUND_SLACK):
            break
        if best_live:
            at = live_longs[0][best_j] + live_longs[3][best_j]
            x, count = np.int64(live_ids[at]), live_counts[at]
            live_longs[3][best_j] += 1
        else:
            at = longs[0][best_j] + longs[3][best_j]
            x, count = np.int64(table_ids[at]), table_counts[at]
            longs[3][best_j] += 1
        read_from = (best_j, best_live, count)
        size, found = _meet(x, m, scales, sources, width, step, scr, size, top, found, read_from)
    return found


@numba.njit(cache=True, nogil=True)
def _extend(tails, lens, src, dst, token, window):
    """tails[dst] = the last `window` tokens of tails[src] followed by token."""
    n = lens[src]
    keep = min(n, window - 1)
    for i in range(keep):
        tails[dst, i] = tails[src, n - keep + i]
    tails[dst, keep] = token
    lens[dst] = keep + 1


@numba.njit(cache=True, nogil=True)
def _work(window, n_ctx):
    """A draft's working arrays (draft_step): the graph's and the live layer's ranges per
    order, the graph's kept orders, the overlay's occurrences, the step's orders, the overlay
    tokens of an order, the orders' scales, and the long lists of each source (where each
    starts in its table, its size, its table row, how much of it is read; -1: none)."""
    lo = np.empty(window, np.int64)
    hi = np.empty(window, np.int64)
    live_lo = np.empty(window, np.int64)
    live_hi = np.empty(window, np.int64)
    kept = np.empty(window + 1, np.int64)
    succ = np.empty(max(n_ctx, 1), np.int64)
    lengths = np.empty(max(n_ctx, 1), np.int64)
    orders = np.empty(window + 1, np.int64)
    e_list = np.empty(max(n_ctx, 1), np.int64)
    scales = np.empty(window + 1, np.float64)
    longs = (
        np.full(window + 1, -1, np.int64),
        np.zeros(window + 1, np.int64),
        np.zeros(window + 1, np.int64),
        np.zeros(window + 1, np.int64),
    )
    live_longs = (
        np.full(window + 1, -1, np.int64),
        np.zeros(window + 1, np.int64),
        np.zeros(window + 1, np.int64),
        np.zeros(window + 1, np.int64),
    )
    return lo, hi, live_lo, live_hi, kept, succ, lengths, orders, e_list, scales, longs, live_longs


@numba.njit(cache=True, nogil=True)
def greedy_chain(data, setup, root, k, scr, out_tokens, out_orders, out_sources, out_probs):
    """A greedy chain of up to k drafts after root (the context's last <= window tokens): each
    the argmax of q, its running probability in out_probs. Returns its length."""
    window = setup[3]
    work = _work(window, data[4][3])
    tails = np.empty((2, window), np.int64)
    lens = np.zeros(2, np.int64)
    n = root.shape[0]
    tails[0, :n] = root
    lens[0] = n
    top_ids = np.empty(1, np.int64)
    top_q = np.empty(1, np.float64)
    top_flags = np.empty(1, np.int8)
    running = 1.0
    for i in range(k):
        cur = i & 1
        order, found = draft_step(
            data, setup, tails[cur], lens[cur], 1, False, scr, work, top_ids, top_q, top_flags
        )
        if found == 0:
            return i
        running *= top_q[0]
        out_tokens[i] = top_ids[0]
        out_orders[i] = order
        out_sources[i] = _source(top_flags[0])
        out_probs[i] = running
        _extend(tails, lens, cur, 1 - cur, top_ids[0], window)
    return k


@numba.njit(cache=True, nogil=True, inline="always")
def _source(flags):
    """0 graph, 1 overlay, 2 both (SOURCE_NAMES)."""
    if not flags & _IN_OVERLAY:
        return 0
    return 2 if flags & _IN_GRAPH else 1


@numba.njit(cache=True, nogil=True)
def _tree_step(data, setup, s, width, scr, work, tails, lens, steps):
    """Draft step s of a tree (after tails[s]) for its `width` likeliest successors, into
    steps = (ids, q, flags, size, order, width asked)."""
    step_ids, step_q, step_flags, step_size, step_order, step_width = steps
    order, size = draft_step(
        data, setup, tails[s], lens[s], width, True, scr, work, step_ids[s], step_q[s],
        step_flags[s],
    )  # fmt: skip
    step_order[s], step_size[s], step_width[s] = order, size, width
    return size


@numba.njit(cache=True, nogil=True)
def greedy_tree(
    data, setup, root, nodes, depth_limit, width, scr, out_tokens, out_parents, out_orders,
    out_sources, out_probs,
):  # fmt: skip
    """A greedy draft tree of up to `nodes` tokens, at most depth_limit deep, grown best-first
    on path probability as TreeDrafter.propose_greedy grows it (the same heap order: candidates
    keyed by (-path probability, push count)). Returns its size.

    A step first finds its FIRST_WIDTH likeliest successors; most nodes never offer more (a
    sibling is offered only once the one before it is taken), and a step asked for fewer costs
    less (fewer tokens to complete). One whose next sibling is past them is stepped again for
    twice as many, up to `width` (the same successors first: the ranking is one total order)."""
    window = setup[3]
    work = _work(window, data[4][3])
    most = nodes + 1  # steps: the root's, then one per node at most
    tails = np.empty((most, window), np.int64)
    lens = np.zeros(most, np.int64)
    steps = (
        np.empty((most, width), np.int64),  # successor ids
        np.empty((most, width), np.float64),  # their q
        np.empty((most, width), np.int8),  # their flags
        np.zeros(most, np.int64),  # how many
        np.zeros(most, np.int64),  # the matched order
        np.zeros(most, np.int64),  # the width asked
    )
    step_ids, step_q, step_flags, step_size, step_order, step_width = steps
    first_width = min(FIRST_WIDTH, width)
    cap = 2 * nodes + 2
    # a min-heap of candidates: (-path probability, push count, candidate)
    heap = [(0.0, 0, 0)]  # typed by a first entry
    heap.pop()
    # candidates: (parent node, parent's path probability, depth, step, rank in the step)
    c_ints, c_pprob = np.empty((4, cap), np.int64), np.empty(cap, np.float64)
    c_parent, c_depth, c_step, c_rank = c_ints[0], c_ints[1], c_ints[2], c_ints[3]
    tails[0, : root.shape[0]] = root
    lens[0] = root.shape[0]
    used_steps = 1
    ties = 0
    if _tree_step(data, setup, 0, first_width, scr, work, tails, lens, steps) > 0:
        c_parent[0], c_pprob[0], c_depth[0], c_step[0], c_rank[0] = -1, 1.0, 0, 0, 0
        heapq.heappush(heap, (-step_q[0, 0], ties, 0))
        ties += 1
    made = 0
    while heap and made < nodes:
        key, _, c = heapq.heappop(heap)
        parent, parent_prob, depth = c_parent[c], c_pprob[c], c_depth[c]
        s, rank = c_step[c], c_rank[c]
        index = made
        path_prob = -key
        token = step_ids[s, rank]
        out_tokens[index] = token
        out_parents[index] = parent
        out_orders[index] = step_order[s]
        out_sources[index] = _source(step_flags[s, rank])
        out_probs[index] = path_prob
        made += 1
        if made == nodes:  # its sibling and child could never be taken: step neither
            break
        rank += 1
        if rank == step_size[s] == step_width[s] < width:  # more successors than asked for
            _tree_step(data, setup, s, min(width, 2 * step_width[s]), scr, work, tails, lens, steps)
        if rank < step_size[s]:  # its next sibling
            c = ties
            c_parent[c], c_pprob[c], c_depth[c], c_step[c], c_rank[c] = (
                parent, parent_prob, depth, s, rank,
            )  # fmt: skip
            heapq.heappush(heap, (-parent_prob * step_q[s, rank], ties, c))
            ties += 1
        if depth + 1 < depth_limit:  # its first child
            child = used_steps
            _extend(tails, lens, s, child, token, window)
            if _tree_step(data, setup, child, first_width, scr, work, tails, lens, steps):
                used_steps += 1
                c = ties
                c_parent[c], c_pprob[c], c_depth[c], c_step[c], c_rank[c] = (
                    index, path_prob, depth + 1, child, 0,
                )  # fmt: skip
                heapq.heappush(heap, (-path_prob * step_q[child, 0], ties, c))
                ties += 1
    return made


class CompiledDrafts:
    """Greedy chains and trees of one indexed graph through the kernels (thread-safe: each
    thread drafts with scratch arrays of its own)."""

    def __init__(self, graph: NGramGraph) -> None:
        self.graph = graph
        self.scratch_shape = (graph.vocab_size, graph.max_order + 1)
        # ranges of fewer entries are never in the index's table (0: look every range up)
        self.frequent_min = int(graph.meta.index.get("frequent_min", 0) or 0)
        self.warm_up()

    def warm_up(self) -> None:
        """Draft a chain and a tree once, without and with a live layer (whose index's arrays
        may type otherwise than the graph's): the first call of a process loads the kernels'
        machine code for these array types (numba's cache, about 0.3 s) or, on a fresh install,
        compiles it (about 30 s each on 2 cores), which no request must wait for."""
        live = LiveLayer(self.graph.max_order, build_share=math.inf)
        live.learn([0, 0, 0])
        notice = threading.Timer(2.0, log.info, args=(COMPILING,))  # only if it takes long
        notice.start()
        try:
            for layer in (None, live):
                for tree_nodes in (0, 2):
                    params = DraftParams(k=2, tree_nodes=tree_nodes, escape_weight=1.0)
                    self.propose(np.zeros(1, np.int64), params.with_defaults(), None, layer)
        finally:
            notice.cancel()

    @staticmethod
    def serves(params: DraftParams) -> bool:
        """Whether the kernels draft these (resolved) params: greedy, witten-bell or backoff
        mixing."""
        return params.strategy == "greedy" and params.effective_mixing in ("witten-bell", "backoff")

    def propose(
        self,
        context_ids: Sequence[int] | np.ndarray,
        params: DraftParams,
        overlay: ContextIndex | None,
        live: LiveLayer | None = None,
    ) -> DraftProposal:
        """A greedy chain (tree_nodes 0) or tree after context_ids (checked, params resolved),
        with the live layer's counts as of its last compiled index (LiveLayer.compiled_index)."""
        graph = self.graph
        index = graph.suffix_index
        if index is None:
            raise GraphFormatError(f"graph {graph.path} is closed")
        graph.note_reader()
        window = graph.window  # the context tokens a lookup reads
        root = np.asarray(context_ids[max(0, len(context_ids) - window) :], dtype=np.int64)
        mode = WITTEN_BELL if params.effective_mixing == "witten-bell" else BACKOFF
        escape = float(params.escape_weight or 0.0)
        ov = overlay.arrays() if overlay is not None else NO_OVERLAY
        views = views_of(index)
        live_index = live.compiled_index(graph.vocab_size) if live is not None else None
        if live_index is None:  # the graph's arrays stand in, at weight 0 (never read)
            live_data, live_setup = (index.kernel_arrays, views), (index.sep, 0, 0.0)
        else:
            live_data = (live_index.kernel_arrays, views_of(live_index))
            live_setup = (live_index.sep, live_index.frequent_min, float(live.weight))
        setup = (index.sep, self.frequent_min, graph.max_order, window, mode, escape)
        setup += (float(params.overlay_weight), *live_setup)
        head = ((index.kernel_arrays, views, *live_data, ov), setup, root)
        scratch = thread_scratch(*self.scratch_shape)
        proposal = DraftProposal()
        if params.drafts_tree:
            size = params.tree_nodes
            tokens, parents = np.empty(size, np.int64), np.empty(size, np.int64)
            orders, sources = np.empty(size, np.int64), np.empty(size, np.int8)
            probs = np.empty(size, np.float64)
            made = greedy_tree(
                *head, size, params.k, TREE_WIDTH, scratch, tokens, parents, orders, sources, probs
            )
            proposal.parents = parents[:made].tolist()
        else:
            size = params.k
            tokens, orders = np.empty(size, np.int64), np.empty(size, np.int64)
            sources, probs = np.empty(size, np.int8), np.empty(size, np.float64)
            made = greedy_chain(*head, size, scratch, tokens, orders, sources, probs)
        proposal.token_ids = tokens[:made].tolist()
        proposal.distributions = [point_mass(token) for token in proposal.token_ids]
        proposal.matched_orders = orders[:made].tolist()
        proposal.sources = [SOURCE_NAMES[s] for s in sources[:made].tolist()]
        proposal.path_probs = probs[:made].tolist()
        return proposal
