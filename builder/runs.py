"""Sorted partial counts ("runs") per order, buffered in memory and spilled to disk.

A *run* of order o is a pair of ``.npy`` files (saved without pickle): ``keys`` ``[n, words]``
uint64 (see :mod:`builder.keys`), sorted and unique, and ``counts`` ``[n]`` uint64. Chunk counts
are buffered until ``spill_rows`` rows are held (all orders together), then each order's buffer
is merged in memory (a stable sort of concatenated sorted pieces) and written as one run, so the
memory held is bounded by ``spill_rows`` whatever the corpus size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from builder.disk import save_array
from builder.keys import sort_reduce


class RunStore:
    """Holds partial counts per order and spills them as sorted runs into ``directory``."""

    def __init__(self, directory: Path, max_order: int, spill_rows: int) -> None:
        self.directory = directory
        self.spill_rows = max(1, spill_rows)
        self._buffers: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {
            o: [] for o in range(1, max_order + 1)
        }
        self._rows = 0
        self.runs: dict[int, list[tuple[Path, Path]]] = {o: [] for o in range(1, max_order + 1)}

    def add(self, order: int, keys: np.ndarray, counts: np.ndarray) -> None:
        """Buffer sorted unique (keys ``[n, words]``, counts ``[n]``) of one chunk."""
        self._buffers[order].append((keys, counts))
        self._rows += keys.shape[0]
        if self._rows >= self.spill_rows:
            self.spill()

    def spill(self) -> None:
        """Write every order's buffered counts as one sorted run."""
        for order, pieces in self._buffers.items():
            if not pieces:
                continue
            keys = np.concatenate([k for k, _ in pieces])
            counts = np.concatenate([c for _, c in pieces])
            pieces.clear()
            keys, counts = sort_reduce(keys, counts)  # stable sort: merges the sorted pieces
            index = len(self.runs[order])
            kpath = self.directory / f"order{order:02d}-run{index:05d}-keys.npy"
            cpath = self.directory / f"order{order:02d}-run{index:05d}-counts.npy"
            save_array(kpath, keys)
            save_array(cpath, counts)
            self.runs[order].append((kpath, cpath))
        self._rows = 0
