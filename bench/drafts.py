"""``speculant bench draft``: the draft service's latency and memory figures.

Measured:
- in-process ``Drafter.propose`` median / p99 in µs (no gRPC);
- time from launching ``speculant serve-draft`` (a subprocess) to health SERVING;
- Propose over gRPC on localhost, p50 / p99 in ms, with a closed-loop client at each concurrency
  (c threads, each sending its next request when the previous one answers);
- the server's RSS after all calls (psutil).

Request contexts are realistic token windows taken from the graph itself: a random key of the
highest order, extended by a seeded random walk through the graph (sampling from q).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from draft_service.drafting import Drafter
from draft_service.step_cache import DEFAULT_CACHE_SIZE
from gateway.backends import StreamExchange
from speculant.config import DEFAULT_DRAFT_K, DEFAULT_TREE_NODES, DraftParams
from speculant.graph_reader import NGramGraph
from speculant.ports import free_port
from speculant.v1 import draft_pb2_grpc
from speculant.wire import propose_request_to_pb

# Poll a starting server every few ms instead of gRPC's default 1 s reconnect backoff.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 5),
    ("grpc.min_reconnect_backoff_ms", 5),
    ("grpc.max_reconnect_backoff_ms", 20),
]


@dataclass
class BenchOptions:
    graph: str
    requests: int = 2000
    k: int = DEFAULT_DRAFT_K
    concurrency: list[int] = field(default_factory=lambda: [1, 4])
    strategy: str = "greedy"
    attentive_mix: bool = True
    mixing: str = "witten-bell"
    tree_nodes: int = DEFAULT_TREE_NODES  # 0 = chains of k
    context_len: int = 32
    workers: int = 8
    seed: int = 0
    json_out: str | None = None


def make_contexts(graph: NGramGraph, n: int, max_len: int, seed: int) -> list[list[int]]:
    """n contexts of max_order..max_len tokens: a random graph key, then a seeded random walk."""
    rng = np.random.default_rng(seed)
    drafter = Drafter(graph)
    contexts = []
    for start in graph.sample_contexts(graph.max_order, n, rng):
        extra = min(64, int(rng.integers(0, max(1, max_len - len(start) + 1))))
        context = list(start)
        if extra:
            walk = DraftParams(k=extra, strategy="sampling", tree_nodes=0)  # a chain
            context += drafter.propose(context, walk, seed=int(rng.integers(1 << 32))).token_ids
        contexts.append(context)
    return contexts


def _percentiles(samples: list[float]) -> dict[str, float]:
    arr = np.asarray(samples)
    return {
        "p50": float(np.percentile(arr, 50)),
        "p99": float(np.percentile(arr, 99)),
        "mean": float(arr.mean()),
    }


def bench_in_process(
    graph: NGramGraph,
    contexts: list[list[int]],
    warmup: list[list[int]],
    params: DraftParams,
    *,
    cache_size: int,
    compiled: bool = True,
) -> dict[str, float]:
    """Median / p99 µs of Drafter.propose over the contexts, after a pass over warmup ones.

    cache_size=0 measures every step from the graph; with the (greedy-only) step cache on, the
    figure includes hits from continuations that random contexts share. compiled False: the
    Python drafters even where the compiled ones serve (draft_service.greedy_kernels).
    """
    drafter = Drafter(graph, cache_size=cache_size)
    if not compiled:
        drafter.compiled = None
    for context in warmup:
        drafter.propose(context, params, seed=1)
    times = []
    lengths = []
    for i, context in enumerate(contexts):
        t0 = time.perf_counter()
        proposal = drafter.propose(context, params, seed=i)
        times.append((time.perf_counter() - t0) * 1e6)
        lengths.append(len(proposal.token_ids))
    stats = _percentiles(times)
    return {
        "cache_size": cache_size,
        "compiled": drafter.compiled is not None
        and drafter.compiled.serves(drafter.resolve(params)),
        "median_us": stats["p50"],
        "p99_us": stats["p99"],
        "mean_us": stats["mean"],
        "mean_draft_len": statistics.fmean(lengths),
    }


def start_service(graph: str, workers: int) -> tuple[subprocess.Popen, str, float]:
    """Launch `speculant serve-draft`; (process, address, seconds until health SERVING)."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "launcher.cli", "serve-draft", "--graph", graph]
    cmd += ["--port", str(port), "--workers", str(workers)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    channel = grpc.insecure_channel(address, options=FAST_RECONNECT)
    health = health_pb2_grpc.HealthStub(channel)
    request = health_pb2.HealthCheckRequest(service="")
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"serve-draft exited with {proc.returncode}: {proc.stderr.read()}"
                )
            try:
                status = health.Check(request, timeout=0.2).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.RpcError:
                pass
            if time.perf_counter() - t0 > 30:
                raise RuntimeError("serve-draft did not report SERVING within 30 s")
            time.sleep(0.005)
        return proc, address, time.perf_counter() - t0
    finally:
        channel.close()


def _clients(
    address: str, concurrency: int, rpc: str
) -> tuple[list[Callable[[Any], Any]], Callable[[], None]]:
    """Each client's Propose call on its own channel (rpc "unary": a call each; "stream": on one
    open ProposeStream), and what closes them all."""
    channels = [grpc.insecure_channel(address) for _ in range(concurrency)]
    stubs = [draft_pb2_grpc.DraftServiceStub(ch) for ch in channels]
    exchanges = []
    if rpc == "stream":
        exchanges = [StreamExchange(stub.ProposeStream, timeout_s=None) for stub in stubs]
        calls = [partial(exchange.call, backend="draft") for exchange in exchanges]
    else:
        calls = [partial(stub.Propose, timeout=5) for stub in stubs]

    def close() -> None:
        for exchange in exchanges:
            exchange.close()
        for channel in channels:
            channel.close()

    return calls, close


