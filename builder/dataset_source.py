"""Hugging Face datasets as a corpus: streamed, split into tasks by the dataset's shards.

A dataset is opened with ``datasets.load_dataset(path, name, split=..., data_files=...,
streaming=True)``: an ``IterableDataset`` that reads its data files (or the hub's) lazily, never
whole. One record is one document, with the policy of JSON lines: its ``text_field`` must be a
string (a missing field, a null or a non-string value is an error naming the shard and record),
and empty or whitespace-only texts are skipped.

Partitioning: a streaming dataset has ``n_shards`` shards (about one per data file). The driver
opens the dataset once (this resolves its files, features and splits but reads no records),
then plans *pieces*: one per shard, a range [start, stop) of that shard's documents (``stop``
-1: to the end). Tasks get plain data only (the dataset's path, config, split, data files and
shard count in :class:`DatasetRef`, and their pieces); each reopens the dataset in streaming mode,
takes ``shard(num_shards=n_shards, index=s)`` and streams it.

``--max-docs N`` is exact: N is split evenly over the shards in shard order (shard s gets
``N // n_shards``, plus one for the first ``N % n_shards`` shards); each task reads the first
documents of its shards up to their quotas. Where a shard runs out before its quota, the
shortfall is split the same way over the shards that did not run out, and a further round of
tasks reads on from where each of those stopped (see :func:`next_quotas`), until N documents
are read or every shard is exhausted. The documents chosen depend on the dataset's shards and N
only, not on the engine, the workers or the partitions; with one shard they are the dataset's
first N documents.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from builder.errors import CorpusError
from builder.partition import Partition, Piece

READ_BATCH_ROWS = 1000  # records converted from Arrow at a time
MESSAGE_CHARS = 400  # an error from the datasets library is cut to this many characters


@dataclass(frozen=True)
class DatasetRef:
    """Which dataset to stream, as plain data: what ``load_dataset`` is called with."""

    path: str  # hub name, local directory, or a packaged builder ("json", "parquet", ...)
    name: str | None = None  # the config (``--dataset-config``)
    split: str = "train"
    data_files: list[str] | None = None
    n_shards: int = 0  # as seen by the driver; a task that sees another count refuses

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DatasetRef:
        return cls(**data)

    def describe(self) -> str:
        """``dataset 'x' (config 'c', split 's')`` for messages."""
        config = f"config {self.name!r}, " if self.name else ""
        return f"dataset {self.path!r} ({config}split {self.split!r})"


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def import_datasets():
    """The datasets library (quiet: no progress bars), or a CorpusError saying how to get it."""
    try:
        import datasets
    except ImportError as exc:
        raise CorpusError(
            "--dataset needs the datasets library: pip install 'speculant-graph[distributed]'"
        ) from exc
    datasets.disable_progress_bars()
    logging.getLogger("datasets").setLevel(logging.ERROR)
    return datasets


def _is_remote(path: str) -> bool:
    return "://" in path


def absolute_ref(
    path: str, name: str | None, split: str, data_files: list[str] | None
) -> DatasetRef:
    """A DatasetRef whose local paths are absolute (workers may run elsewhere, at another cwd).

    Local data-file patterns that match nothing are refused here with a clear message (the
    datasets library reports them with an empty StopIteration).
    """
    local_dir = not _is_remote(path) and os.path.isdir(os.path.expanduser(path))
    if local_dir:
        path = os.path.abspath(os.path.expanduser(path))
    files = None
    if data_files:
        files = []
        for pattern in data_files:
            if _is_remote(pattern):
                files.append(pattern)
                continue
            where = os.path.join(path, pattern) if local_dir else os.path.expanduser(pattern)
            if not glob.glob(where, recursive=True):
                raise CorpusError(f"dataset data files {pattern!r} match no files")
            files.append(pattern if local_dir else os.path.abspath(where))
    return DatasetRef(path=path, name=name, split=split, data_files=files)


def load_streaming(ref: DatasetRef, hf_token: str | None = None):
    """``load_dataset(..., streaming=True)`` for ref; library errors become one-line
    CorpusErrors (unknown dataset, no network in offline mode, a missing split or config)."""
    datasets = import_datasets()
    kwargs: dict[str, Any] = {"split": ref.split, "streaming": True}
    if ref.data_files:
        kwargs["data_files"] = ref.data_files
    if hf_token:
        kwargs["token"] = hf_token
    try:
        ds = datasets.load_dataset(ref.path, ref.name, **kwargs)
    except Exception as exc:
        raise CorpusError(f"cannot open {ref.describe()}: {_one_line(exc)}") from exc
    if not isinstance(ds, datasets.IterableDataset):
        raise CorpusError(f"cannot open {ref.describe()}: not a streaming dataset split")
    return ds


def open_dataset(
    path: str,
    name: str | None = None,
    split: str = "train",
    *,
    data_files: list[str] | None = None,
    text_field: str = "text",
    hf_token: str | None = None,
) -> DatasetRef:
    """Open the dataset in the driver: check it, its split and (where the features are known
    before reading) its text column and that column's type; return the ref with its shard
    count."""
    ref = absolute_ref(path, name, split, data_files)
    ds = load_streaming(ref, hf_token)
    features = ds.features
    if features is not None and text_field not in features:
        columns = ", ".join(features) or "none"
        raise CorpusError(
            f"{ref.describe()} has no {text_field!r} column (columns: {columns}; use --text-field)"
        )
    if features is not None and getattr(features[text_field], "dtype", None) not in (
        "string",
        "large_string",
    ):
        raise CorpusError(
            f"{ref.describe()}: column {text_field!r} is not a string column "
            f"({features[text_field]})"
        )
    n_shards = int(ds.n_shards)
    if n_shards < 1:
        raise CorpusError(f"{ref.describe()} has no data")
    return DatasetRef(ref.path, ref.name, ref.split, ref.data_files, n_shards)


# -- planning --------------------------------------------------------------------------------


def split_evenly(total: int, n: int) -> list[int]:
    """total split over n slots in order: the first ``total % n`` slots get one more."""
    q, r = divmod(total, n)
    return [q + (1 if i < r else 0) for i in range(n)]


def first_quotas(n_shards: int, max_docs: int | None) -> dict[int, int | None]:
    """Documents to read per shard in the first round (None: all), shards with none left out."""
    if max_docs is None:
        return dict.fromkeys(range(n_shards))
    return {s: q for s, q in enumerate(split_evenly(max_docs, n_shards)) if q > 0}


def next_quotas(shortfall: int, open_shards: list[int]) -> dict[int, int | None]:
    """The next round's quotas: shortfall split evenly over the shards not yet exhausted."""
    if shortfall <= 0 or not open_shards:
        return {}
    shares = split_evenly(shortfall, len(open_shards))
    return {s: q for s, q in zip(open_shards, shares, strict=True) if q > 0}


