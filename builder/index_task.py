"""The build task: one partition -> its token stream and its sorted entries, on shared storage.

:func:`index_partition` is what every engine runs, in this process, in a local worker process or
on a Dask worker. It takes and returns plain JSON-able data only: a *task spec* (the partition's
pieces as paths and offsets, the tokenizer name, the options) and a *manifest* (the files it
wrote, the partition's documents and tokens).

A *part* on disk (format ``speculant-index-part`` version 1), one directory per task attempt,
``part<index>-<random>/`` inside the build's work directory, plain ``.npy`` files saved without
pickle (terms of :mod:`speculant.suffix_index`):

- ``stream.npy``: the partition's documents, each followed by SEP;
- ``entries.npy``: its entries (positions in its stream), sorted by backward string;
- ``weights.npy``, only for weighted documents (:func:`index_token_documents`): each position's
  weight;
- ``manifest.json``, written last (atomically): the format name and version, the partition, its
  documents, tokens and entries, the seconds spent reading, tokenizing and sorting, the worker
  process's peak RSS; for a Hugging Face dataset (spec key ``dataset``), also ``read``: per piece
  (shard range) the documents read, their UTF-8 bytes and whether the shard ended first.

Entries are sorted in chunks of SORT_CHUNK_TOKENS stream positions (each with the MAX_CONTEXT
tokens before it, all a sort reads), merged after: a task's sorting memory stays about 40 bytes
a token of one chunk, whatever the size of the partition or of its documents. A
directory without a manifest is an unfinished attempt (its worker died or failed): the writer
never reads it. A retried task writes a fresh directory.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from builder.corpus import iter_file_documents
from builder.disk import save_array
from builder.errors import BuildError
from builder.index_writer import Part
from builder.partition import Partition
from speculant.suffix_index import MAX_CONTEXT, merge_sorted, separator, sort_entries, stream_dtype

MANIFEST = "manifest.json"
FORMAT_NAME = "speculant-index-part"
FORMAT_VERSION = 1
PART_STREAM = "stream.npy"
PART_ENTRIES = "entries.npy"
PART_WEIGHTS = "weights.npy"
SORT_CHUNK_TOKENS = 1 << 20  # stream positions sorted at a time (then merged)

# per process: tokenizer name -> (tokenizer, fingerprint, DocumentTokenizer); loaded once per worker
_TOKENIZERS: dict[str, tuple[Any, str, Any]] = {}


def register_tokenizer(name: str, tokenizer: Any, fingerprint: str) -> None:
    """Make an already loaded tokenizer the one this process's tasks use for ``name``."""
    from builder.tokenize import DocumentTokenizer

    _TOKENIZERS[name] = (tokenizer, fingerprint, DocumentTokenizer(tokenizer))


def _tokenizer(name: str, hf_token: str | None) -> tuple[Any, str, Any]:
    if name not in _TOKENIZERS:
        from speculant.tokenizer import load_tokenizer, tokenizer_fingerprint

        tokenizer = load_tokenizer(name, hf_token)
        register_tokenizer(name, tokenizer, tokenizer_fingerprint(tokenizer))
    return _TOKENIZERS[name]


