"""Read-only access to a published n-gram graph (see :mod:`speculant.graph_format`).

Terms: an *order-o context* is the last o token ids; its *successors* are the token ids seen after
it in the corpus, with their *counts*. A context *matches* at order o when the corpus has it,
followed by a successor.

*Long context* (opt-in, :meth:`NGramGraph.use_long_context`): a graph with a suffix index
(formats 2 and 3) is matched over the last ``window`` tokens of a context (LONG_CONTEXT, 16,
suggested). Drafting mixes the orders 1..max_order (the build's ``--order``) as ever, and the
*longest match* as one more order when it is longer, and at least LONGEST_FROM tokens: a context
seen verbatim that far back says more than its last few tokens (measured in docs/learning.md,
"Longer contexts": more tokens per forward on distilled graphs, at a slower Propose).

The graph is memory-mapped read-only (format 3: its one LMDB environment, the index's arrays
zero-copy views of it): pages are read from the file on demand and belong to the page cache,
shared by every process on the host, so the process RSS does not grow with the graph's size.
:meth:`NGramGraph.match` is the drafters' lookup: the successor counts of every matching order
of a context, from the suffix index (formats 2 and 3, :mod:`speculant.suffix_index`,
:mod:`speculant.graph_index`) or from the per-order LMDB databases of a format 1 graph (one
B-tree ``get`` per order in a long-lived per-thread read transaction; the values zero-copy views
into the map that stay valid while the graph is open).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import heapq
import logging
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from speculant.config import TUNABLE_FIELDS, DraftParams
from speculant.errors import InvalidArgumentError
from speculant.graph_format import (
    INDEXED_FORMATS,
    KEY_DTYPE,
    MAX_SUPPORTED_ORDER,
    GraphFormatError,
    GraphMeta,
    MappedFile,
    SharedGraphEnv,
    decode_successors,
    libc_function,
    open_graph_env,
    order_db_name,
    read_meta,
    resident_bytes,
)
from speculant.graph_index import open_index
from speculant.graph_lmdb import decode_values, match_orders
from speculant.graph_manifest import MANIFEST_FILE
from speculant.suffix_index import MAX_CONTEXT, SuffixIndex

_MADV_DONTNEED = 4


_MADVISE = libc_function("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int])


def graph_id_of(path: Path) -> str:
    """Names one build of a graph: the first 16 hex digits of its manifest's SHA-256 (the
    manifest lists every file's checksum); "" without one."""
    try:
        return hashlib.sha256((path / MANIFEST_FILE).read_bytes()).hexdigest()[:16]
    except OSError:
        return ""


def folder_bytes(path: Path) -> int:
    """Bytes of the files in a graph folder (0 if unreadable)."""
    try:
        return sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    except OSError:
        return 0


# Long context (suffix index, opt-in): the shortest longest match that counts beside the orders
# 1..max_order (measured: docs/benchmarks.md).
LONGEST_FROM = 8
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


# Successor counts of the matching orders of a context: (orders, highest first; successor ids
# [n] per order; their counts [n] per order), successors sorted by count descending, then id.
Matches = tuple[list[int], list[np.ndarray], list[np.ndarray]]


