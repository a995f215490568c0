"""Read-only access to a published n-gram graph (see :mod:`speculant.graph_format`).

Terms: an *order-o context* is the last o token ids; its *successors* are the token ids seen after
it in the corpus, with their *counts*. A context *matches* at order o when the chain of order o
holds it.

The LMDB environment is memory-mapped read-only: pages are read from the file on demand and belong
to the page cache, so the process RSS does not grow with the graph's size. Each thread keeps one
long-lived read transaction (the graph never changes once published), so a lookup is one B-tree
``get`` per order with no transaction set-up, and values are zero-copy views into the map that
stay valid while the graph is open.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from speculant.errors import InvalidArgumentError
from speculant.graph_format import (
    KEY_DTYPE,
    MAX_SUPPORTED_ORDER,
    GraphFormatError,
    GraphMeta,
    SharedGraphEnv,
    decode_successors,
    open_graph_env,
    order_db_name,
    read_meta,
)
from speculant.types import TUNABLE_FIELDS, DraftParams

_MADV_DONTNEED = 4


def _load_madvise() -> Callable[..., int] | None:
    """libc's madvise, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _load_madvise()


log = logging.getLogger(__name__)


def tuned_draft_defaults(meta: GraphMeta, path: str | Path = "") -> dict[str, Any]:
    """The graph's tuned mixing parameters (meta ``tuned.params``), checked: only
    TUNABLE_FIELDS with valid values; {} when the graph was never tuned. GraphFormatError
    otherwise."""
    params = meta.tuned.get("params", {}) if isinstance(meta.tuned, dict) else None
    if not isinstance(params, dict):
        raise GraphFormatError(f"corrupt graph {path}: meta 'tuned' is not a JSON object")
    unknown = sorted(set(params) - set(TUNABLE_FIELDS))
    if unknown:
        raise GraphFormatError(
            f"corrupt graph {path}: tuned parameters {unknown} are not mixing parameters"
        )
    try:
        DraftParams(**params).validate()
    except (InvalidArgumentError, TypeError) as exc:
        raise GraphFormatError(f"corrupt graph {path}: bad tuned parameter: {exc}") from exc
    return dict(params)


