"""GraphBuilder: corpus files -> tokenized documents -> a suffix index -> a graph.

Document policy: each document (a plain-text file, a piece of one between ``doc_separator``s, a
JSON-lines record, a Parquet row or a Hugging Face dataset record) is tokenized on its own exactly
as a prompt would be, with the tokenizer's default special tokens (a leading BOS for stories260K
/ Llama tokenizers) and no EOS appended; no n-gram crosses a document boundary. The graph's
counts are exact for every context of up to suffix_index.MAX_CONTEXT tokens; ``max_order`` is
the longest context drafting mixes (and the orders the meta's statistics describe).

The pipeline (plan, index each partition, merge) and its executors: see :mod:`builder`.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from builder.append import (
    BaseGraph,
    append_lock,
    base_sources,
    check_compatible,
    open_base,
    read_base_meta,
    source_record,
)
from builder.build_stats import BuildStats
from builder.corpus import resolve_inputs
from builder.dataset_source import DatasetRef, open_dataset, read_in_rounds
from builder.engines import Engine, make_engine
from builder.errors import BuildError
from builder.graph_output import write_graph
from builder.heartbeat import PROGRESS_SECONDS
from builder.index_task import (
    checked_token_documents,
    index_token_documents,
    manifest_part,
    register_tokenizer,
)
from builder.index_writer import Part
from builder.partition import plan_partitions
from builder.publish import check_output, make_run_dir, remove_stale_run_dirs
from builder.task_runner import run_tasks
from speculant.graph_format import FORMAT_VERSION, GraphMeta, OrderStats
from speculant.suffix_index import MAX_CONTEXT

log = logging.getLogger("builder")


class GraphBuilder:
    """Builds an n-gram graph from corpus files with a Hugging Face tokenizer.

    ``engine``: ``"local"`` (default), ``"dask"`` or an :class:`~builder.engines.Engine`;
    ``address``: a Dask scheduler (default: a new local cluster); ``workers``: worker processes
    (default: every core); ``partition_bytes`` / ``partitions``: the partition size, or a target
    count (default: 64 MiB partitions); ``work_dir``: where the partitions' parts go, a directory
    that every worker can reach at the same path (default: the system's temporary directory).
    ``progress``: True a progress bar, False nothing, None (default) a bar on a terminal and
    elsewhere an INFO log line every ``progress_seconds`` while it tokenizes and sorts.
    """

    def __init__(
        self,
        tokenizer_name: str,
        max_order: int = 5,
        hf_token: str | None = None,
        *,
        batch_docs: int = 256,
        batch_chars: int = 1 << 20,
        progress: bool | None = None,
        progress_seconds: float = PROGRESS_SECONDS,
        work_dir: str | os.PathLike[str] | None = None,
        tokenizer=None,
        engine: str | Engine = "local",
        address: str | None = None,
        workers: int | None = None,
        partition_bytes: int | None = None,
        partitions: int | None = None,
    ) -> None:
        if not 1 <= max_order <= MAX_CONTEXT:
            raise ValueError(f"max_order must be in 1..{MAX_CONTEXT}, got {max_order}")
        from speculant.tokenizer import (
            load_tokenizer,
            resolve_tokenizer_name,
            tokenizer_fingerprint,
            vocab_size,
        )

        # recorded in the graph's meta: a local folder by its resolved path, so that a gateway
        # or graph-viz started from another directory loads it too
        self.tokenizer_name = resolve_tokenizer_name(tokenizer_name)
        self.hf_token = hf_token
        self.max_order = max_order
        self.batch_docs = batch_docs
        self.batch_chars = batch_chars
        self.partition_bytes = partition_bytes
        self.partitions = partitions
        # a bar on a terminal; elsewhere (progress None) a log line every progress_seconds
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.progress_seconds = progress_seconds if progress is None and not self.progress else 0.0
        self.tokenizer = tokenizer or load_tokenizer(tokenizer_name, hf_token)
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.vocab_size = vocab_size(self.tokenizer)
        register_tokenizer(tokenizer_name, self.tokenizer, self.fingerprint)
        remove_stale_run_dirs(work_dir)
        self._run_dir = make_run_dir(work_dir)
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._run_dir, True)
        if isinstance(engine, str):
            self.engine: Engine = make_engine(engine, address=address, workers=workers)
            self._own_engine = True
        else:
            self.engine, self._own_engine = engine, False
        self._manifests: list[dict[str, Any]] = []
        self._inputs: list[str] = []
        self._text_field = "text"
        self._doc_separator: str | None = None
        self._datasets: list[dict[str, Any]] = []
        self._distilled: list[dict[str, Any]] = []  # build_from_token_documents(distilled=...)
        self._started: float | None = None
        self.stats = BuildStats()

    @property
    def parts(self) -> list[Part]:
        """Every finished task's part, in partition order."""
        manifests = sorted(self._manifests, key=lambda m: m["partition"]["index"])
        return [manifest_part(m) for m in manifests]

    # -- tokenizing and sorting ---------------------------------------------------------------

    def build_from_files(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        text_field: str = "text",
        doc_separator: str | None = None,
    ) -> BuildStats:
        """Plan, tokenize and sort the corpus (may be called again to add more files)."""
        if self._started is None:
            self._started = time.perf_counter()
        files = resolve_inputs(paths)
        self._inputs.extend(os.fspath(p) for p in paths)
        self._text_field, self._doc_separator = text_field, doc_separator
        plan = plan_partitions(
            files,
            doc_separator=doc_separator,
            partition_bytes=self.partition_bytes,
            partitions=self.partitions,
        )
        specs = [self._spec(part.to_dict()) for part in plan]
        self._count(specs)
        log.info(
            "read %d documents, %d tokens from %d file(s) in %d partition(s), engine %s",
            self.stats.documents,
            self.stats.tokens,
            len(files),
            len(specs),
            self.engine.name,
        )
        return self.stats

    def build_from_dataset(
        self,
        path: str,
        name: str | None = None,
        *,
        split: str = "train",
        text_field: str = "text",
        data_files: Sequence[str] | None = None,
        max_docs: int | None = None,
    ) -> BuildStats:
        """Tokenize and sort a Hugging Face dataset split, streamed (one record = one document).

        ``path``, ``name``, ``split``, ``data_files`` are those of ``datasets.load_dataset``
        (a hub name, a local directory, or ``"json"`` / ``"parquet"`` with ``data_files``).
        Tasks stream the dataset's shards (:mod:`builder.dataset_source`); ``max_docs`` caps
        the documents read, exactly (in several rounds where some shards run out early).
        May be combined with :meth:`build_from_files` and called again.
        """
        if max_docs is not None and max_docs < 1:
            raise ValueError(f"max_docs must be >= 1, got {max_docs}")
        if self._started is None:
            self._started = time.perf_counter()
        ref = open_dataset(
            path,
            name,
            split,
            data_files=list(data_files) if data_files else None,
            text_field=text_field,
            hf_token=self.hf_token,
        )
        self._text_field = text_field
        before = self.stats.documents
        rounds, tasks = read_in_rounds(
            ref,
            max_docs,
            lambda plan: self._count(
                [self._spec(part.to_dict()) | {"dataset": ref.to_dict()} for part in plan]
            ),
            partitions=self.partitions,
            first_index=len(self._manifests),
        )
        read = {"documents": self.stats.documents - before, "rounds": rounds, "tasks": tasks}
        self._note_dataset(ref, {"text_field": text_field, "max_docs": max_docs} | read)
        return self.stats

    def _note_dataset(self, ref: DatasetRef, record: dict[str, Any]) -> None:
        """Record a dataset read (its ref, how and what was read) in the inputs and the
        graph's build parameters, and log it."""
        self._inputs.append(f"dataset:{ref.path}")
        self._datasets.append(ref.to_dict() | record)
        log.info(
            "read %d documents from %s in %d shard(s), %d task(s), %d round(s), engine %s",
            record["documents"],
            ref.describe(),
            ref.n_shards,
            record["tasks"],
            record["rounds"],
            self.engine.name,
        )

    def build_from_token_documents(
        self,
        documents: Iterable[tuple[Sequence[int] | np.ndarray, int]],
        *,
        source: str,
        weight: int = 1,
    ) -> BuildStats:
        """Index documents that are already token ids (e.g. a model's continuations), in this
        process. documents: (ids, first successor counted): only n-grams whose last token is
        at that position or later are counted (0: all; a prompt's length: its continuation's).
        source names them in the graph's inputs; weight: each occurrence counts this many
        times (1..255).
        """
        if not 1 <= weight <= 255:
            raise BuildError(f"weight must be in 1..255, got {weight}")
        if self._started is None:
            self._started = time.perf_counter()
        checked = checked_token_documents(documents, self.vocab_size, source)
        spec = self._spec({"index": len(self._manifests), "pieces": []})
        manifest = index_token_documents(checked, spec, len(self._manifests), weight)
        self._manifests.append(manifest)
        self.stats.add_task(manifest)
        self._inputs.append(source)
        return self.stats

    def note_distilled(self, record: dict[str, Any]) -> None:
        """Record what ``speculant distill`` added (model, generations, temperature, prompt
        source, ...): it goes into this build's source record (``distilled``)."""
        self._distilled.append(dict(record))

    def _count(self, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run the tasks on the engine, showing progress (:func:`builder.task_runner.run_tasks`);
        their manifests, in spec order."""
        return run_tasks(
            self.engine,
            specs,
            self.stats,
            self._manifests.append,
            progress=self.progress,
            progress_seconds=self.progress_seconds,
        )

    def _spec(self, partition: dict[str, Any]) -> dict[str, Any]:
        """The plain-data task spec of one partition (see :func:`index_partition`)."""
        return {
            "partition": partition,
            "work_dir": str(self._run_dir),
            "tokenizer": self.tokenizer_name,
            "hf_token": self.hf_token,
            "fingerprint": self.fingerprint,
            "vocab_size": self.vocab_size,
            "batch_docs": self.batch_docs,
            "batch_chars": self.batch_chars,
            "text_field": self._text_field,
            "doc_separator": self._doc_separator,
        }

    # -- writing --------------------------------------------------------------------------

    def check_append(self, path: str | os.PathLike[str]) -> GraphMeta:
        """The meta of the graph at path; BuildError unless this build can be appended to it
        (same tokenizer fingerprint and max order). Checked again by ``save(append=True)``."""
        out = Path(path).expanduser().absolute()
        meta = read_base_meta(out)
        check_compatible(meta, out, **self._append_check())
        return meta

    def _append_check(self) -> dict[str, Any]:
        return {
            "tokenizer_name": self.tokenizer_name,
            "fingerprint": self.fingerprint,
            "max_order": self.max_order,
        }

    def save(self, path: str | os.PathLike[str], *, append: bool = False) -> GraphMeta:
        """Merge the parts, write the graph and publish it atomically at path.

        append: add this build's corpus to that of the graph published at path (see
        :mod:`builder.append`); the new graph's version is one more than that graph's.
        """
        out = Path(path).expanduser().absolute()
        check_output(out)
        if self.stats.tokens == 0:
            raise BuildError("the corpus has no documents: nothing to build")
        if not append:
            return self._write(out, None)
        with append_lock(out):
            return self._write(out, open_base(out, self._append_check()))

    def _write(self, out: Path, base: BaseGraph | None) -> GraphMeta:
        """Merge this build's parts (after the base graph's), write and publish the graph."""
        t0 = time.perf_counter()
        meta = write_graph(
            out,
            self.parts if base is None else [base.part, *self.parts],
            self._run_dir,
            self.vocab_size,
            self.max_order,
            lambda orders, index: self._meta(orders, index, None if base is None else base.meta),
        )
        self.stats.write_seconds += time.perf_counter() - t0
        self.stats.graph_bytes = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
        log.info(
            "published graph %s version %d (%d bytes)", out, meta.version, self.stats.graph_bytes
        )
        return meta

    def _meta(
        self, orders: list[OrderStats], index: dict[str, Any], base: GraphMeta | None
    ) -> GraphMeta:
        """The meta record of the graph written: this build's, added to the base graph's."""
        started = self._started if self._started is not None else time.perf_counter()
        built_at = datetime.now(UTC).isoformat(timespec="seconds")
        version = 1 if base is None else base.version + 1
        sources = [] if base is None else base_sources(base)
        record = source_record(
            version, self._inputs, self.stats.documents, self.stats.tokens, built_at
        )
        if self._distilled:
            record["distilled"] = list(self._distilled)
        sources.append(record)
        return GraphMeta(
            format_version=FORMAT_VERSION,
            max_order=self.max_order,
            tokenizer_name=self.tokenizer_name,
            tokenizer_fingerprint=self.fingerprint,
            vocab_size=self.vocab_size,
            corpus_documents=self.stats.documents + (base.corpus_documents if base else 0),
            corpus_tokens=self.stats.tokens + (base.corpus_tokens if base else 0),
            orders=orders,
            build_params={
                "inputs": list(self._inputs),
                "doc_separator": self._doc_separator,
                "text_field": self._text_field,
                "max_order": self.max_order,
                "datasets": list(self._datasets),
                "engine": self.engine.name,
                "workers": len({m["worker"] for m in self._manifests}),  # distinct processes
                "partitioning": {
                    "partitions": len(self._manifests),
                    "partition_bytes": self.partition_bytes,
                    "requested_partitions": self.partitions,
                    "pieces": sum(len(m["partition"]["pieces"]) for m in self._manifests),
                },
                "stats": {
                    k: round(v, 3) for k, v in asdict(self.stats).items() if k.endswith("seconds")
                },
            },
            built_at=built_at,
            build_seconds=round(time.perf_counter() - started, 3),
            version=version,
            sources=sources,
            # an append keeps the drafting defaults `speculant tune --write` stored in the base
            tuned=dict(base.tuned) if base is not None else {},
            index=index,
        )

    def close(self) -> None:
        """Remove the partitions' parts (also done when the builder is garbage collected) and
        stop the engine if this builder started it."""
        self._cleanup()
        if self._own_engine:
            self.engine.close()

    def __enter__(self) -> GraphBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
