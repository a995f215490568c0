"""GraphBuilder: corpus files -> tokenized documents -> exact n-gram counts -> LMDB graph.

Document policy: each document (a plain-text file, a piece of one between ``doc_separator``s, or
a JSON-lines record) is tokenized on its own exactly as a prompt would be, with the tokenizer's
default special tokens (a leading BOS for stories260K / Llama tokenizers) and no EOS appended;
no n-gram crosses a document boundary. Orders 1..max_order are counted exactly: an order-o
context is o tokens and its n-grams are o + 1 tokens long.

Pipeline and memory bounds: documents are read as a stream (:mod:`builder.corpus`), tokenized in
batches (:mod:`builder.tokenize`), counted ``chunk_size`` window starts at a time
(:mod:`builder.counting`) into sorted partial-count runs spilled to a temporary directory every
``spill_rows`` rows (:mod:`builder.runs`), merged ``merge_block_rows`` rows at a time
(:mod:`builder.merge`) and appended to LMDB (:mod:`builder.lmdb_writer`) in a temporary directory
that is published atomically (:mod:`builder.publish`).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from builder.corpus import iter_documents, resolve_inputs
from builder.counting import NgramCounter
from builder.errors import BuildError
from builder.keys import KeyCodec, bits_for_vocab
from builder.lmdb_writer import GraphWriter
from builder.merge import merge_runs
from builder.publish import (
    RUNS_PREFIX,
    check_output,
    make_temp_dir,
    publish,
    remove_stale_run_dirs,
    remove_stale_temp_dirs,
)
from builder.runs import RunStore
from speculant.graph_format import FORMAT_VERSION, MAX_SUPPORTED_ORDER, GraphMeta

log = logging.getLogger("builder")


@dataclass
class BuildStats:
    """Figures of a build: counts and the time spent in each phase (seconds)."""

    documents: int = 0
    tokens: int = 0
    read_seconds: float = 0.0  # reading and decoding corpus files
    tokenize_seconds: float = 0.0
    count_seconds: float = 0.0  # counting chunks and spilling runs
    write_seconds: float = 0.0  # merging runs and writing LMDB
    graph_bytes: int = 0


class GraphBuilder:
    """Builds an n-gram graph from corpus files with a Hugging Face tokenizer.

    ``chunk_size``: window starts (about tokens) counted together in one numpy step;
    ``spill_rows``: partial-count rows held in memory before a sorted run is spilled to disk;
    ``merge_block_rows``: rows held by the merge at a time. Together they bound peak memory.
    """

    def __init__(
        self,
        tokenizer_name: str,
        max_order: int = 5,
        chunk_size: int = 10000,
        hf_token: str | None = None,
        *,
        spill_rows: int = 2_000_000,
        merge_block_rows: int = 262_144,
        batch_docs: int = 256,
        batch_chars: int = 1 << 20,
        progress: bool | None = None,
        work_dir: str | os.PathLike[str] | None = None,
        tokenizer=None,
    ) -> None:
        if not 1 <= max_order <= MAX_SUPPORTED_ORDER:
            raise ValueError(f"max_order must be in 1..{MAX_SUPPORTED_ORDER}, got {max_order}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        from builder.tokenize import DocumentTokenizer
        from speculant.tokenizer import load_tokenizer, tokenizer_fingerprint, vocab_size

        self.tokenizer_name = tokenizer_name
        self.max_order = max_order
        self.chunk_size = chunk_size
        self.merge_block_rows = merge_block_rows
        self.batch_docs = batch_docs
        self.batch_chars = batch_chars
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.tokenizer = tokenizer or load_tokenizer(tokenizer_name, hf_token)
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.vocab_size = vocab_size(self.tokenizer)
        self._doc_tokenizer = DocumentTokenizer(self.tokenizer)
        self._bits = bits_for_vocab(self.vocab_size)
        remove_stale_run_dirs(work_dir)
        self._run_dir = Path(tempfile.mkdtemp(prefix=f"{RUNS_PREFIX}{os.getpid()}-", dir=work_dir))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._run_dir, True)
        self._store = RunStore(self._run_dir, max_order, spill_rows)
        self._counter = NgramCounter(max_order, self._bits, chunk_size, self._store)
        self._inputs: list[str] = []
        self._text_field = "text"
        self._doc_separator: str | None = None
        self._started: float | None = None
        self.stats = BuildStats()

    # -- counting -------------------------------------------------------------------------

    def build_from_files(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        text_field: str = "text",
        doc_separator: str | None = None,
    ) -> BuildStats:
        """Read, tokenize and count the corpus (may be called again to add more files)."""
        if self._started is None:
            self._started = time.perf_counter()
        files = resolve_inputs(paths)
        self._inputs.extend(os.fspath(p) for p in paths)
        self._text_field, self._doc_separator = text_field, doc_separator
        from tqdm import tqdm

        stats = self.stats
        bar = tqdm(
            desc="tokenizing+counting",
            unit="doc",
            file=sys.stderr,
            disable=not self.progress,
            dynamic_ncols=True,
        )
        begun = time.perf_counter()
        try:
            docs = iter_documents(files, text_field=text_field, doc_separator=doc_separator)
            for batch in self._timed_batches(docs):
                t0 = time.perf_counter()
                arrays = self._doc_tokenizer.encode_batch(batch)
                t1 = time.perf_counter()
                for ids in arrays:
                    self._counter.add_document(ids)
                    stats.tokens += int(ids.size)
                stats.documents += len(arrays)
                stats.tokenize_seconds += t1 - t0
                stats.count_seconds += time.perf_counter() - t1
                bar.update(len(arrays))
                rate = stats.tokens / max(time.perf_counter() - begun, 1e-9)
                bar.set_postfix_str(f"{stats.tokens:,} tokens, {rate:,.0f} tokens/s", refresh=False)
        finally:
            bar.close()
        log.info(
            "read %d documents, %d tokens from %d file(s)",
            stats.documents,
            stats.tokens,
            len(files),
        )
        return stats

    def _timed_batches(self, docs: Iterator[str]) -> Iterable[list[str]]:
        """Group documents into batches of batch_docs / batch_chars; times the reading."""
        batch: list[str] = []
        chars = 0
        t0 = time.perf_counter()
        for doc in docs:
            batch.append(doc)
            chars += len(doc)
            if len(batch) >= self.batch_docs or chars >= self.batch_chars:
                self.stats.read_seconds += time.perf_counter() - t0
                yield batch
                batch, chars = [], 0
                t0 = time.perf_counter()
        self.stats.read_seconds += time.perf_counter() - t0
        if batch:
            yield batch

    # -- writing --------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> GraphMeta:
        """Merge the runs, write the LMDB graph and publish it atomically at path."""
        out = Path(path).expanduser().absolute()
        check_output(out)
        if self.stats.tokens == 0:
            raise BuildError("the corpus has no documents: nothing to build")
        remove_stale_temp_dirs(out)
        t0 = time.perf_counter()
        count_t0 = time.perf_counter()
        self._counter.flush()
        self._store.spill()
        self.stats.count_seconds += time.perf_counter() - count_t0
        tmp = make_temp_dir(out)
        log.info("merging runs and writing graph to %s (building in %s)", out, tmp.name)
        try:
            run_bytes = sum(
                k.stat().st_size + c.stat().st_size
                for runs in self._store.runs.values()
                for k, c in runs
            )
            writer = GraphWriter(tmp, map_size=2 * run_bytes + (64 << 20))
            try:
                orders = [
                    writer.write_order(
                        KeyCodec(self._bits, o + 1),
                        merge_runs(self._store.runs[o], self.merge_block_rows),
                    )
                    for o in range(1, self.max_order + 1)
                ]
                meta = self._meta(orders, time.perf_counter() - t0)
                writer.write_meta(meta)
            finally:
                writer.close()
            publish(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.stats.write_seconds += time.perf_counter() - t0
        self.stats.graph_bytes = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
        log.info("published graph %s (%d bytes)", out, self.stats.graph_bytes)
        return meta

    def _meta(self, orders, write_seconds: float) -> GraphMeta:
        started = self._started if self._started is not None else time.perf_counter()
        return GraphMeta(
            format_version=FORMAT_VERSION,
            max_order=self.max_order,
            tokenizer_name=self.tokenizer_name,
            tokenizer_fingerprint=self.fingerprint,
            vocab_size=self.vocab_size,
            corpus_documents=self.stats.documents,
            corpus_tokens=self.stats.tokens,
            orders=orders,
            build_params={
                "inputs": list(self._inputs),
                "doc_separator": self._doc_separator,
                "text_field": self._text_field,
                "chunk_size": self.chunk_size,
                "max_order": self.max_order,
                "spill_rows": self._store.spill_rows,
                "merge_block_rows": self.merge_block_rows,
                "stats": {
                    k: round(v, 3) for k, v in asdict(self.stats).items() if k.endswith("seconds")
                },
            },
            built_at=datetime.now(UTC).isoformat(timespec="seconds"),
            build_seconds=round(time.perf_counter() - started, 3),
        )

    def close(self) -> None:
        """Remove the temporary runs (also done when the builder is garbage collected)."""
        self._cleanup()

    def __enter__(self) -> GraphBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
