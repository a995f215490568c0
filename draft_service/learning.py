"""A draft service's online learning: a live layer and a learn log per (graph, tenant), kept
across graph reloads.

The gateway reports every finished generation (``DraftService/Learn``) with the graph it drafted
from and the tenant it served; this module keeps what the service learned from it in that
(graph, tenant)'s *live layer* (:class:`LiveLayer`) and persists the generations
it is asked to persist into that layer's learn log (:class:`LearnLog`), which a service replays
when it opens the graph. So one tenant's generations shape only its own drafts of that graph:
another tenant's drafts, and another graph's, stay byte-identical. Learning never
fails a request: a log that cannot be written is logged (once) and learning goes on in memory.

Learn logs: with no ``--learn-log``, beside each graph folder, ``GRAPH_DIR.learned.jsonl`` for
the default tenant and ``GRAPH_DIR.learned.TENANT.jsonl`` for the others; with ``--learn-log
PATH``, PATH is the default graph's default tenant's and the others sit beside it as
``STEM.GRAPH.jsonl`` / ``STEM.GRAPH.TENANT.jsonl`` (names hold no dots, so each file name says
whose it is). A layer learned under one max order is counted again when a reload changes it.

The learn log: learned generations on disk, shared by the replicas of a draft tier. What a
draft service learns lives in memory; the log is how it survives a restart and reaches replicas
started later. Every replica learns every generation (a gateway reports each one to all the
replicas it knows), but exactly one of them is asked to persist it (``LearnRequest.persist``),
so N replicas do not write it N times; a replica that starts replays the log into its live
layer.

Format: JSON lines (no pickle), UTF-8. The first line is a header
``{"format": "speculant-learn-log", "version": 1, "tokenizer_fingerprint": ..., "max_order": ...}``;
each further line is one generation ``{"id": ..., "tokens": [...]}``. A log written for another
tokenizer is not replayed (its ids mean other tokens). A last line cut short by a crash is
skipped on replay. A generation id that appears more than once is replayed once (its last
record).

Bounded: when an append finds the file over ``max_bytes``, it rewrites it (a new file, renamed
over the old one) keeping the newest records that fit in half of that. Appends and rewrites take
an exclusive ``flock`` on the file, and every append opens the path afresh (a rewrite replaces
the file, and an old descriptor would write into the replaced one), so replicas on one host, or
on a filesystem with working ``flock``, can share one log.

The live layer: n-gram counts a draft service learns from the generations it helps to serve.
Terms. A *learned document* is one finished generation's tokens, its prompt and its output, as a
gateway reports them (``DraftService/Learn``). The layer counts the n-grams of orders
1..max_order of every learned document exactly as the builder counts a corpus document
(c_live,o(x) = the number of times the order-o context was followed by x), keyed like the graph
(context ids packed as big-endian uint32), so a drafter combines them with the graph's counts:

    c_o(x) = c_graph,o(x) + weight * c_live,o(x)

(see :mod:`draft_service.overlay`, whose rule this is; ``weight`` is the layer's). A drafter
asks :meth:`LiveLayer.successors` for a tail's counts: one dict lookup per order.

Bounded: the layer estimates its memory (:meth:`LiveLayer.estimated_bytes`: its documents, its
keys, its (context, successor) pairs and its published tuples, at costs measured with
tracemalloc, see KEY_BYTES and PAIR_BYTES) and forgets its oldest documents (subtracts their
counts) while the estimate is over ``max_bytes``. Thread-safe: learning takes a lock; lookups
read published tuples and take the lock only to build one (dropping all of them first when that
would pass the cap).

Why so long: the live layer, the learn log and the per-(graph, tenant) registry are the three
parts of one job, learning from served generations; each is short and uses the others.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from speculant.config import DEFAULT_LEARN_MEMORY_MB, DEFAULT_LEARN_WEIGHT
from speculant.errors import InvalidArgumentError
from speculant.graph_catalog import NAME_PATTERN
from speculant.graph_format import KEY_DTYPE, encode_context
from speculant.graph_reader import NGramGraph
from speculant.suffix_index import (
    ENTRIES_FILE,
    FIRST_FILE,
    FREQUENT_MIN,
    STREAM_FILE,
    TABLE_COUNTS_FILE,
    TABLE_IDS_FILE,
    TABLE_RANGES_FILE,
    TABLE_START_FILE,
    SuffixIndex,
    common_prefixes,
    first_offsets,
    frequent_ranges,
    range_tables,
    separator,
    sort_entries,
    stream_dtype,
)
from speculant.types import LiveStats

# Bytes of Python objects per context key (its bytes object, dict slots, the inner dict of
# successors) and per (context, successor) pair (a dict slot, the int objects), measured with
# tracemalloc on the counts of stories260K's continuations of tinystories prompts and of random
# token streams (32k vocabulary), rounded up: tests/test_live_layer.py checks that the estimate
# covers what tracemalloc sees.
KEY_BYTES = 320
PAIR_BYTES = 120
DOCUMENT_BYTES = 120  # a learned document's bytes object and deque slot, beyond 4 bytes a token
# A published entry: two numpy arrays (about 112 bytes each), its tuple and dict slot, and per
# successor 16 bytes of array data.
FROZEN_BYTES = 320
FROZEN_PAIR_BYTES = 16
DEFAULT_MAX_BYTES = DEFAULT_LEARN_MEMORY_MB << 20
DEFAULT_WEIGHT = DEFAULT_LEARN_WEIGHT
# The compiled drafts (draft_service.greedy_kernels) read a suffix index of the layer's
# documents, built again when the layer has changed, once the last build is old enough that
# building takes at most this share of a core: a small layer's drafts follow what it learns at
# once, a large one's (a build of 100k tokens takes about 0.1 s) within a few seconds.
INDEX_BUILD_SHARE = 0.05


class LayerIndex(NamedTuple):
    """A suffix index of the layer's documents (None: none kept), the layer's version it was
    built from, when (time.monotonic) and in how many seconds."""

    index: SuffixIndex | None
    version: int
    built_at: float
    seconds: float


Successors = tuple[tuple[int, tuple[tuple[int, int], ...]], ...]  # ((order, ((id, count),)),)


class LiveLayer:
    """Successor counts of learned documents, bounded by memory (see the module docstring)."""

    def __init__(
        self,
        max_order: int,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        weight: float = DEFAULT_WEIGHT,
        build_share: float = INDEX_BUILD_SHARE,
    ) -> None:
        if max_order < 1:
            raise ValueError(f"max_order must be >= 1, got {max_order}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if not 0 < weight < float("inf"):
            raise ValueError(f"weight must be a finite number > 0, got {weight}")
        self.max_order = max_order
        self.max_bytes = max_bytes
        self.weight = float(weight)
        self._lock = threading.Lock()
        self._counts: dict[bytes, dict[int, int]] = {}  # context -> {successor: count}
        # published successors, on demand: key -> (stamp, ids ascending, their counts)
        self._frozen: dict[bytes, tuple[int, np.ndarray, np.ndarray]] = {}
        self._stamp = 0
        self._documents: deque[bytes] = deque()  # packed tokens, oldest first
        self._tokens = 0
        self._pairs = 0
        self._frozen_bytes = 0
        self._learned = 0
        self._forgotten = 0
        self._version = 0  # changes with every document learned, forgotten or cleared
        self.build_share = build_share  # see INDEX_BUILD_SHARE (inf: build at every change)
        self._index: LayerIndex | None = None  # see compiled_index
        self._index_bytes = 0
        self._building = threading.Lock()

    # -- learning ----------------------------------------------------------------------------

    def learn(self, token_ids: Sequence[int] | np.ndarray) -> int:
        """Count one document's n-grams; forget the oldest documents while over the memory cap.
        Returns the tokens kept (a document that alone exceeds the cap keeps its last tokens;
        one shorter than two tokens has no n-gram and is not kept)."""
        packed = encode_context(token_ids)
        fits = (self.max_bytes - DOCUMENT_BYTES) // (4 + self.max_order * (KEY_BYTES + PAIR_BYTES))
        packed = packed[-4 * max(0, fits) :] if len(packed) > 4 * fits else packed
        if len(packed) < 8:
            return 0
        with self._lock:
            self._version += 1
            self._count(packed, +1)
            self._documents.append(packed)
            self._tokens += len(packed) >> 2
            self._learned += 1
            if self.estimated_bytes() > self.max_bytes:
                self._drop_frozen()
            while self._documents and self.estimated_bytes() > self.max_bytes:
                oldest = self._documents.popleft()
                self._count(oldest, -1)
                self._tokens -= len(oldest) >> 2
                self._forgotten += 1
        return len(packed) >> 2

    def _count(self, packed: bytes, delta: int) -> None:
        """Add (delta +1) or subtract (-1) one document's n-gram counts (lock held)."""
        counts, frozen, top = self._counts, self._frozen, self.max_order
        tokens = np.frombuffer(packed, dtype=KEY_DTYPE).tolist()
        for i in range(1, len(tokens)):  # token i follows the contexts ending at token i - 1
            successor = tokens[i]
            for order in range(1, min(top, i) + 1):
                key = packed[4 * (i - order) : 4 * i]
                stale = frozen.pop(key, None)
                if stale is not None:
                    self._frozen_bytes -= FROZEN_BYTES + FROZEN_PAIR_BYTES * stale[1].size
                successors = counts.get(key)
                if successors is None:
                    if delta > 0:
                        counts[key] = {successor: 1}
                        self._pairs += 1
                    continue
                count = successors.get(successor, 0) + delta
                if count > 0:
                    if count == 1 and delta > 0:
                        self._pairs += 1
                    successors[successor] = count
                else:
                    del successors[successor]
                    self._pairs -= 1
                    if not successors:
                        del counts[key]

    def _drop_frozen(self) -> None:
        """Drop every published tuple (lock held); lookups build them again."""
        self._frozen.clear()
        self._frozen_bytes = 0

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._version += 1
            self._counts.clear()
            self._drop_frozen()
            self._documents.clear()
            self._tokens = self._pairs = 0

    # -- reading -----------------------------------------------------------------------------

    def successors(self, tail: bytes) -> Successors:
        """((order, ((successor id, count), ...)), ...) for the orders whose last `order` tail
        tokens the layer has seen followed, highest order first, ids ascending; () when none.
        tail: packed like the keys."""
        return tuple(
            (order, tuple(zip(ids.tolist(), map(int, counts.tolist()), strict=True)))
            for order, ids, counts in self.lookup(tail)[0]
        )

    def lookup(
        self, tail: bytes
    ) -> tuple[tuple[tuple[int, np.ndarray, np.ndarray], ...], tuple[tuple[int, int], ...]]:
        """((order, successor ids int64 [u] ascending, counts float64 [u]), ...) for the orders
        whose last `order` tail tokens the layer has seen followed, highest order first, and
        their signature ((order, stamp), ...): a short key that equals another lookup's only
        when the counts are the same ones (each published entry gets a stamp of its own, and an
        entry is published again whenever its counts change), so a drafter's step caches can be
        keyed by it. The arrays are read-only and shared: do not modify them."""
        if not self._counts:
            return (), ()
        found = []
        signature = []
        for order in range(min(len(tail) >> 2, self.max_order), 0, -1):
            key = tail[-4 * order :]
            published = self._frozen.get(key)
            if published is None:
                if key not in self._counts:
                    continue
                published = self._publish(key)
                if published is None:
                    continue
            stamp, ids, counts = published
            found.append((order, ids, counts))
            signature.append((order, stamp))
        return tuple(found), tuple(signature)

    def _publish(self, key: bytes) -> tuple[int, np.ndarray, np.ndarray] | None:
        """Build (a new stamp, successor ids, counts) of a key, and keep it if it fits."""
        with self._lock:
            successors = self._counts.get(key)
            if successors is None:
                return None
            self._stamp += 1
            items = sorted(successors.items())
            ids = np.fromiter((x for x, _ in items), dtype=np.int64, count=len(items))
            counts = np.fromiter((c for _, c in items), dtype=np.float64, count=len(items))
            ids.flags.writeable = counts.flags.writeable = False
            published = (self._stamp, ids, counts)
            size = FROZEN_BYTES + FROZEN_PAIR_BYTES * len(items)
            if self.estimated_bytes() + size > self.max_bytes:
                self._drop_frozen()
            if self.estimated_bytes() + size <= self.max_bytes:  # else: not kept
                self._frozen[key] = published
                self._frozen_bytes += size
            return published

    # -- size --------------------------------------------------------------------------------

    def estimated_bytes(self) -> int:
        """The layer's memory, estimated (see the module docstring)."""
        return (
            4 * self._tokens
            + DOCUMENT_BYTES * len(self._documents)
            + KEY_BYTES * len(self._counts)
            + PAIR_BYTES * self._pairs
            + self._frozen_bytes
            + self._index_bytes
        )

    # -- the compiled drafts' index -----------------------------------------------------------

    def compiled_index(self, vocab_size: int) -> SuffixIndex | None:
        """A suffix index of the documents kept (speculant.suffix_index, what the compiled
        drafts read; None while none is kept), built again when the layer has changed and the
        last build is old enough (INDEX_BUILD_SHARE). While one thread builds, the others read
        the last build. Its bytes count towards the layer's memory (estimated_bytes)."""
        state = self._index
        if state is not None and (
            state.version == self._version
            or time.monotonic() - state.built_at < state.seconds / self.build_share
        ):
            return state.index
        if not self._building.acquire(blocking=state is None):
            return state.index if state is not None else None
        try:
            with self._lock:
                documents, version = list(self._documents), self._version
            started = time.monotonic()
            index = documents_index(documents, vocab_size) if documents else None
            done = time.monotonic()
            self._index = LayerIndex(index, version, done, done - started)
            self._index_bytes = 0 if index is None else sum(a.nbytes for a in index.arrays.values())
            return index
        finally:
            self._building.release()

    def documents(self) -> list[bytes]:
        """The learned documents kept, oldest first (packed big-endian uint32)."""
        with self._lock:
            return list(self._documents)

    def stats(self) -> LiveStats:
        with self._lock:
            return LiveStats(
                documents=len(self._documents),
                tokens=self._tokens,
                contexts=len(self._counts),
                pairs=self._pairs,
                estimated_bytes=self.estimated_bytes(),
                max_bytes=self.max_bytes,
                learned_documents=self._learned,
                forgotten_documents=self._forgotten,
            )