class PartWriter:
    """Collects one part's documents: its stream, entries and weights, then sorts and saves."""

    def __init__(self, vocab_size: int, weight: int = 1) -> None:
        self.dtype = stream_dtype(vocab_size)
        self.sep = separator(self.dtype)
        self.weight = weight
        self._streams: list[np.ndarray] = []
        self._firsts: list[int] = []  # per document: its first counted successor
        self.tokens = 0  # of the stream, SEPs included
        self.documents = 0
        self.counted = 0  # tokens whose n-grams are counted

    def add(self, ids: np.ndarray, first_successor: int = 0) -> None:
        """One document's ids; its n-grams whose successor is at first_successor or later
        are counted (0: all; a prompt's length: its continuation's)."""
        if ids.size == 0:
            return
        if int(ids.max()) >= self.sep:
            raise BuildError(f"token id {int(ids.max())} does not fit the stream")
        self._streams.append(ids.astype(self.dtype))
        self._firsts.append(max(1, first_successor))
        self.tokens += int(ids.size) + 1
        self.documents += 1
        self.counted += max(0, int(ids.size) - max(first_successor, 0))

    def save(self, out: Path) -> dict[str, int]:
        """Sort and write the part's files into out; its figures."""
        sep = self.sep
        stream = np.empty(self.tokens, dtype=self.dtype)
        pending: list[np.ndarray] = []  # entries: positions whose successor is counted
        at = 0
        for ids, first in zip(self._streams, self._firsts, strict=True):
            n = ids.size
            stream[at : at + n] = ids
            stream[at + n] = sep
            if n > first - 1:
                pending.append(np.arange(at + first - 1, at + n - 1, dtype=np.uint32))
            at += n + 1
        self._streams.clear()
        entries = np.concatenate(pending) if pending else np.empty(0, np.uint32)  # ascending
        del pending
        chunks = [
            _sorted_chunk(stream, sep, entries, start, start + SORT_CHUNK_TOKENS)
            for start in range(0, max(1, self.tokens), SORT_CHUNK_TOKENS)
        ]
        while len(chunks) > 1:  # pairwise, so each merge joins chunks of similar sizes
            chunks = [
                merge_sorted(stream, sep, chunks[i], chunks[i + 1]) if i + 1 < len(chunks)
                else chunks[i]
                for i in range(0, len(chunks), 2)
            ]  # fmt: skip
        save_array(out / PART_STREAM, stream)
        save_array(out / PART_ENTRIES, chunks[0])
        if self.weight != 1:
            save_array(out / PART_WEIGHTS, np.full(self.tokens, self.weight, dtype=np.uint8))
        return {"documents": self.documents, "tokens": self.counted, "entries": chunks[0].size}


def _sorted_chunk(
    stream: np.ndarray, sep: int, entries: np.ndarray, start: int, end: int
) -> np.ndarray:
    """The entries in stream positions [start, end), sorted: sorted within the stream from
    MAX_CONTEXT tokens before start (all their sort reads), so a long document costs the
    sort's memory of one chunk."""
    lo, hi = np.searchsorted(entries, [start, end])  # entries ascend
    if lo == hi:
        return np.empty(0, dtype=np.uint32)
    base = max(0, start - MAX_CONTEXT)
    local = sort_entries(stream[base:end], sep, entries[lo:hi].astype(np.int64) - base)
    return local + np.uint32(base)


