"""A draft service's online learning: a live layer and a learn log per (graph, tenant), kept
across graph reloads.

The gateway reports every finished generation (``DraftService/Learn``) with the graph it drafted
from and the tenant it served; this module keeps what the service learned from it in that
(graph, tenant)'s *learned layer* (:mod:`draft_service.live_layer`) and persists the generations
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
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from draft_service.live_layer import DEFAULT_MAX_BYTES, DEFAULT_WEIGHT, LiveLayer
from speculant.errors import InvalidArgumentError
from speculant.graph_catalog import NAME_PATTERN
from speculant.graph_reader import NGramGraph
from speculant.types import LiveStats

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