def documents_index(documents: list[bytes], vocab_size: int) -> SuffixIndex:
    """A suffix index of documents (packed big-endian uint32 ids), as the builder indexes a
    corpus (speculant.suffix_index): each document followed by SEP, every position with a
    successor in its document an entry, the ranges of at least FREQUENT_MIN entries tabled.
    Ids outside the vocabulary are dropped with their documents' tails (the graph's ids are
    all the drafts know). Its arrays are read-only, like a graph's."""
    dtype = stream_dtype(vocab_size)
    sep = separator(dtype)
    pieces = []
    for packed in documents:
        ids = np.frombuffer(packed, dtype=KEY_DTYPE).astype(np.int64)
        outside = np.flatnonzero(ids >= vocab_size)
        pieces.append(ids[: outside[0]] if outside.size else ids)
    sizes = np.array([p.size for p in pieces], dtype=np.int64)
    stream = np.full(int(sizes.sum()) + len(pieces), sep, dtype=dtype)  # [N]
    starts = np.concatenate([[0], np.cumsum(sizes + 1)[:-1]])
    for piece, start in zip(pieces, starts.tolist(), strict=True):
        stream[start : start + piece.size] = piece
    followed = np.zeros(stream.shape[0], dtype=bool)  # a token followed in its document
    followed[:-1] = (stream[:-1] != sep) & (stream[1:] != sep)
    entries = sort_entries(stream, sep, np.flatnonzero(followed))
    lcp = common_prefixes(stream, sep, entries)
    lo, hi = frequent_ranges(lcp, FREQUENT_MIN)
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    no_weights = np.empty(0, np.uint8)
    table_start, table_ids, table_counts = range_tables(
        stream, entries, no_weights, lo, hi, vocab_size
    )
    arrays = {
        STREAM_FILE: stream,
        ENTRIES_FILE: entries,
        FIRST_FILE: first_offsets(stream, entries, vocab_size),
        TABLE_RANGES_FILE: np.stack([lo, hi], axis=1).astype(np.uint32),
        TABLE_START_FILE: table_start.astype(np.uint64),
        TABLE_IDS_FILE: table_ids,
        TABLE_COUNTS_FILE: table_counts,
    }
    for array in arrays.values():
        array.flags.writeable = False
    index = SuffixIndex(arrays)
    index.frequent_min = FREQUENT_MIN
    return index


