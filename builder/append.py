"""Appending a corpus to a published graph: the graph's counts become sorted runs.

``speculant build --append --out GRAPH`` counts the new corpus as any build does; then, holding
an exclusive lock on ``.<name>.append.lock`` beside the graph (so concurrent appends to one
graph run one after the other and none is lost), it opens the graph published at GRAPH *at that
moment*, checks its manifest and that it was built with the same tokenizer (fingerprint) and max
order, and exports each order's entries as one sorted run (the format of :mod:`builder.runs`).
The ordinary merge then sums them with the new corpus's runs. Counts are sums and no n-gram
crosses a document boundary, so the result has exactly the counts of a build from scratch of the
old and new corpora together. It is published like any build (an atomic swap of the directory):
a reader that has the old graph open keeps reading it (its file is unlinked, not changed).

Terms: the *base* is the graph appended to; its *version* goes up by one with each append, and
its *sources* list every build that added corpus to it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from builder.disk import open_array
from builder.errors import BuildError
from builder.keys import KeyCodec
from speculant.graph_format import (
    DATA_FILE,
    KEY_DTYPE,
    VALUE_DTYPE,
    GraphFormatError,
    GraphMeta,
    open_graph_env,
    order_db_name,
    read_meta,
)

EXPORT_BATCH = 65_536  # LMDB entries decoded at a time while exporting


@dataclass
class BaseGraph:
    """The graph being appended to: its meta and, per order, its counts as sorted runs."""

    path: Path
    meta: GraphMeta
    runs: dict[int, list[tuple[Path, Path]]]


def read_base_meta(out: Path) -> GraphMeta:
    """The meta of the graph at out; BuildError when there is no finished graph there."""
    env = _open_base(out)
    try:
        return read_meta(env, out)
    finally:
        env.close()


def _open_base(out: Path, checksum: bool = False) -> Any:
    """The graph's environment, its manifest checked first (with checksum: its SHA-256 too)."""
    if not (out / DATA_FILE).is_file():
        raise BuildError(
            f"nothing to append to: {out} is not a graph (build it first without --append)"
        )
    return open_graph_env(out, checksum=checksum)


def check_compatible(
    meta: GraphMeta,
    out: Path,
    *,
    tokenizer_name: str,
    fingerprint: str,
    max_order: int,
) -> None:
    """BuildError unless a build with this tokenizer and max order can be added to the graph."""
    if meta.tokenizer_fingerprint != fingerprint:
        raise BuildError(
            f"cannot append to {out}: it was built with tokenizer {meta.tokenizer_name!r} "
            f"(fingerprint {meta.tokenizer_fingerprint[:16]}...), this build uses "
            f"{tokenizer_name!r} ({fingerprint[:16]}...); counts of different tokenizers do not "
            "add up: build a new graph instead"
        )
    if meta.max_order != max_order:
        raise BuildError(
            f"cannot append to {out}: its max order is {meta.max_order}, this build's is "
            f"{max_order} (use --max-order {meta.max_order})"
        )


@contextlib.contextmanager
def append_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``.<name>.append.lock`` beside out: appends and meta rewrites
    (builder.meta_update) of one graph wait for each other, so none is lost."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out.parent / f".{out.name}.append.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def export_base(
    out: Path, directory: Path, bits: int, check: dict[str, Any] | None = None
) -> BaseGraph:
    """Open the graph at out, check it (manifest; ``check``: :func:`check_compatible`'s keyword
    arguments), and write each order's counts as one sorted run into directory."""
    env = _open_base(out, checksum=True)
    try:
        meta = read_meta(env, out)
        if check is not None:
            check_compatible(meta, out, **check)
        directory.mkdir(parents=True, exist_ok=True)
        runs = {}
        for stats in meta.orders:
            codec = KeyCodec(bits, stats.order + 1)
            runs[stats.order] = _export_order(
                env, out, codec, stats.ngrams, meta.vocab_size, directory
            )
    finally:
        env.close()
    return BaseGraph(out, meta, runs)