class NGramGraph:
    """A graph opened read-only: per-order successor lookups and its meta record."""

    def __init__(self, path: Path, env: SharedGraphEnv, meta: GraphMeta) -> None:
        self.path = path
        self.meta = meta
        # the tuned mixing parameters (``speculant tune --write``), defaults for every request
        self.draft_defaults = tuned_draft_defaults(meta, path)
        self.max_order = meta.max_order
        self.vocab_size = meta.vocab_size
        self._env = env
        # dbs[o] is the handle of the chain of order o; dbs[0] is unused.
        self._dbs: list[lmdb._Database | None] = [None]
        for order in range(1, meta.max_order + 1):
            try:
                self._dbs.append(env.open_db(order_db_name(order), create=False))
            except lmdb.Error as exc:
                env.close()
                raise GraphFormatError(
                    f"corrupt graph {path}: the chain of order {order} is missing ({exc})"
                ) from exc
        self._local = threading.local()
        self._txns: list[lmdb.Transaction] = []
        self._txns_lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, path: str | Path) -> NGramGraph:
        """Open a published graph; GraphFormatError if missing, unfinished, corrupt or unknown."""
        path = Path(path)
        if not path.is_dir():
            raise GraphFormatError(f"graph not found: {path} is not a directory")
        env = open_graph_env(path, checksum=True)  # the manifest, checked before mapping
        try:
            meta = read_meta(env, path)
        except BaseException:
            env.close()
            raise
        if not 1 <= meta.max_order <= MAX_SUPPORTED_ORDER or meta.vocab_size < 1:
            env.close()
            raise GraphFormatError(
                f"corrupt graph {path}: max_order={meta.max_order}, vocab_size={meta.vocab_size}"
            )
        try:
            return cls(path, env, meta)
        except GraphFormatError:
            env.close()
            raise

    @property
    def file_id(self) -> tuple[int, int]:
        """(device, inode) of the data file this graph maps (a republished graph has another)."""
        return self._env.file_id

    def damage(self) -> str | None:
        """Why the mapped data file can no longer be trusted (it shrank or changed since it
        was verified, or a read hit its truncated end), or None (speculant.map_guard)."""
        return self._env.mapped.damage()

    # -- lookups -------------------------------------------------------------------------------

    def _txn(self) -> lmdb.Transaction:
        """This thread's long-lived read transaction (values it returns are views into the map)."""
        if self._closed:
            raise GraphFormatError(f"graph {self.path} is closed")
        txn = getattr(self._local, "txn", None)
        if txn is None:
            txn = self._env.begin(buffers=True)
            with self._txns_lock:
                self._txns.append(txn)
            self._local.txn = txn
        return txn

    def read_transactions(self) -> int:
        """How many read transactions are open on the graph (one per thread that looked up)."""
        with self._txns_lock:
            return len(self._txns)

    def raw_lookup(self) -> tuple[lmdb.Transaction, list[lmdb._Database | None]]:
        """(this thread's transaction, db handle per order) for the drafter's hot loop.

        ``txn.get(key, db=dbs[o])`` returns a memoryview into the map, valid until close().
        """
        return self._txn(), self._dbs

    def successors(self, context_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray] | None:
        """Successors of the whole context (order = len(context_ids)): (ids [n], counts [n]).

        Sorted by count descending, then id ascending; None when the context does not match.
        The arrays are copies (safe to keep after close()).
        """
        order = len(context_ids)
        if not 1 <= order <= self.max_order:
            return None
        key = np.asarray(context_ids, dtype=np.int64)
        if key.min() < 0 or key.max() > 0xFFFFFFFF:
            return None
        value = self._txn().get(key.astype(KEY_DTYPE).tobytes(), db=self._dbs[order])
        if value is None:
            return None
        ids, counts = decode_successors(value)
        return ids.astype(np.int64), counts.astype(np.int64)

    def sample_contexts(self, order: int, n: int, rng: np.random.Generator) -> list[list[int]]:
        """n contexts of the given order that exist in the graph, near uniformly random keys.

        Each is the first key at or after a random key (LMDB's ``set_range``); used by the
        benchmark to build realistic requests.
        """
        out: list[list[int]] = []
        with self._env.begin(db=self._dbs[order]) as txn:
            cursor = txn.cursor()
            if not cursor.first():
                return out
            for _ in range(n):
                probe = rng.integers(0, self.vocab_size, size=order).astype(KEY_DTYPE).tobytes()
                if not cursor.set_range(probe) and not cursor.first():
                    break
                out.append(np.frombuffer(cursor.key(), dtype=KEY_DTYPE).astype(int).tolist())
        return out

    # -- resident memory -----------------------------------------------------------------------

    def _map_regions(self) -> list[tuple[int, int]]:
        """(start, end) addresses of this graph's data.mdb mapping in this process (Linux)."""
        return self._env.mapped.regions

    def release_pages(self) -> int:
        """Unmap the graph pages this process has touched; return the bytes advised.

        Lookups fault pages of the read-only map into the process (and the kernel maps
        neighbouring cached pages too), so RSS would creep towards the graph's size. The pages
        stay in the OS page cache: the next lookup that needs one takes a cheap minor fault.
        Safe at any time, also while other threads read (the mapping is read-only and shared).
        """
        if self._closed or _MADVISE is None:
            return 0
        released = 0
        for start, end in self._map_regions():
            if _MADVISE(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED) == 0:
                released += end - start
        return released

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the environment; lookups afterwards raise GraphFormatError."""
        if self._closed:
            return
        self._closed = True
        with self._txns_lock:
            for txn in self._txns:
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
            self._txns.clear()
        self._env.close()

    def __enter__(self) -> NGramGraph:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


# The hot path's reads. Drafting fetches the graph's per-thread transaction once per proposal
# (NGramGraph.raw_lookup) and passes it here: values are memoryviews into the map, decoded
# without copying.


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


def match_successors(
    tail: bytes, txn: lmdb.Transaction, dbs: list, every_order: bool
) -> tuple[list[int], list[np.ndarray], list[np.ndarray]]:
    """(matching orders, successor ids, counts) after tail, highest order first."""
    orders, values = match_orders(tail, txn, dbs, every_order)
    return orders, *decode_values(values)