log = logging.getLogger(__name__)

MAX_LEARN_TOKENS = 65_536  # tokens of one learned generation (LearnRequest.token_ids)
MAX_GENERATION_ID = 128
LOG_SUFFIX = ".learned.jsonl"  # the default learn log: GRAPH_DIR + this, beside the graph
FORMAT_NAME = "speculant-learn-log"
FORMAT_VERSION = 1
LOG_MAX_BYTES = 1 << 30  # a learn log's size before an append rewrites it (LearnLog)


@dataclass(frozen=True)
class LearningConfig:
    """How a draft service learns. max_bytes: the memory cap of each (graph, tenant) layer.
    log_path: "" = beside each graph (see the module docstring), None = no log (learning in
    memory only, lost at a restart), else the default graph's default tenant's log."""

    enabled: bool = True
    max_bytes: int = DEFAULT_MAX_BYTES
    weight: float = DEFAULT_WEIGHT
    log_path: str | None = ""


def default_log_path(graph_path: str | Path, tenant: str = "") -> Path:
    """The learn log beside a graph folder: GRAPH_DIR.learned[.TENANT].jsonl."""
    path = Path(graph_path).expanduser().absolute()
    middle = f".{tenant}" if tenant else ""
    return path.with_name(path.name + LOG_SUFFIX.replace(".jsonl", f"{middle}.jsonl"))