def index_partition(spec: dict[str, Any]) -> dict[str, Any]:
    """Tokenize one partition and write its part; returns its manifest (see the module
    docstring).

    spec: ``partition`` (:meth:`Partition.to_dict`), ``work_dir`` (shared directory),
    ``tokenizer``, ``hf_token``, ``fingerprint`` (the driver's: a worker whose tokenizer differs
    refuses), ``vocab_size``, ``batch_docs``, ``batch_chars``, ``text_field``,
    ``doc_separator``; for a Hugging Face dataset, ``dataset``
    (:meth:`~builder.dataset_source.DatasetRef.to_dict`), the pieces being shard ranges.
    """
    begun = time.perf_counter()
    part = Partition.from_dict(spec["partition"])
    _, fingerprint, doc_tokenizer = _tokenizer(spec["tokenizer"], spec.get("hf_token"))
    if fingerprint != spec["fingerprint"]:
        raise BuildError(
            f"worker {socket.gethostname()}: tokenizer {spec['tokenizer']!r} has fingerprint "
            f"{fingerprint}, the build's is {spec['fingerprint']}: install the same tokenizer"
        )
    out = _part_dir(spec, part.index)
    writer = PartWriter(int(spec["vocab_size"]))
    seconds = {"read": 0.0, "tokenize": 0.0, "count": 0.0}
    read: list[dict[str, Any]] = []
    if spec.get("dataset"):
        from builder.dataset_source import DatasetRef, iter_dataset_documents

        docs = iter_dataset_documents(
            DatasetRef.from_dict(spec["dataset"]),
            part.pieces,
            text_field=spec["text_field"],
            hf_token=spec.get("hf_token"),
            report=read,
        )
    else:
        docs = _documents(part, spec["text_field"], spec["doc_separator"])
    for batch in _timed_batches(docs, int(spec["batch_docs"]), int(spec["batch_chars"]), seconds):
        t0 = time.perf_counter()
        for ids in doc_tokenizer.encode_batch(batch):
            writer.add(ids)
        seconds["tokenize"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    figures = writer.save(out)
    seconds["count"] += time.perf_counter() - t0
    return _write_manifest(out, part.to_dict(), figures, read, seconds, begun)


def index_token_documents(
    documents: Iterable[tuple[np.ndarray, int]],
    spec: dict[str, Any],
    index: int,
    weight: int = 1,
) -> dict[str, Any]:
    """Index documents given as token ids (no tokenizing), in this process; returns the
    manifest of a task as :func:`index_partition` does (its partition has no pieces).

    documents: (ids ``[n]``, first successor position counted; see :meth:`PartWriter.add`).
    spec: as index_partition's, of which ``work_dir`` and ``vocab_size`` are used. weight: each
    n-gram occurrence counts this many times (1..255).
    """
    if not 1 <= weight <= 255:
        raise BuildError(f"weight must be in 1..255, got {weight}")
    begun = time.perf_counter()
    out = _part_dir(spec, index)
    writer = PartWriter(int(spec["vocab_size"]), weight)
    for ids, first_successor in documents:
        writer.add(np.asarray(ids), first_successor)
    figures = writer.save(out)
    seconds = {"read": 0.0, "tokenize": 0.0, "count": time.perf_counter() - begun}
    partition = {"index": index, "pieces": []}
    return _write_manifest(out, partition, figures, [], seconds, begun)


def checked_token_documents(
    documents: Iterable[tuple[Sequence[int] | np.ndarray, int]], vocab_size: int, source: str
) -> Iterator[tuple[np.ndarray, int]]:
    """The documents as (int64 ids, first successor) for :func:`index_token_documents`, each
    checked as it is read: BuildError naming source at a token id outside [0, vocab_size)."""
    for ids, first in documents:
        array = np.asarray(ids, dtype=np.int64)
        if array.size and (int(array.min()) < 0 or int(array.max()) >= vocab_size):
            raise BuildError(f"{source}: a token id is outside the vocabulary [0, {vocab_size})")
        yield array, int(first)


def _part_dir(spec: dict[str, Any], index: int) -> Path:
    out = Path(spec["work_dir"]) / f"part{index:05d}-{secrets.token_hex(4)}"
    out.mkdir()  # not parents: a build that ended (and removed work_dir) gets no new files
    return out


def _write_manifest(
    out: Path,
    partition: dict[str, Any],
    figures: dict[str, int],
    read: list[dict[str, Any]],
    seconds: dict[str, float],
    begun: float,
) -> dict[str, Any]:
    """Write a finished task's manifest (atomically, last) and return it."""
    manifest = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "partition": partition,
        "dir": str(out),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        **figures,
        "weighted": (out / PART_WEIGHTS).exists(),
        "read": read,
        "worker_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": {k: round(v, 4) for k, v in seconds.items()}
        | {"total": round(time.perf_counter() - begun, 4)},
    }
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, out / MANIFEST)
    return manifest


def _documents(part: Partition, text_field: str, doc_separator: str | None) -> Iterator[str]:
    for piece in part.pieces:
        yield from iter_file_documents(
            Path(piece.path),
            text_field=text_field,
            doc_separator=doc_separator,
            start=piece.start,
            stop=piece.stop,
        )


def _timed_batches(
    docs: Iterator[str], batch_docs: int, batch_chars: int, seconds: dict[str, float]
) -> Iterable[list[str]]:
    """Group documents into batches of batch_docs / batch_chars; times the reading."""
    batch: list[str] = []
    chars = 0
    t0 = time.perf_counter()
    for doc in docs:
        batch.append(doc)
        chars += len(doc)
        if len(batch) >= batch_docs or chars >= batch_chars:
            seconds["read"] += time.perf_counter() - t0
            yield batch
            batch, chars = [], 0
            t0 = time.perf_counter()
    seconds["read"] += time.perf_counter() - t0
    if batch:
        yield batch


def manifest_part(manifest: dict[str, Any]) -> Part:
    """The part a task wrote (the directory its manifest names)."""
    directory = Path(manifest["dir"])
    weights = directory / PART_WEIGHTS if manifest.get("weighted", False) else None
    return Part(directory / PART_STREAM, directory / PART_ENTRIES, weights)
