"""The on-disk format of an n-gram graph (a directory holding one LMDB environment), and its
memory maps guarded against the file changing under them.

Terms: an *order-o context* is a sequence of o token ids; its *successors* are the tokens that
followed it in the corpus, with their *counts*. A graph answers, for any context of up to its
max order, its successors and their counts.

Layout (format version 3), in the graph directory:

- ``data.mdb``, an LMDB environment: named database ``meta``, key ``b"meta"`` -> UTF-8 JSON
  object (see :class:`GraphMeta`), and named database ``index``, one key per array of the
  suffix index (:mod:`speculant.suffix_index`, :mod:`speculant.graph_store`): the corpus as one
  token stream, its positions sorted by the text before them, and a table of the successor
  counts of frequent contexts: 6 to 8 bytes a corpus token for the stream and the positions
  (suffix_index), 1 to 3 more for the table (docs/graph.md), whatever the order, so a graph
  answers contexts of any length up to ``suffix_index.MAX_CONTEXT`` tokens. Readers map the
  arrays zero-copy. The meta record is written last, in the builder's final transaction: a
  graph without it is unfinished and is never served.
- ``manifest.json``: the size and SHA-256 of every other file, written at publish.

Format version 2 (built 2026-12-03 to 2026-12-04) had the same arrays as ``.npy`` files beside
``data.mdb``; format version 1 (before 2026-12-03) kept one LMDB database per order,
``order:<o>``: key = the o context ids as big-endian uint32, value = n successor ids as
little-endian uint32, then their n counts, sorted by count descending, then id ascending. Both
are still read and served; appending to a format 2 graph writes format 3; appending to a format
1 graph or distilling into it asks for a rebuild.

No pickle: keys and values are fixed-width integers or raw little-endian arrays (format 2: ``.npy``
files loaded with ``allow_pickle=False``), the meta record is JSON.

The maps, guarded (the second half of this module): surviving a graph file that shrinks or
changes under its memory map.
A graph's ``data.mdb`` is mapped read-only (LMDB). When the file is truncated while mapped (an
operator's ``truncate``, a copy written in place over it), the next read of a page past its new
end raises SIGBUS, which kills a Python process without a word; a file rewritten in place
changes under the readers. Terms: a *mapped file* is such a file, with the size and modification
time it was verified at (against its manifest) and the address ranges of its maps in this
process; it is *damaged* once it no longer has that size or time. Two defences:

1. :meth:`MappedFile.damage` compares the file's size and modification time (``fstat`` of a
   descriptor held on the mapped inode, about a microsecond) with the verified ones. The draft
   service checks before and after every call it answers from a graph, and never reads a
   damaged one again (the call answers UNAVAILABLE).
2. For the reads already in progress when the file shrinks, a SIGBUS handler: a fault inside a
   mapped file's map gets an anonymous zero page mapped over the faulting page (the read then
   completes, reading zeros) and marks the file damaged, so the check after the call refuses
   its answer. A SIGBUS anywhere else gets the handler that was there before (the default: the
   process dies, as it would have). Linux on x86-64 and arm64 only (elsewhere, defence 1 alone).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import mmap
import os
import platform
import signal
import struct
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import lmdb
import numpy as np

from speculant.errors import GraphFormatError
from speculant.graph_manifest import DATA_FILE, verify_manifest

FORMAT_VERSION = 3  # what the builder writes: the suffix index in the LMDB environment
NPY_FORMAT = 2  # the suffix index in .npy files beside data.mdb (read, and appended to)
TABLES_FORMAT = 1  # the per-order LMDB tables of graphs built before the suffix index (read only)
INDEXED_FORMATS = (NPY_FORMAT, FORMAT_VERSION)  # the formats with a suffix index
READ_FORMATS = (TABLES_FORMAT, NPY_FORMAT, FORMAT_VERSION)
MAX_SUPPORTED_ORDER = 10  # of format 1 graphs (suffix_index.MAX_CONTEXT for format 2)
META_DB = b"meta"
META_KEY = b"meta"

KEY_DTYPE = np.dtype(">u4")  # context ids in keys: big-endian so byte order == numeric order
VALUE_DTYPE = np.dtype("<u4")  # successor ids and counts in values
_PACK_ONE = struct.Struct(">I").pack  # one id as a key part


def order_db_name(order: int) -> bytes:
    """Name of the LMDB database holding the chain of the given order."""
    return f"order:{order}".encode()


def encode_context(context_ids: np.ndarray | list[int]) -> bytes:
    """Pack an order-o context (o token ids) into its LMDB key."""
    return np.asarray(context_ids, dtype=KEY_DTYPE).tobytes()


def tail_key(context_ids: Sequence[int] | np.ndarray, max_order: int) -> bytes:
    """The last <= max_order ids of a context as big-endian uint32: the key of its highest
    order; the key of order o <= that is its last 4*o bytes."""
    tail = [int(t) for t in context_ids[max(0, len(context_ids) - max_order) :]]
    return struct.pack(f">{len(tail)}I", *tail)


def extend_tail(tail: bytes, token: int, max_order: int) -> bytes:
    """tail_key of the context that `tail` ends, followed by `token`."""
    return (tail + _PACK_ONE(token))[-4 * max_order :]


def encode_successors(successor_ids: np.ndarray, counts: np.ndarray) -> bytes:
    """Pack successors and their counts (already sorted by count desc, id asc) into a value."""
    return np.concatenate(
        [np.asarray(successor_ids, dtype=VALUE_DTYPE), np.asarray(counts, dtype=VALUE_DTYPE)]
    ).tobytes()


def decode_successors(value: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
    """Unpack a value into (successor_ids [n] uint32, counts [n] uint32), without copying."""
    flat = np.frombuffer(value, dtype=VALUE_DTYPE)
    n = flat.size // 2
    return flat[:n], flat[n:]


@dataclass
class OrderStats:
    """Per-order statistics of a graph."""

    order: int
    contexts: int  # distinct contexts of this length
    ngrams: int  # distinct (context, successor) pairs
    total_count: int  # occurrences counted


@dataclass
class GraphMeta:
    """The meta record of a graph (stored as JSON under ``meta``/``meta``)."""

    format_version: int
    max_order: int
    tokenizer_name: str
    tokenizer_fingerprint: str
    vocab_size: int
    corpus_documents: int
    corpus_tokens: int
    orders: list[OrderStats]
    build_params: dict[str, Any] = field(default_factory=dict)
    built_at: str = ""  # ISO 8601 UTC
    build_seconds: float = 0.0
    # The graph's *version*: 1 for a build from scratch, one more for each ``build --append``
    # (graphs built before versions existed read as 1).
    version: int = 1
    # One record per build that added corpus to this graph, oldest first: its version, inputs,
    # datasets, documents, tokens and time (empty for graphs built before versions existed).
    sources: list[dict[str, Any]] = field(default_factory=list)
    # Written by ``speculant tune --write``: {"params": {mixing parameter: value}, and how they
    # were measured}. The drafter uses tuned["params"] for every mixing parameter a request
    # leaves unset (see speculant.config.TUNABLE_FIELDS). Empty: the built-in defaults.
    tuned: dict[str, Any] = field(default_factory=dict)
    # Formats 2 and 3: the suffix index (speculant.suffix_index): stream_tokens (its length,
    # SEPs included), entries, frequent_min (the smallest range tabled), table_ranges, weighted
    # (whether positions carry weights), max_context; format 3 also arrays: {name: [dtype,
    # shape]} of the arrays in the database ``index`` (speculant.graph_store).
    index: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> GraphMeta:
        """Parse and type-check a meta record (TypeError naming the first bad field)."""
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise TypeError("the meta record is not a JSON object")
        orders = data.get("orders", [])
        if not isinstance(orders, list) or not all(isinstance(o, dict) for o in orders):
            raise TypeError("meta field 'orders' must be a list of objects")
        for i, order in enumerate(orders):
            _check_types(order, _ORDER_TYPES, f"orders[{i}].")
        data["orders"] = [
            OrderStats(**{k: v for k, v in o.items() if k in _ORDER_TYPES}) for o in orders
        ]
        known = {f.name for f in fields(cls)}
        # Fields added by later versions of the format are ignored (they are optional).
        data = {k: v for k, v in data.items() if k in known}
        _check_types(data, _META_TYPES)
        return cls(**data)


# The JSON types of the meta record's fields (bool is not an int here).
_META_TYPES: dict[str, tuple[type, ...]] = {
    "format_version": (int,),
    "max_order": (int,),
    "tokenizer_name": (str,),
    "tokenizer_fingerprint": (str,),
    "vocab_size": (int,),
    "corpus_documents": (int,),
    "corpus_tokens": (int,),
    "build_params": (dict,),
    "built_at": (str,),
    "build_seconds": (int, float),
    "version": (int,),
    "sources": (list,),
    "tuned": (dict,),
    "index": (dict,),
}
_ORDER_TYPES: dict[str, tuple[type, ...]] = {
    "order": (int,),
    "contexts": (int,),
    "ngrams": (int,),
    "total_count": (int,),
}


def _check_types(
    data: dict[str, Any], types: dict[str, tuple[type, ...]], prefix: str = ""
) -> None:
    """TypeError naming the first field of data whose value is not of its type (or missing,
    for the fields without a default)."""
    for name, allowed in types.items():
        if name not in data:
            continue  # a missing required field fails in the constructor, by name
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, allowed):
            expected = " or ".join(t.__name__ for t in allowed)
            raise TypeError(f"meta field '{prefix}{name}' must be {expected}, got {value!r:.40}")


class SharedGraphEnv:
    """A handle on a process-wide shared, read-only LMDB environment of one graph file.

    LMDB forbids opening the same environment twice in one process, yet several readers may
    want the same graph (an embedded decoder and a draft service in one process, graph-info, a
    second drafter). Every :func:`open_graph_env` of the same ``data.mdb`` (same device and
    inode: a graph republished at the same path is a new file, and gets a new environment)
    shares one environment; it closes when the last handle is closed. Attribute access is
    forwarded to the ``lmdb.Environment``.
    """

    _lock = threading.RLock()  # re-entrant: __del__ may run while a thread holds it
    _open: ClassVar[dict[tuple[int, int], tuple[lmdb.Environment, MappedFile, int]]] = {}

    def __init__(self, env: lmdb.Environment, key: tuple[int, int], mapped: MappedFile) -> None:
        self._env = env
        self._key = key
        self.mapped = mapped  # the data file's damage check (speculant.graph_format)
        self._closed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def share(self) -> SharedGraphEnv:
        """Another handle on this same environment (the same file, whatever is published at
        its path now); close each handle."""
        with self._lock:
            if self._closed:
                raise GraphFormatError("the graph's environment is closed")
            env, mapped, users = self._open[self._key]
            self._open[self._key] = (env, mapped, users + 1)
        return SharedGraphEnv(env, self._key, mapped)

    @property
    def file_id(self) -> tuple[int, int]:
        """(device, inode) of the data file this environment maps."""
        return self._key

    @classmethod
    def acquire(cls, path: Path, size: int) -> SharedGraphEnv:
        """The shared environment of path's data file, verified to have `size` bytes."""
        fd = os.open(path / DATA_FILE, os.O_RDONLY | os.O_CLOEXEC)
        stat = os.fstat(fd)
        key = (stat.st_dev, stat.st_ino)
        with cls._lock:
            env, mapped, users = cls._open.get(key, (None, None, 0))
            if env is None or mapped is None:
                mapped = MappedFile(path / DATA_FILE, size, fd)
                try:
                    env = _open_lmdb(path)
                except BaseException:
                    mapped.close()
                    raise
                mapped.find_regions()
            else:
                os.close(fd)
            cls._open[key] = (env, mapped, users + 1)
        return cls(env, key, mapped)

    def __del__(self) -> None:
        # A handle dropped without close() (e.g. ``read_meta(open_graph_env(p), p)``) releases.
        # Not contextlib.suppress: at interpreter exit this module's globals may already be None.
        try:  # noqa: SIM105
            self.close()
        except Exception:
            pass

    def close(self) -> None:
        """Release this handle; the environment closes with its last handle."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            env, mapped, users = self._open[self._key]
            if users > 1:
                self._open[self._key] = (env, mapped, users - 1)
            else:
                del self._open[self._key]
                env.close()
                mapped.close()


def _open_lmdb(path: Path) -> lmdb.Environment:
    try:
        return lmdb.open(
            str(path),
            readonly=True,
            lock=False,
            readahead=False,
            max_dbs=MAX_SUPPORTED_ORDER + 3,
            subdir=True,
            create=False,
        )
    except lmdb.Error as exc:
        raise GraphFormatError(f"cannot open graph {path}: {exc}") from exc


def open_graph_env(path: str | Path, checksum: bool = False) -> SharedGraphEnv:
    """Open a published graph's LMDB environment read-only and memory-mapped.

    The data file is checked against the graph's manifest before it is mapped (its size, and
    with checksum its SHA-256 too): a graph without a manifest, or whose data file differs, is
    refused (GraphFormatError), since reading a truncated map would kill the process. Once
    open, ``env.mapped`` tells whether the file shrank or changed since (speculant.graph_format).

    The graph is immutable once published, so no lock file is used (works on read-only media);
    readahead is off so that random lookups only page in what they touch. Close the handle
    when done (see :class:`SharedGraphEnv`).
    """
    path = Path(path)
    if not path.is_dir():
        raise GraphFormatError(f"graph not found: {path} is not a directory")
    if not (path / DATA_FILE).is_file():
        raise GraphFormatError(f"not a graph: {path} has no {DATA_FILE}")
    before = (path / DATA_FILE).stat()
    size = verify_manifest(path, checksum=checksum)
    env = SharedGraphEnv.acquire(path, size)
    if env.file_id != (before.st_dev, before.st_ino):  # republished meanwhile: check that one
        env.close()
        return open_graph_env(path, checksum)
    return env


def read_meta(env: lmdb.Environment | SharedGraphEnv, path: str | Path = "") -> GraphMeta:
    """Read and check the meta record: present, parseable and of a supported version."""
    try:
        meta_db = env.open_db(META_DB, create=False)
        with env.begin(db=meta_db) as txn:
            raw = txn.get(META_KEY)
    except lmdb.NotFoundError:
        raw = None
    except lmdb.Error as exc:
        raise GraphFormatError(f"corrupt graph {path}: {exc}") from exc
    if raw is None:
        raise GraphFormatError(
            f"unfinished graph {path}: no meta record (the build did not complete)"
        )
    try:
        meta = GraphMeta.from_json(raw)
    except (ValueError, TypeError) as exc:
        raise GraphFormatError(f"corrupt graph {path}: unreadable meta record ({exc})") from exc
    if meta.format_version not in READ_FORMATS:
        readable = ", ".join(str(v) for v in READ_FORMATS)
        raise GraphFormatError(
            f"graph {path} has format version {meta.format_version}; this version of "
            f"speculant reads versions {readable}: rebuild the graph with `speculant build`"
        )
    return meta


log = logging.getLogger(__name__)

_PROT_READ = 1
_MAP_PRIVATE = 0x02
_MAP_FIXED = 0x10
_MAP_ANONYMOUS = 0x20
_SA_SIGINFO = 4
_SI_ADDR_OFFSET = 16  # siginfo_t.si_addr on 64-bit Linux (after three ints and padding)
_PAGE = mmap.PAGESIZE


class MappedFile:
    """A file this process maps read-only, checked for damage (see the module docstring)."""

    def __init__(self, path: Path, size: int, fd: int) -> None:
        """path: the file; size: its verified size; fd: a descriptor on the mapped inode
        (this object closes it)."""
        self.path = path
        self.size = size
        self._fd = fd
        stat = os.fstat(fd)
        self.mtime_ns = stat.st_mtime_ns
        self.file_id = (stat.st_dev, stat.st_ino)
        self.regions: list[tuple[int, int]] = []  # [start, end) of each map of the file
        self.fault_reason: str | None = None  # set by the SIGBUS handler

    def find_regions(self) -> None:
        """Find the file's maps in /proc/self/maps (after LMDB mapped it) and guard them."""
        self.regions = map_regions(self.file_id)
        _register(self)

    def damage(self) -> str | None:
        """Why the file is damaged (shrunk, modified, a read past its end), or None."""
        if self.fault_reason is not None:
            return self.fault_reason
        try:
            stat = os.fstat(self._fd)
        except OSError as exc:
            return f"cannot stat {self.path}: {exc}"
        if stat.st_size < self.size:
            return f"{self.path} shrank from {self.size} to {stat.st_size} bytes while mapped"
        if stat.st_size != self.size or stat.st_mtime_ns != self.mtime_ns:
            return f"{self.path} was modified in place while mapped"
        return None

    def close(self) -> None:
        """Stop guarding (call once the file is unmapped) and close the descriptor."""
        _unregister(self)
        with contextlib.suppress(OSError):
            os.close(self._fd)


