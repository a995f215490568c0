"""Writing an n-gram graph into LMDB with sorted appends (format: :mod:`speculant.graph_format`).

Merged n-gram rows arrive sorted by (context, successor); rows are grouped by context (a
context's rows may straddle two blocks: the last group is carried to the next block), each
group becomes one entry (key: big-endian context ids; value: successor ids then counts, by count
descending then id ascending) and entries are appended with ``putmulti(append=True)`` in
batched transactions. When the map is full the batch is retried after doubling the map size;
the meta record is written last, in its own final transaction.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

import lmdb
import numpy as np

from builder.disk import write_failure
from builder.errors import BuildError
from builder.keys import KeyCodec, group_starts
from speculant.graph_format import (
    DATA_FILE,
    KEY_DTYPE,
    MAX_SUPPORTED_ORDER,
    META_DB,
    META_KEY,
    VALUE_DTYPE,
    GraphMeta,
    OrderStats,
    order_db_name,
)

MAX_COUNT = np.iinfo(np.uint32).max
TXN_ENTRIES = 65_536  # entries per write transaction


def encode_entries(
    codec: KeyCodec, keys: np.ndarray, counts: np.ndarray
) -> tuple[list[bytes], list[bytes]]:
    """LMDB keys and values for complete context groups of sorted rows.

    keys: ``[n, words]`` uint64 rows sorted by (context, successor); counts: ``[n]`` uint64.
    Returns one (key, value) per distinct context, in key order.
    """
    order = codec.length - 1
    n = keys.shape[0]
    starts = group_starts(codec.context_keys(keys))  # [g]
    sizes = np.diff(np.append(starts, n))  # [g]
    if counts.size and int(counts.max()) > MAX_COUNT:
        raise BuildError("an n-gram occurs more than 2**32-1 times: counts overflow uint32")
    succ = codec.unpack(keys, order, order + 1)[:, 0]  # [n] uint32
    group = np.repeat(np.arange(starts.size), sizes)  # [n]
    perm = np.lexsort((succ, -counts.astype(np.int64), group))  # count desc, id asc per group
    rank = np.arange(n) - np.repeat(starts, sizes)  # [n] position inside its group
    base = np.repeat(2 * starts, sizes) + rank  # [n]
    flat = np.empty(2 * n, dtype=VALUE_DTYPE)  # per group: ids then counts
    flat[base] = succ[perm]
    flat[base + np.repeat(sizes, sizes)] = counts[perm]
    buf = flat.tobytes()
    bounds = (8 * np.append(starts, n)).tolist()
    values = [buf[a:b] for a, b in itertools.pairwise(bounds)]
    ctx = codec.unpack(keys[starts], 0, order).astype(KEY_DTYPE)  # [g, order] big-endian
    kbuf = ctx.tobytes()
    width = 4 * order
    lmdb_keys = [kbuf[i : i + width] for i in range(0, len(kbuf), width)]
    return lmdb_keys, values


GRAPH_HINT = "the graph is written beside --out: free space on that disk"


class GraphWriter:
    """Creates the LMDB environment of a graph in an (empty, temporary) directory."""

    def __init__(self, path: Path, map_size: int) -> None:
        self.path = path
        self.env = lmdb.open(
            str(path),
            map_size=max(map_size, 1 << 24),
            max_dbs=MAX_SUPPORTED_ORDER + 2,
            subdir=True,
            lock=False,  # one writer, in a private directory
            sync=False,  # synced once at the end (close)
            metasync=False,
            readahead=False,
            meminit=False,
        )

    def _grow(self) -> None:
        self.env.set_mapsize(self.env.info()["map_size"] * 2)

    def _put_batch(self, db, items: list[tuple[bytes, bytes]]) -> None:
        while True:
            try:
                with self.env.begin(write=True, db=db) as txn:
                    added = txn.cursor().putmulti(items, append=True)[1]
                if added != len(items):
                    raise BuildError(f"LMDB refused {len(items) - added} entries (keys unsorted?)")
                return
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:  # e.g. the disk is full
                raise write_failure(self.path / DATA_FILE, exc, GRAPH_HINT) from exc

    def write_order(
        self, codec: KeyCodec, blocks: Iterable[tuple[np.ndarray, np.ndarray]]
    ) -> OrderStats:
        """Write one order's chain from merged sorted blocks; returns its statistics."""
        order = codec.length - 1
        db = self.env.open_db(order_db_name(order), create=True)
        stats = OrderStats(order=order, contexts=0, ngrams=0, total_count=0)
        pending: list[tuple[bytes, bytes]] = []
        carry: tuple[np.ndarray, np.ndarray] | None = None
        for keys, counts in blocks:
            if carry is not None:
                keys = np.concatenate([carry[0], keys])
                counts = np.concatenate([carry[1], counts])
            # hold back the last context: its rows may continue in the next block
            cut = int(group_starts(codec.context_keys(keys))[-1])
            carry = (keys[cut:], counts[cut:])
            if cut:
                self._add(stats, codec, keys[:cut], counts[:cut], pending, db)
        if carry is not None and carry[0].shape[0]:
            self._add(stats, codec, carry[0], carry[1], pending, db)
        if pending:
            self._put_batch(db, pending)
        return stats

    def _add(self, stats, codec, keys, counts, pending, db) -> None:
        lmdb_keys, values = encode_entries(codec, keys, counts)
        stats.contexts += len(lmdb_keys)
        stats.ngrams += keys.shape[0]
        stats.total_count += int(counts.sum())
        pending.extend(zip(lmdb_keys, values, strict=True))
        if len(pending) >= TXN_ENTRIES:
            self._put_batch(db, pending)
            pending.clear()

    def write_meta(self, meta: GraphMeta) -> None:
        """Write the meta record (last: a graph without it is unfinished)."""
        db = self.env.open_db(META_DB, create=True)
        while True:
            try:
                with self.env.begin(write=True, db=db) as txn:
                    txn.put(META_KEY, meta.to_json())
                return
            except lmdb.MapFullError:
                self._grow()
            except lmdb.Error as exc:
                raise write_failure(self.path / DATA_FILE, exc, GRAPH_HINT) from exc

    def close(self) -> None:
        """Flush everything to disk (fsync) and close the environment."""
        try:
            self.env.sync(True)
        except lmdb.Error as exc:
            raise write_failure(self.path / DATA_FILE, exc, GRAPH_HINT) from exc
        finally:
            self.env.close()
