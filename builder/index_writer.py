"""Writing a graph's suffix index from its parts (see :mod:`speculant.suffix_index`).

A *part* is a piece of the corpus with its sorted entries: a task's output
(:mod:`builder.index_task`) or, when appending, the graph appended to. The writer concatenates
the parts' streams into the graph's stream (in order: the base first), merges their entries
(pairwise, each merge a linear pass that compares backward strings, the intermediate arrays on
disk), then derives from the sorted entries what the index also holds: where each token's
entries start, the ranges of at least ``frequent_min`` entries with their successor counts, and
the statistics of each order. Memory: the merges and the scans run over memory-mapped files,
so the build's RSS stays about the page cache's share of them.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builder.disk import open_array, save_array
from builder.errors import BuildError
from speculant.graph_format import OrderStats
from speculant.suffix_index import (
    ENTRIES_FILE,
    FIRST_FILE,
    FREQUENT_MIN,
    MAX_CONTEXT,
    STREAM_FILE,
    TABLE_COUNTS_FILE,
    TABLE_IDS_FILE,
    TABLE_RANGES_FILE,
    TABLE_START_FILE,
    WEIGHTS_FILE,
    common_prefixes_into,
    first_offsets,
    frequent_ranges,
    merge_into,
    order_statistics,
    range_tables,
    separator,
    stream_dtype,
)

log = logging.getLogger("builder")

MAX_STREAM = 0xFFFFFFFF  # stream positions are uint32


@dataclass(frozen=True)
class Part:
    """A part's arrays, as ``.npy`` files or arrays (a graph's, mapped): its stream, its sorted
    entries (positions in that stream) and, when its positions carry weights, their weights."""

    stream: Path | np.ndarray
    entries: Path | np.ndarray
    weights: Path | np.ndarray | None = None


def _load(source: Path | np.ndarray) -> np.ndarray:
    if isinstance(source, np.ndarray):
        return source
    return np.load(source, mmap_mode="r", allow_pickle=False)


def write_index(
    parts: list[Part],
    out: Path,
    scratch: Path,
    vocab_size: int,
    max_order: int,
    frequent_min: int = FREQUENT_MIN,
) -> tuple[list[OrderStats], dict[str, Any]]:
    """Write the index arrays of the parts as files into the directory out; (the statistics of
    orders 1..max_order, the meta's ``index`` record). scratch: a directory for the merge's
    intermediate arrays."""
    dtype = stream_dtype(vocab_size)
    sep = separator(dtype)
    streams = [_load(part.stream) for part in parts]
    total = sum(s.shape[0] for s in streams)
    if total > MAX_STREAM:
        raise BuildError(
            f"the corpus has {total:,} tokens with its separators; a graph holds at most "
            f"{MAX_STREAM:,}: build several graphs"
        )
    weighted = any(part.weights is not None for part in parts)
    stream = open_array(out / STREAM_FILE, dtype, (total,))
    weights = open_array(out / WEIGHTS_FILE, np.uint8, (total,)) if weighted else None
    starts = []
    at = 0
    for part, piece in zip(parts, streams, strict=True):
        if piece.dtype != dtype:
            raise BuildError(f"{part.stream}: its tokens are {piece.dtype}, the graph's {dtype}")
        stream[at : at + piece.shape[0]] = piece
        if weights is not None:
            weights[at : at + piece.shape[0]] = 1 if part.weights is None else _load(part.weights)
        starts.append(at)
        at += piece.shape[0]
    stream.flush()
    entries = _merged_entries(parts, starts, stream, sep, out, scratch)
    log.info("merged %d part(s): %d entries", len(parts), entries.shape[0])
    position_weights = np.empty(0, np.uint8) if weights is None else weights
    orders, ranges = _write_tables(
        stream, sep, entries, position_weights, out, scratch, vocab_size, max_order, frequent_min
    )
    index = {
        "stream_tokens": int(total),
        "entries": int(entries.shape[0]),
        "frequent_min": frequent_min,
        "table_ranges": ranges,
        "weighted": weighted,
        "max_context": MAX_CONTEXT,
    }
    return orders, index


def _write_tables(
    stream: np.ndarray,
    sep: int,
    entries: np.ndarray,
    weights: np.ndarray,
    out: Path,
    scratch: Path,
    vocab_size: int,
    max_order: int,
    frequent_min: int,
) -> tuple[list[OrderStats], int]:
    """Write what the sorted entries give: each token's first entry, and the ranges of at
    least frequent_min entries with their successor counts; (the statistics of orders
    1..max_order, the ranges tabled)."""
    save_array(out / FIRST_FILE, first_offsets(stream, entries, vocab_size), hint="")
    lcp = open_array(scratch / f"lcp-{secrets.token_hex(4)}.npy", np.int32, (entries.shape[0],))
    common_prefixes_into(stream, sep, entries, lcp)
    lo, hi = frequent_ranges(lcp, frequent_min)
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    table_start, table_ids, table_counts = range_tables(
        stream, entries, weights, lo, hi, vocab_size
    )
    save_array(out / TABLE_RANGES_FILE, np.stack([lo, hi], axis=1).astype(np.uint32), hint="")
    save_array(out / TABLE_START_FILE, table_start.astype(np.uint64), hint="")
    save_array(out / TABLE_IDS_FILE, table_ids, hint="")
    save_array(out / TABLE_COUNTS_FILE, table_counts, hint="")
    figures = order_statistics(stream, sep, entries, lcp, weights, max_order, vocab_size)
    orders = [
        OrderStats(order=o + 1, contexts=int(c), ngrams=int(g), total_count=int(t))
        for o, (c, g, t) in enumerate(figures.tolist())
    ]
    return orders, int(lo.shape[0])


def _merged_entries(
    parts: list[Part],
    starts: list[int],
    stream: np.ndarray,
    sep: int,
    out: Path,
    scratch: Path,
) -> np.ndarray:
    """The parts' entries in stream positions, merged into out's entries file (memory-mapped)."""
    runs: list[np.ndarray] = []
    for part, start in zip(parts, starts, strict=True):
        local = _load(part.entries)
        if start == 0:
            runs.append(local)
        else:  # positions in the graph's stream
            shifted = open_array(
                scratch / f"run-{secrets.token_hex(4)}.npy", np.uint32, (local.shape[0],)
            )
            shifted[:] = local.astype(np.int64) + start
            runs.append(shifted)
    while len(runs) > 2:  # pairwise, so each merge joins runs of similar sizes
        merged = []
        for i in range(0, len(runs), 2):
            if i + 1 == len(runs):
                merged.append(runs[i])
                continue
            left, right = runs[i], runs[i + 1]
            size = left.shape[0] + right.shape[0]
            into = open_array(scratch / f"run-{secrets.token_hex(4)}.npy", np.uint32, (size,))
            merge_into(stream, sep, left, right, into)
            merged.append(into)
        runs = merged
    size = sum(run.shape[0] for run in runs)
    entries = open_array(out / ENTRIES_FILE, np.uint32, (size,))
    if len(runs) == 2:
        merge_into(stream, sep, runs[0], runs[1], entries)
    elif runs:
        entries[:] = runs[0]
    entries.flush()
    return entries