def map_regions(file_id: tuple[int, int]) -> list[tuple[int, int]]:
    """[start, end) of this process's maps of the file with this (device, inode) (Linux)."""
    device, inode = file_id
    wanted_dev = f"{os.major(device):02x}:{os.minor(device):02x}"
    regions = []
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) >= 5 and fields[4] == str(inode) and fields[3] == wanted_dev:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    regions.append((start, end))
    except OSError:
        pass
    return regions


def libc_function(name: str, argtypes: list) -> Callable[..., int] | None:
    """libc's function `name` (returning an int), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


_MINCORE = libc_function("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])
_LOW_BIT = bytes(b & 1 for b in range(256))  # mincore's residency bit of each page's byte


def resident_bytes(regions: list[tuple[int, int]]) -> int:
    """Bytes of these maps' file pages in the host's page cache now (``mincore``; 0 off
    Linux): for a file map, whether or not this process has touched the pages, so one count,
    shared by every process that maps the file."""
    if _MINCORE is None:
        return 0
    resident = 0
    for start, end in regions:
        pages = (end - start + _PAGE - 1) // _PAGE
        vector = (ctypes.c_ubyte * pages)()
        if _MINCORE(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vector) == 0:
            resident += sum(bytes(vector).translate(_LOW_BIT)) * _PAGE
    return resident


# The guarded maps: (start, end, file). Replaced whole (never mutated), so the signal handler
# reads a consistent tuple without a lock.
_guarded: tuple[tuple[int, int, MappedFile], ...] = ()
_guard_lock = threading.Lock()


def _register(mapped: MappedFile) -> None:
    global _guarded
    _install_handler()
    with _guard_lock:
        _guarded = _guarded + tuple((s, e, mapped) for s, e in mapped.regions)


def _unregister(mapped: MappedFile) -> None:
    global _guarded
    with _guard_lock:
        _guarded = tuple(entry for entry in _guarded if entry[2] is not mapped)


class _SigAction(ctypes.Structure):
    """glibc's struct sigaction (the same layout on x86-64 and arm64)."""

    _fields_ = [
        ("sa_sigaction", ctypes.c_void_p),
        ("sa_mask", ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong)))),
        ("sa_flags", ctypes.c_int),
        ("sa_restorer", ctypes.c_void_p),
    ]


