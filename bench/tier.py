"""``speculant bench draft-tier``: Propose throughput of 1..N draft processes on one graph.

The draft tier scales on its own: every ``speculant serve-draft`` process memory-maps the same
read-only LMDB file, so the graph's pages sit once in the OS page cache and are shared by all
processes (no copy per process). This benchmark shows both halves:

- throughput: for each process count P, P servers and a fixed set of client *processes*
  (closed loop: each sends its next Propose on an open ProposeStream as soon as the previous one
  answers; client i talks to server i mod P, as the gateway's round robin does). Figure:
  aggregate calls/s over the same wall-clock window, and p50 / p99 latency;
- memory: for each server, its private memory (USS, PSS) and the private dirty bytes of its
  ``data.mdb`` mapping: 0, i.e. no process holds a copy of the graph.

Clients are separate processes (``python -m bench.tier client ...``) so the
client side is not limited by one interpreter's GIL; they exchange JSON, never pickles.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

from bench.drafts import make_contexts, start_service
from speculant.config import DEFAULT_DRAFT_K, DEFAULT_TREE_NODES
from speculant.graph_manifest import DATA_FILE
from speculant.graph_reader import NGramGraph

START_DELAY_S = 1.5  # clients start together this long after launch (all connected by then)


@dataclass
class TierBenchOptions:
    graph: str
    processes: list[int] = field(default_factory=lambda: [1, 2])
    clients: int = 4
    seconds: float = 5.0
    k: int = DEFAULT_DRAFT_K
    tree_nodes: int = DEFAULT_TREE_NODES  # 0 = chains of k
    workers: int = 8
    context_len: int = 32
    seed: int = 0
    json_out: str | None = None


def graph_mapping_dirty_bytes(pid: int, file_name: str = DATA_FILE) -> int:
    """Private_Dirty bytes of the process's mappings of `file_name` (from /proc/PID/smaps).

    The graph is mapped read-only and shared (``r--s``): its resident pages are the OS page
    cache's, one copy for every process. Dirty private pages would be a per-process copy, so
    this must be 0. (Resident size itself says little: the draft service periodically unmaps
    the pages it touched to keep its RSS bounded, see NGramGraph.release_pages.)
    """
    dirty = 0
    in_mapping = False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if not first.endswith(":"):  # a mapping header: "start-end perms offset dev inode path"
                in_mapping = line.rstrip().endswith("/" + file_name)
            elif in_mapping and first == "Private_Dirty:":
                dirty += int(line.split()[1]) * 1024  # "Private_Dirty:  12 kB"
    return dirty


def _process_memory(pid: int) -> dict[str, int]:
    info = psutil.Process(pid).memory_full_info()
    return {
        "rss": info.rss,
        "uss": info.uss,
        "pss": info.pss,
        "graph_private_dirty": graph_mapping_dirty_bytes(pid),
    }


def _launch_clients(
    addresses: list[str], contexts_file: str, options: TierBenchOptions
) -> list[subprocess.Popen]:
    start_at = time.time() + START_DELAY_S
    procs = []
    for i in range(options.clients):
        cmd = [sys.executable, "-m", "bench.tier", "client"]
        cmd += ["--address", addresses[i % len(addresses)], "--contexts", contexts_file]
        cmd += ["--offset", str(i), "--k", str(options.k), "--start-at", f"{start_at:.6f}"]
        cmd += ["--tree-nodes", str(options.tree_nodes)]
        cmd += ["--seconds", str(options.seconds)]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    return procs


def run_processes(
    n_processes: int, contexts_file: str, options: TierBenchOptions
) -> dict[str, object]:
    """Start n_processes servers and the clients; aggregate figures and server memory."""
    servers = []
    try:
        for _ in range(n_processes):
            proc, address, _ready = start_service(options.graph, options.workers)
            servers.append((proc, address))
        clients = _launch_clients([a for _, a in servers], contexts_file, options)
        results = []
        for client in clients:
            out, _ = client.communicate(timeout=options.seconds + 60)
            if client.returncode != 0:
                raise RuntimeError(f"a benchmark client exited with {client.returncode}")
            results.append(json.loads(out))
        memory = [_process_memory(proc.pid) for proc, _ in servers]
    finally:
        for proc, _ in servers:
            proc.terminate()
        for proc, _ in servers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    latencies = [x for r in results for x in r["latencies_ms"]]
    calls = sum(len(r["latencies_ms"]) for r in results)
    window = max(r["elapsed_s"] for r in results)
    return {
        "processes": n_processes,
        "clients": options.clients,
        "calls": calls,
        "calls_per_s": calls / window,
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
        "server_memory": memory,
    }


def run_tier_bench(options: TierBenchOptions) -> dict[str, object]:
    """Measure every process count; print a table; write JSON if asked; return the figures."""
    graph = NGramGraph.open(options.graph)
    try:
        contexts = make_contexts(graph, 2000, options.context_len, options.seed)
        data_size = (Path(options.graph) / DATA_FILE).stat().st_size
    finally:
        graph.close()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        contexts_file = str(Path(tmp) / "contexts.json")
        Path(contexts_file).write_text(json.dumps(contexts))
        for n in options.processes:
            run = run_processes(n, contexts_file, options)
            runs.append(run)
            uss = [m["uss"] for m in run["server_memory"]]
            dirty = [m["graph_private_dirty"] for m in run["server_memory"]]
            print(
                f"{n} draft process(es), {options.clients} client processes: "
                f"{run['calls_per_s']:.0f} Propose/s, p50 {run['p50_ms']:.3f} ms, "
                f"p99 {run['p99_ms']:.3f} ms; private memory (USS) per process "
                f"{statistics.fmean(uss) / 2**20:.1f} MiB (graph file {data_size / 2**20:.1f} "
                f"MiB, mapped shared; private copies of it: {max(dirty)} bytes)"
            )
    base = runs[0]["calls_per_s"]
    for run in runs:
        run["throughput_vs_first"] = run["calls_per_s"] / base
    figures = {
        "graph": str(Path(options.graph).resolve()),
        "data_mdb_bytes": data_size,
        "k": options.k,
        "tree_nodes": options.tree_nodes,
        "seconds": options.seconds,
        "cpu_count": os.cpu_count(),
        "runs": runs,
    }
    print(
        "throughput relative to the first row: "
        + ", ".join(f"{r['processes']} -> {r['throughput_vs_first']:.2f}x" for r in runs)
    )
    if options.json_out:
        Path(options.json_out).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {options.json_out}")
    return figures


def client_main(argv: list[str]) -> int:
    """One closed-loop client process; prints {"latencies_ms": [...], "elapsed_s": s} as JSON."""
    import grpc

    from gateway.backends import StreamExchange
    from speculant.config import DraftConfig, DraftParams
    from speculant.v1 import draft_pb2_grpc
    from speculant.wire import propose_request_to_pb

    parser = argparse.ArgumentParser(prog="bench.tier client")
    parser.add_argument("--address", required=True)
    parser.add_argument("--contexts", required=True)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--k", type=int, default=DEFAULT_DRAFT_K)
    parser.add_argument("--tree-nodes", type=int, default=DEFAULT_TREE_NODES)
    parser.add_argument("--start-at", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    contexts = json.loads(Path(args.contexts).read_text())
    defaults = DraftConfig()  # what the gateway asks for when a request sets nothing
    params = DraftParams(
        k=args.k,
        tree_nodes=args.tree_nodes,
        attentive_mix=defaults.attentive_mix,
        mixing=defaults.mixing,
    )
    requests = [propose_request_to_pb(c, params, seed=i) for i, c in enumerate(contexts)]
    channel = grpc.insecure_channel(args.address)
    exchange = StreamExchange(draft_pb2_grpc.DraftServiceStub(channel).ProposeStream, None)
    for request in requests[:20]:  # connect and warm up
        exchange.call(request, "draft")
    time.sleep(max(0.0, args.start_at - time.time()))
    latencies = []
    t_start = time.perf_counter()
    deadline = t_start + args.seconds
    i = args.offset * 97
    while (now := time.perf_counter()) < deadline:
        exchange.call(requests[i % len(requests)], "draft")
        latencies.append((time.perf_counter() - now) * 1e3)
        i += 1
    elapsed = time.perf_counter() - t_start
    exchange.close()
    channel.close()
    print(json.dumps({"latencies_ms": latencies, "elapsed_s": elapsed}))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["client"]:
        sys.exit("usage: python -m bench.tier client ... (started by the benchmark)")
    sys.exit(client_main(sys.argv[2:]))
