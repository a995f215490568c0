"""``speculant bench build``: time one graph build and report its figures.

Figures: wall time (tokenizer load and engine start included), peak RSS of this process and its
children, and of the largest worker process (reported by the tasks), the engine, its workers and
partitions, tokenize+count wall time and throughput (tokens/s and corpus MiB/s),
tokenizing throughput (tokens per second of tokenizer time) and counting+writing throughput
(tokens per second of counting, spilling, merging and LMDB writing), graph size on disk, corpus
tokens and contexts per order.
"""

from __future__ import annotations

import argparse
import logging
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


def peak_rss_bytes() -> int:
    """Peak resident set size of this process plus that of its largest waited-for child."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) * 1024  # Linux reports KiB


def corpus_bytes(builder) -> int:
    """Bytes of corpus the build read (its file pieces, and the text of dataset records)."""
    files = sum(p["size"] for m in builder._manifests for p in m["partition"]["pieces"])
    return files + sum(r["bytes"] for m in builder._manifests for r in m.get("read", []))


def bench_build(args: argparse.Namespace) -> dict[str, Any]:
    """Build a graph from the arguments of ``bench build`` and return the figures (as
    ``speculant build`` runs: transformers without torch, speculant.torchless)."""
    from speculant.torchless import import_transformers_without_torch

    import_transformers_without_torch()
    from builder import GraphBuilder
    from builder.cli import builder_kwargs, read_inputs

    logging.getLogger("builder").setLevel(logging.WARNING)
    scratch = None
    out = args.out
    if out is None:
        scratch = Path(tempfile.mkdtemp(prefix="speculant-bench-"))
        out = scratch / "graph"
    try:
        t0 = time.perf_counter()
        builder = GraphBuilder(**builder_kwargs(args), progress=False)
        t_loaded = time.perf_counter()
        with builder:
            read_inputs(builder, args)
            meta = builder.save(out)
        wall = time.perf_counter() - t0
        return build_figures(args, builder, meta, Path(out), wall, t_loaded - t0)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def build_figures(
    args: argparse.Namespace,
    builder: Any,
    meta: Any,
    out: Path,
    wall: float,
    tokenizer_load_seconds: float,
) -> dict[str, Any]:
    """The figures of a finished build (see the module docstring) of the graph at out; wall:
    its seconds, tokenizer_load_seconds of them loading the tokenizer."""
    from builder.info import disk_usage

    s = builder.stats
    count_write = s.count_seconds + s.write_seconds
    params = meta.build_params
    return {
        "corpus": list(args.corpus or []) + ([f"dataset:{args.dataset}"] if args.dataset else []),
        "tokenizer": args.tokenizer,
        "max_order": meta.max_order,
        "doc_separator": args.doc_separator,
        "engine": params["engine"],
        "workers": params["workers"],
        "partitions": params["partitioning"]["partitions"],
        "wall_seconds": round(wall, 3),
        "count_wall_seconds": round(s.count_wall_seconds, 3),
        "count_wall_tokens_per_second": round(s.tokens / max(s.count_wall_seconds, 1e-9)),
        "corpus_bytes": corpus_bytes(builder),
        "task_seconds": round(task_s := sum(m["seconds"]["total"] for m in builder._manifests), 3),
        "tokens_per_worker_second": round(s.tokens / max(task_s, 1e-9)),
        "corpus_bytes_per_worker_second": round(corpus_bytes(builder) / max(task_s, 1e-9)),
        "tokenizer_load_seconds": round(tokenizer_load_seconds, 3),
        "read_seconds": round(s.read_seconds, 3),
        "tokenize_seconds": round(s.tokenize_seconds, 3),
        "count_seconds": round(s.count_seconds, 3),
        "merge_write_seconds": round(s.write_seconds, 3),
        "tokenize_tokens_per_second": round(s.tokens / max(s.tokenize_seconds, 1e-9)),
        "count_write_tokens_per_second": round(s.tokens / max(count_write, 1e-9)),
        "peak_rss_bytes": peak_rss_bytes(),
        "worker_peak_rss_bytes": max(
            (m["worker_peak_rss_bytes"] for m in builder._manifests), default=0
        ),
        "graph_size_on_disk_bytes": (size := disk_usage(out)),
        "graph_bytes_per_token": round(size / max(meta.corpus_tokens, 1), 2),
        "build_tokens_per_second": round(s.tokens / max(wall, 1e-9)),
        "max_context": meta.index.get("max_context", meta.max_order),
        "documents": meta.corpus_documents,
        "tokens": meta.corpus_tokens,
        "contexts_per_order": {str(o.order): o.contexts for o in meta.orders},
        "ngrams_per_order": {str(o.order): o.ngrams for o in meta.orders},
    }


def format_bench(f: dict[str, Any]) -> str:
    """The figures as aligned text."""
    mib = 2**20
    lines = [
        f"corpus:                {' '.join(f['corpus'])}",
        f"tokenizer:             {f['tokenizer']} (max order {f['max_order']})",
        f"documents / tokens:    {f['documents']:,} / {f['tokens']:,}",
        f"wall time:             {f['wall_seconds']:.2f} s "
        f"(tokenizer load {f['tokenizer_load_seconds']:.2f} s), "
        f"{f['build_tokens_per_second']:,} tokens/s",
        f"peak RSS:              {f['peak_rss_bytes'] / mib:,.0f} MiB "
        f"(largest worker process: {f['worker_peak_rss_bytes'] / mib:,.0f} MiB)",
        f"engine:                {f['engine']}, {f['workers']} worker process(es), "
        f"{f['partitions']} partition(s)",
        f"tokenize+sort (wall):  {f['count_wall_seconds']:.2f} s, "
        f"{f['count_wall_tokens_per_second']:,} tokens/s, "
        f"{f['corpus_bytes'] / mib / max(f['count_wall_seconds'], 1e-9):,.2f} MiB/s of corpus",
        f"per worker (tasks):    {f['task_seconds']:.2f} task-s, "
        f"{f['tokens_per_worker_second']:,} tokens/s, "
        f"{f['corpus_bytes_per_worker_second'] / mib:,.2f} MiB/s of corpus per worker",
        f"tokenizing:            {f['tokenize_seconds']:.2f} s, "
        f"{f['tokenize_tokens_per_second']:,} tokens/s",
        f"sorting + writing:     {f['count_seconds'] + f['merge_write_seconds']:.2f} s "
        f"(sort {f['count_seconds']:.2f} s, merge+write {f['merge_write_seconds']:.2f} s), "
        f"{f['count_write_tokens_per_second']:,} tokens/s",
        f"graph size on disk:    {f['graph_size_on_disk_bytes'] / mib:,.1f} MiB, "
        f"{f['graph_bytes_per_token']:.1f} bytes a corpus token (contexts up to "
        f"{f['max_context']} tokens)",
        "contexts per order:    "
        + ", ".join(f"{o}: {n:,}" for o, n in f["contexts_per_order"].items()),
    ]
    return "\n".join(lines)