_HANDLER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_handler: object = None  # the installed callback (kept alive), None before, False if unsupported
_previous = _SigAction()
_libc: ctypes.CDLL | None = None


def _on_sigbus(signum: int, info: int, _context: int) -> None:
    """SIGBUS: a read past the end of a guarded file gets a zero page; others the old handler."""
    address = ctypes.c_void_p.from_address(info + _SI_ADDR_OFFSET).value or 0
    for start, end, mapped in _guarded:
        if start <= address < end:
            page = address - address % _PAGE
            result = _libc.mmap(  # type: ignore[union-attr]
                ctypes.c_void_p(page),
                ctypes.c_size_t(_PAGE),
                _PROT_READ,
                _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_FIXED,
                -1,
                0,
            )
            if result == page:
                mapped.fault_reason = (
                    f"a read past the end of {mapped.path} (truncated while mapped)"
                )
                return  # the read is retried, and reads zeros
            break
    # Not ours (or no page could be mapped): the previous handler takes the retried fault.
    _libc.sigaction(signal.SIGBUS, ctypes.byref(_previous), None)  # type: ignore[union-attr]


def _install_handler() -> None:
    """Install the SIGBUS handler once (where supported)."""
    global _handler, _libc
    if _handler is not None:
        return
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        _handler = False
        return
    try:
        libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: calls keep the GIL
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        _libc = libc
        callback = _HANDLER_TYPE(_on_sigbus)
        action = _SigAction()
        action.sa_sigaction = ctypes.cast(callback, ctypes.c_void_p).value
        action.sa_flags = _SA_SIGINFO
        if libc.sigaction(signal.SIGBUS, ctypes.byref(action), ctypes.byref(_previous)) != 0:
            raise OSError(ctypes.get_errno(), "sigaction(SIGBUS) failed")
        _handler = callback
    except (OSError, AttributeError) as exc:
        log.warning("no SIGBUS guard for mapped graphs: %s", exc)
        _handler = False
