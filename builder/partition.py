"""Splitting a corpus into partitions: the units of work of a build, as plain JSON-able data.

A *piece* is a file or a range of one: a byte range [start, stop) of a plain-text or JSON-lines
file, or a range [start, stop) of row groups of a Parquet file. A *partition* is a list of
consecutive pieces of about ``partition_bytes`` bytes: small files are packed together, large
files are cut. Partitions are planned by looking at file sizes and, for a cut, at a few bytes
around it: the planner never reads the corpus into memory.

Cuts fall on document boundaries only, so that every partition yields exactly the documents
that a sequential read of the whole file yields (and counts do not depend on the partitioning):

- JSON lines: just after a newline;
- plain text with a ``doc_separator``: just after an occurrence of the separator that the
  sequential left-to-right split also finds (one with no other occurrence starting in the
  ``len(separator) - 1`` bytes before it; UTF-8 is self-synchronising, so a byte match is a
  character match);
- plain text without a separator is one document: the whole file is one piece;
- Parquet: between row groups (sizes from the file's footer).

Hugging Face datasets are partitioned by their streaming shards instead
(:func:`builder.dataset_source.plan_dataset_partitions`).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.corpus import file_kind, import_pyarrow_parquet

DEFAULT_PARTITION_BYTES = 64 << 20  # a partition's size when neither size nor count is given
SCAN_BLOCK_BYTES = 1 << 20  # bytes read at a time while looking for a cut


@dataclass(frozen=True)
class Piece:
    """A file or a range of one: bytes [start, stop) (Parquet: row groups [start, stop)), or
    documents [start, stop) of a dataset shard (stop -1: to its end; see
    :mod:`builder.dataset_source`)."""

    path: str  # absolute (a dataset: its path or hub name)
    kind: str  # "text" | "jsonl" | "parquet" | "dataset"
    start: int
    stop: int
    size: int  # bytes (Parquet: compressed bytes of its row groups; a dataset: 0, unknown)
    shard: int | None = None  # a dataset piece's shard index


@dataclass(frozen=True)
class Partition:
    """The unit of work of a build: consecutive pieces, numbered from 0 in corpus order."""

    index: int
    pieces: list[Piece] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pieces)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Partition:
        return cls(index=int(data["index"]), pieces=[Piece(**p) for p in data["pieces"]])


def plan_partitions(
    files: Sequence[Path],
    *,
    doc_separator: str | None = None,
    partition_bytes: int | None = None,
    partitions: int | None = None,
) -> list[Partition]:
    """Partitions of the corpus files, of about partition_bytes each.

    With ``partitions`` (and no ``partition_bytes``), the size is the corpus size divided by that
    count; there may be fewer partitions where a file cannot be cut (one document, no separator).
    """
    sizes = [os.path.getsize(f) for f in files]
    if partition_bytes is None:
        total = sum(sizes)
        if partitions:
            partition_bytes = max(1, math.ceil(total / partitions))
        else:
            partition_bytes = DEFAULT_PARTITION_BYTES
    partition_bytes = max(1, partition_bytes)
    pieces: list[Piece] = []
    for path, size in zip(files, sizes, strict=True):
        pieces.extend(_file_pieces(Path(path).absolute(), size, partition_bytes, doc_separator))
    out: list[Partition] = []
    current: list[Piece] = []
    held = 0
    for piece in pieces:
        if current and held + piece.size > partition_bytes:
            out.append(Partition(len(out), current))
            current, held = [], 0
        current.append(piece)
        held += piece.size
    if current:
        out.append(Partition(len(out), current))
    return out


def _file_pieces(
    path: Path, size: int, partition_bytes: int, doc_separator: str | None
) -> list[Piece]:
    kind = file_kind(path)
    if kind == "parquet":
        return _parquet_pieces(path, partition_bytes)
    if size <= partition_bytes or (kind == "text" and not doc_separator):
        return [Piece(str(path), kind, 0, size, size)]
    sep = b"\n" if kind == "jsonl" else doc_separator.encode("utf-8")  # type: ignore[union-attr]
    cuts = [0]
    with path.open("rb") as f:
        while True:
            cut = find_cut(f, cuts[-1] + partition_bytes, sep, size)
            if cut is None or cut >= size:
                break
            cuts.append(cut)
    cuts.append(size)
    return [Piece(str(path), kind, a, b, b - a) for a, b in itertools.pairwise(cuts)]


def find_cut(f, at: int, sep: bytes, size: int) -> int | None:
    """The offset just after the first safe occurrence of sep starting at or after ``at``.

    Safe: no other occurrence starts in the ``len(sep) - 1`` bytes before it, so the sequential
    left-to-right split finds it too. None if there is none before the end of the file.
    """
    n = len(sep)
    if at >= size:
        return None
    base = max(0, at - (n - 1))  # file offset of buf[0]; keeps n - 1 bytes of context
    f.seek(base)
    buf = f.read(SCAN_BLOCK_BYTES)
    search = at - base  # index in buf where candidates may start
    while True:
        p = buf.find(sep, search)
        while p >= 0:
            earlier = buf.find(sep, max(0, p - n + 1), p + n - 1)
            if earlier == -1 or earlier >= p:
                return base + p + n
            p = buf.find(sep, p + 1)
        block = f.read(SCAN_BLOCK_BYTES)
        if not block:
            return None
        # occurrences not yet examined start in the last n - 1 bytes; keep n - 1 more of context
        keep = min(len(buf), 2 * (n - 1))
        drop = len(buf) - keep
        search = max(search - drop, keep - (n - 1), 0)
        base += drop
        buf = buf[drop:] + block


def _parquet_pieces(path: Path, partition_bytes: int) -> list[Piece]:
    """Runs of consecutive row groups of about partition_bytes (compressed) each."""
    pq = import_pyarrow_parquet()
    meta = pq.ParquetFile(path).metadata
    pieces: list[Piece] = []
    start, held = 0, 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        nbytes = sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
        if i > start and held + nbytes > partition_bytes:
            pieces.append(Piece(str(path), "parquet", start, i, held))
            start, held = i, 0
        held += nbytes
    if meta.num_row_groups > start or not pieces:
        pieces.append(Piece(str(path), "parquet", start, meta.num_row_groups, held))
    return pieces