class LearnLogError(Exception):
    """The log cannot be used (unreadable, another tokenizer's): the message says why."""


class LearnLog:
    """Appends learned generations to the log at path, and replays them into a live layer."""

    def __init__(
        self,
        path: str | Path,
        *,
        tokenizer_fingerprint: str,
        max_order: int,
        max_bytes: int = LOG_MAX_BYTES,
    ) -> None:
        self.path = Path(path)
        self.header = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "tokenizer_fingerprint": tokenizer_fingerprint,
            "max_order": max_order,
        }
        self.max_bytes = max_bytes

    def append(self, generation_id: str, token_ids: Sequence[int]) -> None:
        """Add one generation (OSError when the file cannot be written)."""
        line = json.dumps({"id": generation_id, "tokens": list(token_ids)}) + "\n"
        with self._locked() as fd:
            size = os.fstat(fd).st_size
            if size == 0:
                os.write(fd, (json.dumps(self.header) + "\n").encode())
            os.write(fd, line.encode())
            if size + len(line) > self.max_bytes:
                self._compact(fd)

    def replay(self, layer: LiveLayer) -> tuple[int, int]:
        """Learn the log's generations (oldest first) into layer: (generations, tokens). A
        missing log replays nothing; LearnLogError for a log of another tokenizer."""
        generations = tokens = 0
        for _, token_ids in self._latest_records():
            tokens += layer.learn(token_ids)
            generations += 1
        return generations, tokens

    def _latest_records(self) -> list[tuple[str, list[int]]]:
        """(id, tokens) of each generation once (its last record), in the order of those."""
        records: dict[str, list[int]] = {}
        for generation_id, token_ids in self._records():
            records.pop(generation_id, None)  # re-inserted at the end: the last record wins
            records[generation_id] = token_ids
        return list(records.items())

    def _records(self) -> Iterator[tuple[str, list[int]]]:
        try:
            handle = self.path.open("rb")
        except FileNotFoundError:
            return
        except OSError as exc:
            raise LearnLogError(f"cannot read learn log {self.path}: {exc}") from exc
        with handle:
            first = handle.readline()
            if not first:
                return
            self._check_header(first)
            for lineno, raw in enumerate(handle, start=2):
                try:
                    record = json.loads(raw)
                    generation_id, token_ids = str(record["id"]), record["tokens"]
                    if not all(isinstance(t, int) for t in token_ids):
                        raise TypeError("tokens are not integers")
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("learn log %s line %d skipped: %s", self.path, lineno, exc)
                    continue
                yield generation_id, token_ids

    def _check_header(self, line: bytes) -> None:
        try:
            header = json.loads(line)
        except ValueError as exc:
            raise LearnLogError(f"{self.path} is not a learn log (its first line: {exc})") from exc
        if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
            raise LearnLogError(f"{self.path} is not a learn log")
        if header.get("version") != FORMAT_VERSION:
            raise LearnLogError(f"{self.path}: learn log version {header.get('version')} unknown")
        if header.get("tokenizer_fingerprint") != self.header["tokenizer_fingerprint"]:
            raise LearnLogError(
                f"{self.path} was written for another tokenizer "
                f"({str(header.get('tokenizer_fingerprint'))[:23]}...): not replayed"
            )

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        """An O_APPEND descriptor of the current file at path, under an exclusive flock."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                    break  # still the file at path (not replaced by a rewrite meanwhile)
            except FileNotFoundError:
                pass
            os.close(fd)
        try:
            yield fd
        finally:
            os.close(fd)  # releases the lock

    def _compact(self, fd: int) -> None:
        """Rewrite the log with the newest records that fit in max_bytes / 2 (lock held)."""
        kept: list[str] = []
        size = 0
        for generation_id, token_ids in reversed(self._latest_records()):
            line = json.dumps({"id": generation_id, "tokens": token_ids}) + "\n"
            if size + len(line) > self.max_bytes // 2:
                break
            kept.append(line)
            size += len(line)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        with tmp.open("w", encoding="utf-8") as out:
            out.write(json.dumps(self.header) + "\n")
            out.writelines(reversed(kept))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        del fd  # the old file, unlinked: closed by the caller
        log.info("learn log %s rewritten: %d newest generations kept", self.path, len(kept))


@dataclass(frozen=True)
class LearnOutcome:
    learned_tokens: int
    persisted: bool
    stats: LiveStats


@dataclass(eq=False)
class _Learned:
    """One (graph, tenant)'s layer and log."""

    layer: LiveLayer
    log: LearnLog | None
    log_failed: bool = False


