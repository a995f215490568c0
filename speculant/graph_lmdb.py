"""A format 1 graph's reads: one LMDB ``get`` per order of a context, the values memoryviews into
the map, decoded without copying (speculant.graph_format)."""

from __future__ import annotations

import lmdb
import numpy as np

from speculant.graph_format import decode_successors


def match_orders(
    tail: bytes, txn: lmdb.Transaction, dbs: list, every_order: bool, top: int | None = None
) -> tuple[list[int], list[memoryview]]:
    """Backoff lookup: (matching orders, their LMDB values), highest order first.

    tail: graph_format.tail_key of the context; every_order=False stops at the highest match;
    top (default: the tail's length) is the highest order looked up.
    """
    orders: list[int] = []
    values: list[memoryview] = []
    get = txn.get
    for order in range(len(tail) >> 2 if top is None else top, 0, -1):
        value = get(tail[-4 * order :], db=dbs[order])
        if value is not None:
            orders.append(order)
            values.append(value)
            if not every_order:
                break
    return orders, values


def decode_values(values: list[memoryview]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Zero-copy views (successor ids [n] uint32, counts [n] uint32) of each LMDB value."""
    ids_list: list[np.ndarray] = []
    counts_list: list[np.ndarray] = []
    for value in values:
        ids, counts = decode_successors(value)
        ids_list.append(ids)
        counts_list.append(counts)
    return ids_list, counts_list