def plan_dataset_partitions(
    ref: DatasetRef,
    quotas: dict[int, int | None],
    taken: dict[int, int],
    *,
    partitions: int | None = None,
    first_index: int = 0,
) -> list[Partition]:
    """Partitions of one round: a piece per shard with a quota, reading documents
    [taken, taken + quota) of it (stop -1: to the end); one shard per partition, or the pieces
    grouped into ``partitions`` runs of consecutive shards."""
    pieces = [
        Piece(
            path=ref.path,
            kind="dataset",
            start=taken.get(s, 0),
            stop=-1 if q is None else taken.get(s, 0) + q,
            size=0,
            shard=s,
        )
        for s, q in sorted(quotas.items())
    ]
    if not pieces:
        return []
    groups = len(pieces) if not partitions else min(partitions, len(pieces))
    out, at = [], 0
    for i, n in enumerate(split_evenly(len(pieces), groups)):
        out.append(Partition(first_index + i, pieces[at : at + n]))
        at += n
    return out


def read_in_rounds(
    ref: DatasetRef,
    max_docs: int | None,
    run: Callable[[list[Partition]], list[dict[str, Any]]],
    *,
    partitions: int | None = None,
    first_index: int = 0,
) -> tuple[int, int]:
    """Plan the dataset's tasks and run them (``run``: a round's partitions -> their manifests)
    round by round: one round reading every shard whole when max_docs is None, else rounds
    until max_docs documents are read or every shard is exhausted. (rounds, tasks run)."""
    quotas = first_quotas(ref.n_shards, max_docs)
    taken: dict[int, int] = {}
    exhausted: set[int] = set()
    rounds = tasks = 0
    while quotas:
        plan = plan_dataset_partitions(
            ref, quotas, taken, partitions=partitions, first_index=first_index + tasks
        )
        manifests = run(plan)
        rounds, tasks = rounds + 1, tasks + len(plan)
        shortfall = record_reads(manifests, taken, exhausted)
        if max_docs is None:
            break
        quotas = next_quotas(shortfall, [s for s in range(ref.n_shards) if s not in exhausted])
    return rounds, tasks