class Learning:
    """The learned layers and learn logs of one draft service (see the module docstring)."""

    def __init__(self, config: LearningConfig | None = None, default_graph: str = "") -> None:
        """default_graph: the name whose default tenant's log is config.log_path when given."""
        self.config = config or LearningConfig()
        self.default_graph = default_graph
        self._lock = threading.Lock()
        self._learned: dict[tuple[str, str], _Learned] = {}

    def layer(self, name: str, tenant: str, graph: NGramGraph) -> LiveLayer:
        """(graph name, tenant)'s layer for `graph`, made (and its log replayed) on first use;
        counted again when the graph's max order changed since it was learned."""
        key = (name, tenant)
        with self._lock:
            learned = self._learned.get(key)
            if learned is None:
                learned = self._open(name, tenant, graph)
                self._learned[key] = learned
            elif learned.layer.max_order != graph.max_order:  # count the documents again
                documents = learned.layer.documents()
                learned.layer = self._new_layer(graph.max_order)
                for packed in documents:
                    learned.layer.learn(_unpack(packed))
            return learned.layer

    def tenants_on_disk(self, name: str, graph: NGramGraph) -> list[str]:
        """The tenants whose learn log of this graph exists (the default tenant as "")."""
        default = self.log_path(name, "", graph)
        if default is None:
            return []
        found = [""] if default.exists() else []
        pattern = self.log_path(name, "*", graph)  # "*": no name holds it
        assert pattern is not None
        prefix, suffix = pattern.name.split("*")
        for path in sorted(pattern.parent.glob(pattern.name)):
            tenant = path.name[len(prefix) : len(path.name) - len(suffix)]
            if NAME_PATTERN.fullmatch(tenant):
                found.append(tenant)
        return found

    def log_path(self, name: str, tenant: str, graph: NGramGraph) -> Path | None:
        """Where (graph name, tenant)'s learn log lives (None: learning in memory only)."""
        given = self.config.log_path
        if given is None:
            return None
        if given == "":
            return default_log_path(graph.path, tenant)
        path = Path(given)
        if name == self.default_graph and not tenant:
            return path
        parts = [path.stem, name, *([tenant] if tenant else [])]
        return path.with_name(".".join(parts) + path.suffix)

    def forget(self, name: str) -> None:
        """Drop the layers of a graph no longer served (their logs stay on disk)."""
        with self._lock:
            for key in [key for key in self._learned if key[0] == name]:
                del self._learned[key]

    def layers(self) -> list[tuple[str, str, LiveLayer, Path | None]]:
        """(graph name, tenant, layer, its log) of every layer held."""
        with self._lock:
            return [
                (name, tenant, learned.layer, learned.log.path if learned.log else None)
                for (name, tenant), learned in self._learned.items()
            ]

    def _new_layer(self, max_order: int) -> LiveLayer:
        return LiveLayer(max_order, max_bytes=self.config.max_bytes, weight=self.config.weight)

    def _open(self, name: str, tenant: str, graph: NGramGraph) -> _Learned:
        """A new layer for (name, tenant), its log replayed into it."""
        meta = graph.meta
        layer = self._new_layer(meta.max_order)
        path = self.log_path(name, tenant, graph)
        if path is None:
            return _Learned(layer, None)
        learn_log = LearnLog(
            path, tokenizer_fingerprint=meta.tokenizer_fingerprint, max_order=meta.max_order
        )
        try:
            generations, tokens = learn_log.replay(layer)
        except (LearnLogError, OSError) as exc:
            log.warning("learn log not replayed: %s", exc)
            return _Learned(layer, None)
        if generations:
            log.info(
                "replayed %d learned generations (%d tokens) of graph %s%s from %s; layer %.1f MiB",
                generations,
                tokens,
                name,
                f", tenant {tenant}" if tenant else "",
                learn_log.path,
                layer.estimated_bytes() / 2**20,
            )
        return _Learned(layer, learn_log)

    def learn(
        self,
        name: str,
        tenant: str,
        graph: NGramGraph,
        token_ids: Sequence[int],
        generation_id: str,
        persist: bool,
    ) -> LearnOutcome:
        """Validate a report (InvalidArgumentError naming the field), learn it into (name,
        tenant)'s layer, persist it into that layer's log."""
        check_report(token_ids, generation_id, graph.vocab_size)
        layer = self.layer(name, tenant, graph)
        learned = self._learned[(name, tenant)]
        kept = layer.learn(token_ids)
        persisted = False
        learn_log = learned.log
        if persist and learn_log is not None and kept:
            try:
                learn_log.append(generation_id, token_ids)
                persisted = True
            except OSError as exc:
                if not learned.log_failed:
                    learned.log_failed = True
                    log.warning(
                        "learn log %s not written (learning goes on): %s", learn_log.path, exc
                    )
        return LearnOutcome(kept, persisted, layer.stats())


def check_report(token_ids: Sequence[int], generation_id: str, vocab_size: int) -> None:
    """InvalidArgumentError naming the field of a bad Learn report."""
    if len(token_ids) < 2:
        raise InvalidArgumentError("token_ids", f"need at least 2 tokens, got {len(token_ids)}")
    if len(token_ids) > MAX_LEARN_TOKENS:
        raise InvalidArgumentError(
            "token_ids", f"at most {MAX_LEARN_TOKENS} tokens, got {len(token_ids)}"
        )
    low, high = min(token_ids), max(token_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InvalidArgumentError(
            "token_ids", f"token id {bad} is outside the graph's vocabulary [0, {vocab_size})"
        )
    if len(generation_id) > MAX_GENERATION_ID or not all(32 < ord(c) < 127 for c in generation_id):
        raise InvalidArgumentError(
            "generation_id", f"at most {MAX_GENERATION_ID} printable ASCII characters, no spaces"
        )


def _unpack(packed: bytes) -> list[int]:
    import numpy as np

    return np.frombuffer(packed, dtype=">u4").tolist()
