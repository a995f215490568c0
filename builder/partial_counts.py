"""The build task: one partition -> sorted partial counts per order on shared storage.

:func:`count_partition` is what every engine runs, in this process, in a local worker process or
on a Dask worker. It takes and returns plain JSON-able data only: a *task spec* (the partition's
pieces as paths and offsets, the tokenizer name, the options) and a *manifest* (the run files it
wrote, with their row counts, and the partition's documents and tokens).

Partial counts on disk (format ``speculant-partial-counts`` version 1), one directory per task
attempt, ``part<index>-<random>/`` inside the build's work directory:

- runs as in :mod:`builder.runs`: ``order<o>-run<r>-keys.npy`` (``[n, words]`` uint64 packed
  n-gram keys, see :mod:`builder.keys`, sorted and unique) and ``order<o>-run<r>-counts.npy``
  (``[n]`` uint64), plain ``.npy`` files saved without pickle;
- ``manifest.json``, written last (atomically): the format name and version, the partition, the
  key bits, max order, documents, tokens, per order the list of ``[keys file, counts file, rows]``,
  the seconds spent reading, tokenizing and counting, and the worker process's peak RSS; for a
  Hugging Face dataset (spec key ``dataset``), also ``read``: per piece (shard range) the
  documents read, their UTF-8 bytes and whether the shard ended before the range did.

A directory without a manifest is an unfinished attempt (its worker died or failed): the merge
never reads it. A retried task writes a fresh directory, so a half-written attempt never mixes
with a finished one.
"""

from __future__ import annotations

import json
import os
import resource
import secrets
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from builder.corpus import iter_file_documents
from builder.counting import NgramCounter
from builder.errors import BuildError
from builder.partition import Partition
from builder.runs import RunStore

MANIFEST = "manifest.json"
FORMAT_NAME = "speculant-partial-counts"
FORMAT_VERSION = 1

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


def count_partition(spec: dict[str, Any]) -> dict[str, Any]:
    """Tokenize and count one partition; returns its manifest (see the module docstring).

    spec: ``partition`` (:meth:`Partition.to_dict`), ``work_dir`` (shared directory),
    ``tokenizer``, ``hf_token``, ``fingerprint`` (the driver's: a worker whose tokenizer differs
    refuses), ``key_bits``, ``max_order``, ``chunk_size``, ``spill_rows``, ``batch_docs``,
    ``batch_chars``, ``text_field``, ``doc_separator``; for a Hugging Face dataset, ``dataset``
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
    work_dir = Path(spec["work_dir"])
    out = work_dir / f"part{part.index:05d}-{secrets.token_hex(4)}"
    out.mkdir()  # not parents: a build that ended (and removed work_dir) gets no new files
    max_order = int(spec["max_order"])
    store = RunStore(out, max_order, int(spec["spill_rows"]))
    counter = NgramCounter(max_order, int(spec["key_bits"]), int(spec["chunk_size"]), store)
    seconds = {"read": 0.0, "tokenize": 0.0, "count": 0.0}
    documents = tokens = 0
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
        arrays = doc_tokenizer.encode_batch(batch)
        t1 = time.perf_counter()
        for ids in arrays:
            counter.add_document(ids)
            tokens += int(ids.size)
        documents += len(arrays)
        seconds["tokenize"] += t1 - t0
        seconds["count"] += time.perf_counter() - t1
    t0 = time.perf_counter()
    counter.flush()
    store.spill()
    seconds["count"] += time.perf_counter() - t0
    return _write_manifest(
        out, store, part.to_dict(), spec, documents, tokens, read, seconds, begun
    )


def count_token_documents(
    documents: Iterable[tuple[np.ndarray, int]],
    spec: dict[str, Any],
    index: int,
    weight: int = 1,
) -> dict[str, Any]:
    """Count documents given as token ids (no tokenizing), in this process; returns the
    manifest of a task as :func:`count_partition` does (its partition has no pieces).

    documents: (ids ``[n]`` uint32, first successor position counted; see
    :meth:`~builder.counting.NgramCounter.add_document`). spec: as count_partition's, of which
    ``work_dir``, ``key_bits``, ``max_order``, ``chunk_size`` and ``spill_rows`` are used.
    weight: each n-gram occurrence counts this many times.
    """
    begun = time.perf_counter()
    out = Path(spec["work_dir"]) / f"part{index:05d}-{secrets.token_hex(4)}"
    out.mkdir()
    max_order = int(spec["max_order"])
    store = RunStore(out, max_order, int(spec["spill_rows"]))
    counter = NgramCounter(max_order, int(spec["key_bits"]), int(spec["chunk_size"]), store, weight)
    doc_count = tokens = 0
    for ids, first_successor in documents:
        counter.add_document(ids, first_successor)
        doc_count += 1
        tokens += max(0, int(ids.size) - max(first_successor, 0))
    counter.flush()
    store.spill()
    seconds = {"read": 0.0, "tokenize": 0.0, "count": time.perf_counter() - begun}
    partition = {"index": index, "pieces": []}
    return _write_manifest(out, store, partition, spec, doc_count, tokens, [], seconds, begun)


def _write_manifest(
    out: Path,
    store: RunStore,
    partition: dict[str, Any],
    spec: dict[str, Any],
    documents: int,
    tokens: int,
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
        "max_order": int(spec["max_order"]),
        "key_bits": int(spec["key_bits"]),
        "documents": documents,
        "tokens": tokens,
        "runs": {
            str(o): [[k.name, c.name, int(_rows(c))] for k, c in runs]
            for o, runs in store.runs.items()
        },
        "read": read,
        "worker_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "seconds": {k: round(v, 4) for k, v in seconds.items()}
        | {"total": round(time.perf_counter() - begun, 4)},
    }
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, out / MANIFEST)
    return manifest


def _rows(counts_path: Path) -> int:
    return np.load(counts_path, mmap_mode="r", allow_pickle=False).shape[0]


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


def manifest_runs(manifest: dict[str, Any], order: int) -> list[tuple[Path, Path]]:
    """The (keys, counts) run files of one order listed in a manifest."""
    base = Path(manifest["dir"])
    return [(base / k, base / c) for k, c, _ in manifest["runs"].get(str(order), [])]


def read_manifest(directory: Path) -> dict[str, Any]:
    """Load and check the manifest of a finished task attempt."""
    manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT_NAME or manifest.get("version") != FORMAT_VERSION:
        raise BuildError(f"{directory}: not a {FORMAT_NAME} v{FORMAT_VERSION} manifest")
    return manifest