# -- reading (in a task) ---------------------------------------------------------------------


def iter_dataset_documents(
    ref: DatasetRef,
    pieces: list[Piece],
    *,
    text_field: str = "text",
    hf_token: str | None = None,
    report: list[dict[str, Any]] | None = None,
) -> Iterator[str]:
    """Documents of the pieces (shard ranges) of a dataset, streamed.

    ``report`` receives, per piece as it ends, ``{"shard", "documents", "bytes", "exhausted"}``:
    the documents yielded, their UTF-8 bytes, and whether the shard ended before ``stop``.
    """
    ds = load_streaming(ref, hf_token)
    if int(ds.n_shards) != ref.n_shards:
        raise CorpusError(
            f"{ref.describe()} has {ds.n_shards} shards here, {ref.n_shards} when the build was "
            "planned: the dataset changed, or this worker sees other files"
        )
    for piece in pieces:
        yield from _iter_shard(ds, ref, piece, text_field, report)


def _iter_shard(ds, ref: DatasetRef, piece: Piece, text_field: str, report) -> Iterator[str]:
    """Documents [piece.start, piece.stop) of one shard (stop -1: to its end)."""
    start, stop = piece.start, piece.stop
    documents = nbytes = 0
    exhausted = True
    if stop < 0 or stop > start:
        skipped = 0
        for text in _shard_texts(ds, ref, piece.shard, text_field):
            if skipped < start:
                skipped += 1
                continue
            documents += 1
            nbytes += len(text.encode("utf-8"))
            yield text
            if stop >= 0 and start + documents >= stop:
                exhausted = False
                break
    if report is not None:
        report.append(
            {"shard": piece.shard, "documents": documents, "bytes": nbytes, "exhausted": exhausted}
        )


def _shard_texts(ds, ref: DatasetRef, shard: int | None, text_field: str) -> Iterator[str]:
    """The non-blank texts of one shard, checked (see the module docstring)."""
    where = f"{ref.describe()} shard {shard}"
    record = 0
    batches = ds.shard(num_shards=ref.n_shards, index=shard, contiguous=True).iter(
        batch_size=READ_BATCH_ROWS
    )
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as exc:  # the library's: a cast error between files, a bad file, I/O
            after = f" after record {record}" if record else ""
            raise CorpusError(f"{where}{after}: {_one_line(exc)}") from exc
        texts = batch.get(text_field)
        if texts is None:
            raise CorpusError(
                f"{where} record {record + 1}: record has no {text_field!r} field "
                "(use --text-field)"
            )
        for text in texts:
            record += 1
            if text is None:
                raise CorpusError(
                    f"{where} record {record}: record has no {text_field!r} field "
                    "(missing or null; use --text-field)"
                )
            if not isinstance(text, str):
                raise CorpusError(
                    f"{where} record {record}: field {text_field!r} is not a string "
                    f"({type(text).__name__})"
                )
            if text.strip():
                yield text


def record_reads(
    manifests: list[dict[str, Any]], taken: dict[int, int], exhausted: set[int]
) -> int:
    """Add what a round's tasks read to `taken` (documents per shard) and `exhausted` (shards
    that ran out); return the round's shortfall: documents its quotas asked for and did not
    get."""
    shortfall = 0
    for manifest in manifests:
        for piece, got in zip(manifest["partition"]["pieces"], manifest["read"], strict=True):
            shard = piece["shard"]
            taken[shard] = taken.get(shard, 0) + got["documents"]
            if got["exhausted"]:
                exhausted.add(shard)
            if piece["stop"] >= 0:
                shortfall += piece["stop"] - piece["start"] - got["documents"]
    return shortfall
