"""Block-wise k-way merge of sorted runs with bounded memory.

Every run is memory-mapped; each step reads one *block* (``block_rows / k`` rows) from each of
the k runs, takes the rows up to the *bound* (the smallest last key among blocks that are not
their run's end: no later row of any run can be <= it), sorts and reduces them (summing counts
of equal keys), yields them, and advances each run past the rows it gave. Memory per step is
about ``block_rows`` rows whatever the runs' sizes.

With more than ``fan_in`` runs, groups of ``fan_in`` runs are first merged into intermediate runs
on disk (passes of a multi-way merge sort), so that blocks never shrink to a few rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from builder.disk import open_array, save_array
from builder.keys import keys_le, sort_reduce

FAN_IN = 32  # runs merged at once


def merge_runs(
    runs: Sequence[tuple[Path, Path]], block_rows: int, fan_in: int = FAN_IN
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield (keys ``[n, words]`` uint64, counts ``[n]`` uint64) blocks, sorted, unique, in order.

    Keys are strictly increasing across blocks too. Intermediate runs (``*-pass<p>-*.npy``) are
    written beside the first run and deleted once merged.
    """
    runs = list(runs)
    level = 0
    while len(runs) > fan_in:
        level += 1
        runs = [
            _merge_to_disk(runs[i : i + fan_in], block_rows, level, i // fan_in)
            for i in range(0, len(runs), fan_in)
        ]
    yield from _merge(runs, block_rows)


def _merge_to_disk(
    runs: list[tuple[Path, Path]], block_rows: int, level: int, index: int
) -> tuple[Path, Path]:
    """Merge runs into one new run file pair (written block by block), deleting the inputs."""
    total = sum(np.load(c, mmap_mode="r", allow_pickle=False).shape[0] for _, c in runs)
    words = np.load(runs[0][0], mmap_mode="r", allow_pickle=False).shape[1]
    stem = runs[0][0].name.split("-run")[0]
    kpath = runs[0][0].parent / f"{stem}-pass{level:02d}-{index:05d}-keys.npy"
    cpath = kpath.with_name(kpath.name.replace("-keys.npy", "-counts.npy"))
    keys_out = open_array(kpath, np.uint64, (total, words))
    counts_out = open_array(cpath, np.uint64, (total,))
    n = 0
    for keys, counts in _merge(runs, block_rows):
        keys_out[n : n + keys.shape[0]] = keys
        counts_out[n : n + keys.shape[0]] = counts
        n += keys.shape[0]
    keys_out.flush()
    counts_out.flush()
    del keys_out, counts_out
    if n < total:  # equal keys were summed: keep only the rows written
        for path in (kpath, cpath):
            trimmed = path.with_name(path.name + ".tmp.npy")
            save_array(trimmed, np.load(path, mmap_mode="r", allow_pickle=False)[:n])
            os.replace(trimmed, path)
    for k, c in runs:
        k.unlink(missing_ok=True)
        c.unlink(missing_ok=True)
    return kpath, cpath


def _merge(
    runs: Sequence[tuple[Path, Path]], block_rows: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One k-way merge pass over runs (see the module docstring)."""
    if not runs:
        return
    loaded = [
        (
            np.load(k, mmap_mode="r", allow_pickle=False),
            np.load(c, mmap_mode="r", allow_pickle=False),
        )
        for k, c in runs
    ]
    per_run = max(1, block_rows // len(loaded))
    if len(loaded) == 1:
        keys, counts = loaded[0]
        for a in range(0, keys.shape[0], per_run):
            yield np.array(keys[a : a + per_run]), np.array(counts[a : a + per_run])
        return
    pos = [0] * len(loaded)
    while True:
        blocks = []  # (run index, keys block, counts block)
        bound: tuple[int, ...] | None = None
        for i, (keys, counts) in enumerate(loaded):
            if pos[i] >= keys.shape[0]:
                continue
            end = pos[i] + per_run
            kb, cb = np.array(keys[pos[i] : end]), np.array(counts[pos[i] : end])
            blocks.append((i, kb, cb))
            if end < keys.shape[0]:
                last = tuple(int(x) for x in kb[-1])
                bound = last if bound is None or last < bound else bound
        if not blocks:
            return
        take_k, take_c = [], []
        for i, kb, cb in blocks:
            if bound is None:
                n = kb.shape[0]
            elif kb.shape[1] == 1:
                n = int(np.searchsorted(kb[:, 0], np.uint64(bound[0]), side="right"))
            else:
                n = int(keys_le(kb, np.array(bound, dtype=np.uint64)).sum())
            if n:
                take_k.append(kb[:n])
                take_c.append(cb[:n])
                pos[i] += n
        yield sort_reduce(np.concatenate(take_k), np.concatenate(take_c))