def _export_order(
    env: Any, out: Path, codec: KeyCodec, ngrams: int, vocab_size: int, directory: Path
) -> list[tuple[Path, Path]]:
    """One order's entries as one run (``[]`` when the order is empty)."""
    order = codec.length - 1
    if ngrams == 0:
        return []
    kpath = directory / f"base-order{order:02d}-keys.npy"
    cpath = directory / f"base-order{order:02d}-counts.npy"
    keys_out = open_array(kpath, np.uint64, (ngrams, codec.words))
    counts_out = open_array(cpath, np.uint64, (ngrams,))
    n = 0
    try:
        db = env.open_db(order_db_name(order), create=False)
        with env.begin(db=db) as txn:
            batch: list[tuple[bytes, bytes]] = []
            for item in txn.cursor().iternext():
                batch.append(item)
                if len(batch) == EXPORT_BATCH:
                    n = _put_rows(keys_out, counts_out, n, codec, batch, vocab_size, out)
                    batch.clear()
            if batch:
                n = _put_rows(keys_out, counts_out, n, codec, batch, vocab_size, out)
    except lmdb.Error as exc:
        raise GraphFormatError(f"corrupt graph {out}: order {order} unreadable ({exc})") from exc
    if n != ngrams:
        raise GraphFormatError(
            f"corrupt graph {out}: order {order} has {n} n-grams, the meta says {ngrams}"
        )
    keys_out.flush()
    counts_out.flush()
    del keys_out, counts_out
    return [(kpath, cpath)]


def _put_rows(
    keys_out: np.ndarray,
    counts_out: np.ndarray,
    n: int,
    codec: KeyCodec,
    entries: list[tuple[bytes, bytes]],
    vocab_size: int,
    out: Path,
) -> int:
    """Write the rows of LMDB entries (in key order) at row n; returns the next row.

    An entry (context -> successors and counts, by count descending) gives one row per
    successor; rows are sorted by successor within a context, so with contexts in key order
    the run is sorted.
    """
    order = codec.length - 1
    contexts = np.frombuffer(b"".join(k for k, _ in entries), dtype=KEY_DTYPE)  # [g * order]
    if contexts.size != len(entries) * order:
        raise GraphFormatError(f"corrupt graph {out}: a key of order {order} has a wrong size")
    contexts = contexts.reshape(len(entries), order)
    sizes = np.array([len(v) // 8 for _, v in entries], dtype=np.int64)  # [g] successors each
    flat = np.frombuffer(b"".join(v for _, v in entries), dtype=VALUE_DTYPE)  # [2 * rows]
    rows = int(sizes.sum())
    if flat.size != 2 * rows:
        raise GraphFormatError(f"corrupt graph {out}: a value of order {order} has a wrong size")
    if n + rows > keys_out.shape[0]:
        raise GraphFormatError(f"corrupt graph {out}: order {order} has more n-grams than its meta")
    group = np.repeat(np.arange(len(entries)), sizes)  # [rows] entry of each row
    first = np.cumsum(sizes) - sizes  # [g] rows before each entry
    rank = np.arange(rows) - first[group]  # [rows] position inside its entry
    at = 2 * first[group] + rank  # [rows] index of the successor id in flat
    successors = flat[at]
    counts = flat[at + sizes[group]]
    if rows and (int(successors.max()) >= vocab_size or int(contexts.max()) >= vocab_size):
        raise GraphFormatError(f"corrupt graph {out}: a token id of order {order} is too large")
    perm = np.lexsort((successors, group))  # by context (key order), then successor id
    table = np.empty((rows, order + 1), dtype=np.uint32)
    table[:, :order] = contexts[group[perm]]
    table[:, order] = successors[perm]
    keys_out[n : n + rows] = codec.pack_rows(table)
    counts_out[n : n + rows] = counts[perm]
    return n + rows


def source_record(
    version: int, inputs: list[str], documents: int, tokens: int, built_at: str
) -> dict[str, Any]:
    """One entry of a graph's ``sources``: what one build added."""
    return {
        "version": version,
        "inputs": list(inputs),
        "documents": documents,
        "tokens": tokens,
        "built_at": built_at,
    }


def base_sources(meta: GraphMeta) -> list[dict[str, Any]]:
    """The base graph's sources (one made from its meta for a graph built before sources)."""
    if meta.sources:
        return [dict(s) for s in meta.sources]
    return [
        source_record(
            meta.version,
            list(meta.build_params.get("inputs", [])),
            meta.corpus_documents,
            meta.corpus_tokens,
            meta.built_at,
        )
    ]
