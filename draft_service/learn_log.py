"""The learn log: learned generations on disk, shared by the replicas of a draft tier.

What a draft service learns (:mod:`draft_service.live_layer`) lives in memory; the log is how it
survives a restart and reaches replicas started later. Every replica learns every generation
(a gateway reports each one to all the replicas it knows), but exactly one of them is asked to
persist it (``LearnRequest.persist``), so N replicas do not write it N times; a replica that
starts replays the log into its live layer.

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
from collections.abc import Iterator, Sequence
from pathlib import Path

from draft_service.live_layer import LiveLayer

log = logging.getLogger(__name__)

FORMAT_NAME = "speculant-learn-log"
FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 1 << 30


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
        max_bytes: int = DEFAULT_MAX_BYTES,
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
