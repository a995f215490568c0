"""Appending a corpus to a published graph: the graph's index becomes the first part of a build.

``speculant build --append --out GRAPH`` tokenizes and sorts the new corpus as any build does;
then, holding an exclusive lock on ``.<name>.append.lock`` beside the graph (so concurrent
appends to one graph run one after the other and none is lost), it opens the graph published at
GRAPH *at that moment*, checks its manifest (sizes and checksums) and that it was built with the
same tokenizer (fingerprint) and max order, and takes its stream and sorted entries as the first
part of the index writer's merge (:mod:`builder.index_writer`). Counts are read from the merged
index, so the result has exactly the counts of a build from scratch of the old and new corpora
together. It is published like any build (an atomic swap of the directory): a reader that has
the old graph open keeps reading it (its files are unlinked, not changed).

Terms: the *base* is the graph appended to; its *version* goes up by one with each append, and
its *sources* list every build that added corpus to it. The base's index is read zero-copy from
its LMDB environment (format 3) or its ``.npy`` files (format 2; the result is format 3). A
graph of format 1 (per-order LMDB tables, no stream of its corpus) cannot be appended to: it is
rebuilt from its corpus.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.errors import BuildError
from builder.index_writer import Part
from speculant.graph_format import (
    FORMAT_VERSION,
    INDEXED_FORMATS,
    GraphMeta,
    open_graph_env,
    read_meta,
)
from speculant.graph_index import index_arrays
from speculant.graph_manifest import DATA_FILE, manifest_sizes
from speculant.suffix_index import ENTRIES_FILE, STREAM_FILE, WEIGHTS_FILE


@dataclass
class BaseGraph:
    """The graph being appended to: its meta and its index, as the first part of the merge."""

    path: Path
    meta: GraphMeta
    part: Part


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
    """BuildError unless a build with this tokenizer and max order can be added to the graph
    (and the graph is of the format the builder writes)."""
    check_format(meta, out)
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


def check_format(meta: GraphMeta, out: Path) -> None:
    """BuildError unless the graph at out has a suffix index (formats 2 and 3; one of format 1
    has no stream of its corpus to merge with)."""
    if meta.format_version not in INDEXED_FORMATS:
        raise BuildError(
            f"cannot append to {out}: it is a graph of format {meta.format_version} (per-order "
            f"tables, built before the suffix index), which keeps no stream of its corpus: "
            f"rebuild it from its corpus with `speculant build` (format {FORMAT_VERSION}), "
            "then append"
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


def open_base(out: Path, check: dict[str, Any] | None = None) -> BaseGraph:
    """The graph at out as the first part of an append: its manifest checked (sizes and
    checksums), its format (2 or 3) and, with ``check``, :func:`check_compatible`. A format 3
    graph's part is its arrays, mapped (they keep the map open while referenced)."""
    env = _open_base(out, checksum=True)
    try:
        meta = read_meta(env, out)
        check_format(meta, out)
        if check is not None:
            check_compatible(meta, out, **check)
        manifest_sizes(out, checksum=False)  # every file it lists is there, at its size
        if meta.format_version == FORMAT_VERSION:
            arrays = index_arrays(out, env, meta, [])
            part = Part(arrays[STREAM_FILE], arrays[ENTRIES_FILE], arrays.get(WEIGHTS_FILE))
        else:
            weights = out / WEIGHTS_FILE if meta.index.get("weighted") else None
            part = Part(out / STREAM_FILE, out / ENTRIES_FILE, weights)
    finally:
        env.close()
    return BaseGraph(out, meta, part)


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