def bench_grpc(
    address: str,
    contexts: list[list[int]],
    params: DraftParams,
    concurrency: int,
    requests: int,
    rpc: str = "unary",
) -> dict[str, float]:
    """Closed-loop Propose over gRPC: p50 / p99 / mean ms and calls per second.

    rpc: "unary" (a Propose call each) or "stream" (requests on one open ProposeStream per
    client, as the gateway drafts).
    """
    requests_pb = [propose_request_to_pb(c, params, seed=i) for i, c in enumerate(contexts)]
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    calls, close = _clients(address, concurrency, rpc)
    for call in calls:  # connect and warm up
        for request in requests_pb[:50]:
            call(request)
    barrier = threading.Barrier(concurrency + 1)

    def client(index: int) -> None:
        call = calls[index]
        out = latencies[index]
        barrier.wait()
        for j in range(index, requests, concurrency):
            request = requests_pb[j % len(requests_pb)]
            t0 = time.perf_counter()
            call(request)
            out.append((time.perf_counter() - t0) * 1e3)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    barrier.wait()
    t0 = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - t0
    close()
    merged = [x for lat in latencies for x in lat]
    stats = _percentiles(merged)
    return {
        "rpc": rpc,
        "concurrency": concurrency,
        "requests": len(merged),
        "p50_ms": stats["p50"],
        "p99_ms": stats["p99"],
        "mean_ms": stats["mean"],
        "calls_per_s": len(merged) / elapsed,
    }


def _graph_info(graph: NGramGraph, path: str) -> dict[str, Any]:
    """What the figures record of the graph: its path, orders, vocabulary, tokenizer, corpus
    tokens and size on disk."""
    return {
        "path": str(Path(path).resolve()),
        "max_order": graph.max_order,
        "vocab_size": graph.vocab_size,
        "tokenizer": graph.meta.tokenizer_name,
        "corpus_tokens": graph.meta.corpus_tokens,
        "size_bytes": sum(f.stat().st_size for f in Path(path).iterdir()),
    }


def measure_served(
    options: BenchOptions,
    params: DraftParams,
    runs: list[tuple[str, int]],
    contexts: dict[tuple[str, int], list[list[int]]],
) -> dict[str, Any]:
    """Launch serve-draft, run bench_grpc for each (rpc, concurrency) of runs on its contexts,
    read the server's RSS and stop the server, printing each figure; the figures."""
    proc, address, ready_s = start_service(options.graph, options.workers)
    print(f"serve-draft: health SERVING {ready_s * 1e3:.0f} ms after launch ({address})")
    grpc_results = []
    try:
        for rpc, concurrency in runs:
            run_contexts = contexts[rpc, concurrency]
            result = bench_grpc(address, run_contexts, params, concurrency, options.requests, rpc)
            grpc_results.append(result)
            print(
                f"gRPC Propose ({rpc}), concurrency {concurrency}: "
                f"p50 {result['p50_ms']:.3f} ms, p99 {result['p99_ms']:.3f} ms, "
                f"{result['calls_per_s']:.0f} calls/s"
            )
        rss = psutil.Process(proc.pid).memory_info().rss
        total_calls = sum(r["requests"] for r in grpc_results)
        print(f"server RSS after {total_calls} gRPC calls: {rss / 2**20:.1f} MiB")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {
        "time_to_serving_s": ready_s,
        "grpc": grpc_results,
        "server_rss_bytes": rss,
        "server_calls": total_calls,
        "server_exit_code": proc.returncode,
    }


def run_bench(options: BenchOptions) -> dict:
    """Run every measurement, print the figures, write JSON if asked; return the figures."""
    params = DraftParams(
        k=options.k,
        strategy=options.strategy,
        attentive_mix=options.attentive_mix,
        mixing=options.mixing,
        tree_nodes=options.tree_nodes,
    ).validate()
    graph = NGramGraph.open(options.graph)
    try:
        contexts = make_contexts(graph, options.requests, options.context_len, options.seed)
        graph_info = _graph_info(graph, options.graph)
        warmup = make_contexts(graph, 200, options.context_len, options.seed + 1)
        # Fresh contexts for each gRPC run, so one run does not warm the server for the next.
        runs = [(rpc, c) for rpc in ("unary", "stream") for c in options.concurrency]
        grpc_contexts = {
            run: make_contexts(graph, options.requests, options.context_len, options.seed + 2 + i)
            for i, run in enumerate(runs)
        }
        in_process = bench_in_process(graph, contexts, warmup, params, cache_size=0)
        cached = bench_in_process(graph, contexts, warmup, params, cache_size=DEFAULT_CACHE_SIZE)
        python = bench_in_process(graph, contexts, warmup, params, cache_size=0, compiled=False)
    finally:
        graph.close()
    label = (
        f"in-process Propose (k={params.k}, {params.strategy}, mixing={params.effective_mixing}"
        f", tree_nodes={params.tree_nodes}"
    )
    measured = (("no cache", in_process), ("step cache on", cached), ("Python path", python))
    for name, figures in measured:
        if name != "Python path" and figures["compiled"]:
            name += ", compiled"
        print(
            f"{label}, {name}, {len(contexts)} calls): median {figures['median_us']:.1f} µs, "
            f"p99 {figures['p99_us']:.1f} µs, mean draft length {figures['mean_draft_len']:.2f}"
        )
    figures = {
        "graph": graph_info,
        "params": asdict(params),
        "in_process": in_process,
        "in_process_cached": cached,
        "in_process_python": python,
        **measure_served(options, params, runs, grpc_contexts),
        "cpu_count": os.cpu_count(),
    }
    if options.json_out:
        Path(options.json_out).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {options.json_out}")
    return figures