class NGramGraph:
    """A graph opened read-only: successor lookups and its meta record."""

    def __init__(
        self,
        path: Path,
        env: SharedGraphEnv,
        meta: GraphMeta,
        index: SuffixIndex | None = None,
        guards: Sequence[MappedFile] = (),
    ) -> None:
        """index: the suffix index of a format 2 or 3 graph (None: a format 1 graph's per-order
        databases); guards: its files' damage checks (closed with the graph)."""
        self.path = path
        self.meta = meta
        self.graph_id = graph_id_of(path)  # this build (speculant.graph_catalog)
        # the tuned mixing parameters (``speculant tune --write``), defaults for every request
        self.draft_defaults = tuned_draft_defaults(meta, path)
        self.max_order = meta.max_order
        # the context tokens a drafting lookup reads (see use_long_context)
        self.window = self.max_order
        self.vocab_size = meta.vocab_size
        self._env = env
        self._index = index
        self._guards = list(guards)
        # format 1: dbs[o] is the handle of the chain of order o; dbs[0] is unused.
        self._dbs: list[lmdb._Database | None] = [None]
        for order in range(1, meta.max_order + 1 if index is None else 1):
            try:
                self._dbs.append(env.open_db(order_db_name(order), create=False))
            except lmdb.Error as exc:
                env.close()
                raise GraphFormatError(
                    f"corrupt graph {path}: the chain of order {order} is missing ({exc})"
                ) from exc
        self._local = threading.local()
        self._txns: list[lmdb.Transaction] = []
        self._index_readers = 0  # threads that have looked up in the suffix index
        self._txns_lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, path: str | Path) -> NGramGraph:
        """Open a published graph; GraphFormatError if missing, unfinished, corrupt or unknown."""
        path = Path(path)
        if not path.is_dir():
            raise GraphFormatError(f"graph not found: {path} is not a directory")
        env = open_graph_env(path, checksum=True)  # the manifest, checked before mapping
        guards: list[MappedFile] = []
        try:
            meta = read_meta(env, path)
            indexed = meta.format_version in INDEXED_FORMATS
            top = MAX_CONTEXT if indexed else MAX_SUPPORTED_ORDER
            if not 1 <= meta.max_order <= top or meta.vocab_size < 1:
                raise GraphFormatError(
                    f"corrupt graph {path}: max_order={meta.max_order}, "
                    f"vocab_size={meta.vocab_size}"
                )
            index = open_index(path, env, meta, guards) if indexed else None
            return cls(path, env, meta, index, guards)
        except BaseException:
            for guard in guards:
                guard.close()
            env.close()
            raise

    def use_long_context(self, window: int) -> int:
        """Draft from contexts of up to `window` tokens: the longest match joins the orders
        1..max_order (see *long context* above); 0 or a window <= max_order: off. A format 1
        graph has no index to match longer contexts in: it stays at max_order (logged).
        Returns the window in effect."""
        if not 0 <= window <= MAX_CONTEXT:
            raise InvalidArgumentError("long_context", f"must be in 0..{MAX_CONTEXT}, got {window}")
        if window > self.max_order and self._index is None:
            log.warning(
                "%s is a format 1 graph: no long context (rebuild it with speculant build)",
                self.path,
            )
            window = 0
        self.window = max(self.max_order, window)
        return self.window

    @property
    def file_id(self) -> tuple[int, int]:
        """(device, inode) of the data file this graph maps (a republished graph has another)."""
        return self._env.file_id

    @property
    def suffix_index(self) -> SuffixIndex | None:
        """The suffix index (formats 2, 3; None for format 1 and once closed)."""
        return self._index

    @property
    def indexed(self) -> bool:
        """Whether the graph has a suffix index (formats 2, 3): contexts up to MAX_CONTEXT match."""
        return self._index is not None

    def damage(self) -> str | None:
        """Why a mapped file of the graph can no longer be trusted (it shrank or changed since
        it was verified, or a read hit its truncated end), or None (speculant.graph_format)."""
        for guard in (self._env.mapped, *self._guards):
            reason = guard.damage()
            if reason is not None:
                return reason
        return None

    # -- lookups -------------------------------------------------------------------------------

    def match(self, tail: bytes, every_order: bool = True, top: int | None = None) -> Matches:
        """The successor counts of the orders that match the context ending ``tail``
        (graph_format.tail_key), highest first, from ``top`` (default: the tail's length)
        down; every_order False: the highest matching order only. With long context on, a tail
        longer than max_order adds its longest match instead (see *long context* above)."""
        if self._closed:
            raise GraphFormatError(f"graph {self.path} is closed")
        top = len(tail) >> 2 if top is None else top
        if self._index is not None:
            self.note_reader()
            ids = np.frombuffer(tail, dtype=KEY_DTYPE).astype(np.int64)
            if self.window > self.max_order and ids.shape[0] > self.max_order:
                return self._index.match(ids, top, every_order, self.max_order, LONGEST_FROM)
            return self._index.match(ids, top, every_order)
        orders, values = match_orders(tail, self._txn(), self._dbs, every_order, top)
        return orders, *decode_values(values)

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

    def note_reader(self) -> None:
        """Count this thread as a reader of an indexed graph, at its first lookup (format 1:
        its transaction counts); the compiled drafts, which read the index directly, call it."""
        if getattr(self._local, "reader", False):
            return
        self._local.reader = True
        with self._txns_lock:
            self._index_readers += 1

    def readers(self) -> int:
        """How many threads have read the graph (format 1: the read transactions open on it,
        one per such thread)."""
        with self._txns_lock:
            return len(self._txns) + self._index_readers

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
        orders, ids, counts = self.match(key.astype(KEY_DTYPE).tobytes(), False)
        if not orders or orders[0] != order:
            return None
        return ids[0].astype(np.int64), counts[0].astype(np.int64)

    def frequent_contexts(self, order: int, n: int) -> list[tuple[tuple[int, ...], int]]:
        """The n contexts of the order with the highest total count (ties: lowest ids), with
        their totals, by a scan."""
        if self._index is not None:
            return self._index.frequent_contexts(order, n)
        best: list[tuple[int, tuple[int, ...]]] = []  # min-heap of (count, negated ids)
        with self._env.begin(db=self._dbs[order], buffers=True) as txn:
            for key, value in txn.cursor():
                _, counts = decode_successors(value)
                total = int(counts.sum(dtype=np.int64))
                entry = (total, tuple(-int(i) for i in np.frombuffer(key, dtype=KEY_DTYPE)))
                if len(best) < n:
                    heapq.heappush(best, entry)
                elif entry > best[0]:
                    heapq.heapreplace(best, entry)
        return [(tuple(-i for i in ids), total) for total, ids in sorted(best, reverse=True)]

    def contexts(self, order: int) -> Iterator[tuple[tuple[int, ...], np.ndarray, np.ndarray]]:
        """Every context of the order with its successors: (ids, successor ids [n], counts
        [n]), successors by count descending, then id ascending (a scan: for tests and tools).
        Format 1: in key order; formats 2, 3: in the index's order."""
        if self._index is not None:
            yield from self._index.contexts(order)
            return
        with self._env.begin(db=self._dbs[order]) as txn:
            for key, value in txn.cursor():
                ids, counts = decode_successors(value)
                context = tuple(np.frombuffer(key, dtype=KEY_DTYPE).tolist())
                yield context, ids.astype(np.int64), counts.astype(np.int64)

    def sample_contexts(self, order: int, n: int, rng: np.random.Generator) -> list[list[int]]:
        """n contexts of the given order that exist in the graph, near uniformly random.

        Format 2: the contexts ending at random positions of the corpus. Format 1: each the
        first key at or after a random key (LMDB's ``set_range``). Used by the benchmark to
        build realistic requests.
        """
        if self._index is not None:
            return self._index.sample_contexts(order, n, rng)
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
        """(start, end) addresses of this graph's file mappings in this process (Linux)."""
        regions = list(self._env.mapped.regions)
        for guard in self._guards:
            regions.extend(guard.regions)
        return regions

    def resident_bytes(self) -> int:
        """Bytes of this graph's mapped files in the host's page cache now (Linux ``mincore``;
        0 elsewhere): one copy, shared by every process that maps the graph, whether or not
        this process has touched the pages since it last released them."""
        return 0 if self._closed else resident_bytes(self._map_regions())

    def release_pages(self) -> int:
        """Unmap the graph pages this process has touched; return the bytes advised.

        Lookups fault pages of the read-only maps into the process (and the kernel maps
        neighbouring cached pages too), so RSS would creep towards the graph's size. The pages
        stay in the OS page cache: the next lookup that needs one takes a cheap minor fault.
        Safe at any time, also while other threads read (the mappings are read-only, shared).
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
        """Close the environment and the index; lookups afterwards raise GraphFormatError."""
        if self._closed:
            return
        self._closed = True
        with self._txns_lock:
            for txn in self._txns:
                with contextlib.suppress(lmdb.Error):
                    txn.abort()
            self._txns.clear()
        self._index = None  # the maps close once the last array view is gone (graph_store)
        for guard in self._guards:
            guard.close()
        self._env.close()

    def __enter__(self) -> NGramGraph:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
