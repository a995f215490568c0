"""The suffix index inside a graph's LMDB environment (format 3, :mod:`speculant.graph_format`).

Each array of the index (:data:`speculant.suffix_index.INDEX_FILES`, and the weights of a
weighted graph) is one value of the named database ``index``, its key the array's name
(``stream``, ``entries``, ...), its bytes the array's raw little-endian data; its dtype and
shape are in the meta record (``index.arrays``). LMDB stores a value larger than about half a
page in consecutive *overflow pages*, its bytes starting 16 bytes into the first one, so such an
array is one contiguous, 16-byte aligned range of the map: a reader makes its numpy array right
over the map (no copy; the pages belong to the page cache, shared by every process on the host).
A value is at most 4 GiB - 1 bytes (LMDB stores its size in 32 bits), so a graph's stream and
entries are at most that: about a billion entries. Values small enough to sit inside a leaf page
(under 2 KiB) are not aligned and are copied.

A reader's arrays stay valid while any of them is alive, whatever the graph object does: they
hold a *lease*, the read transaction (buffers) and a handle on the shared environment, released
when the last array is gone (so a cached draft never points into an unmapped map).
"""

from __future__ import annotations

import contextlib
import weakref
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from speculant.errors import GraphFormatError

INDEX_DB = b"index"  # the database holding the index's arrays
MAX_VALUE_BYTES = 0xFFFFFFFF  # LMDB's largest value


def array_key(name: str) -> bytes:
    """The key of an index array: its file name (speculant.suffix_index) without ``.npy``."""
    return name.removesuffix(".npy").encode()


def _release(txn: lmdb.Transaction, env: Any) -> None:
    with contextlib.suppress(lmdb.Error):
        txn.abort()
    env.close()


class _Lease:
    """What keeps the arrays' pages mapped: a read transaction and an environment handle."""

    def __init__(self, env: Any) -> None:
        self.env = env.share()
        self.txn = self.env.begin(buffers=True)
        weakref.finalize(self, _release, self.txn, self.env)


class _MapArray:
    """An array's memory in the map, for numpy (``__array_interface__``), holding the lease."""

    def __init__(self, value: memoryview, dtype: np.dtype, shape: tuple[int, ...], lease: _Lease):
        address = np.frombuffer(value, np.uint8).__array_interface__["data"][0]
        self.__array_interface__ = {
            "shape": shape,
            "typestr": dtype.str,
            "data": (address, True),  # read-only
            "version": 3,
        }
        self._value = value
        self._lease = lease


def read_arrays(env: Any, layout: dict[str, Any], path: Path | str) -> dict[str, np.ndarray]:
    """The index arrays named in ``layout`` ({file name: [dtype, shape]}, the meta's
    ``index.arrays``), read-only views over the map; GraphFormatError when one is missing or
    has the wrong size."""
    try:
        db = env.open_db(INDEX_DB, create=False)
    except lmdb.Error as exc:
        raise GraphFormatError(f"corrupt graph {path}: no index database ({exc})") from exc
    lease = _Lease(env)
    arrays: dict[str, np.ndarray] = {}
    for name, (dtype_str, shape) in layout.items():
        dtype, shape = np.dtype(dtype_str), tuple(int(n) for n in shape)
        value = lease.txn.get(array_key(name), db=db)
        if value is None:
            raise GraphFormatError(f"corrupt graph {path}: index array {name} is missing")
        expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if len(value) != expected:
            raise GraphFormatError(
                f"corrupt graph {path}: index array {name} has {len(value)} bytes, "
                f"its shape {list(shape)} of {dtype} needs {expected}"
            )
        array = np.asarray(_MapArray(value, dtype, shape, lease)) if expected else None
        if array is None or not array.flags.aligned:  # empty, or a small value in a leaf page
            array = np.frombuffer(bytes(value), dtype).reshape(shape)
        arrays[name] = array
    return arrays


def array_layout(arrays: dict[str, np.ndarray]) -> dict[str, list[Any]]:
    """The meta's ``index.arrays`` record of the arrays: {file name: [dtype, shape]}."""
    return {name: [a.dtype.str, list(a.shape)] for name, a in arrays.items()}
