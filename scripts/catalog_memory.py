"""Memory of a draft tier serving several graphs to several tenants: REPLICAS serve-draft
processes, each with every --graph, answer ROUNDS Propose calls of the default draft per (graph,
tenant); then each process's RSS, private memory (USS) and PSS, and each graph's bytes and
resident bytes (its pages in the page cache: ListGraphs). Prints JSON.

    .venv/bin/python scripts/catalog_memory.py --graph docs=G_DOCS --graph code=G_CODE \\
        --tenants 4 --replicas 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import psutil

from bench.drafts import make_contexts
from speculant.graph_catalog import parse_graph_specs
from speculant.graph_reader import NGramGraph
from speculant.health import health_status
from speculant.ports import free_port
from speculant.v1 import admin_pb2, admin_pb2_grpc, draft_pb2, draft_pb2_grpc

ADMIN = "catalog-memory"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", action="append", required=True, metavar="NAME=DIR")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=400, help="Propose calls a (graph, tenant)")
    args = parser.parse_args()
    specs, _ = parse_graph_specs(args.graph)
    tenants = ["", *(f"t{i}" for i in range(1, args.tenants))]
    with tempfile.TemporaryDirectory() as tmp:
        token = Path(tmp) / "admin"
        token.write_text(ADMIN)
        replicas = [start(args.graph, token) for _ in range(args.replicas)]
        try:
            report = [
                measure(port, process, specs, tenants, args.rounds) for port, process in replicas
            ]
        finally:
            for _, process in replicas:
                process.terminate()
                process.wait(30)
    print(
        json.dumps({"tenants": len(tenants), "rounds": args.rounds, "replicas": report}, indent=1)
    )


def start(graphs: list[str], token: Path) -> tuple[int, subprocess.Popen]:
    port = free_port()
    command = [sys.executable, "-m", "launcher.cli", "serve-draft", "--port", str(port)]
    command += ["--catalog", "none", "--learn-log", "none", "--admin-token-file", str(token)]
    for graph in graphs:
        command += ["--graph", graph]
    process = subprocess.Popen(command, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while health_status(f"127.0.0.1:{port}") != "SERVING":
        if time.monotonic() > deadline or process.poll() is not None:
            raise SystemExit(f"serve-draft on port {port} did not start")
        time.sleep(0.1)
    return port, process


def measure(port: int, process: subprocess.Popen, specs, tenants: list[str], rounds: int) -> dict:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        for spec in specs:
            contexts = make_contexts(NGramGraph.open(spec.path), rounds, 32, 0)
            for tenant in tenants:
                for context in contexts:
                    request = draft_pb2.ProposeRequest(
                        context_token_ids=context, graph=spec.name, tenant=tenant
                    )
                    stub.Propose(request, timeout=30)
        listed = admin_pb2_grpc.AdminServiceStub(channel).ListGraphs(
            admin_pb2.ListGraphsRequest(), metadata=(("authorization", f"Bearer {ADMIN}"),)
        )
    memory = psutil.Process(process.pid).memory_full_info()
    mib = 2**20
    return {
        "rss_mib": round(memory.rss / mib, 1),
        "uss_mib": round(memory.uss / mib, 1),
        "pss_mib": round(memory.pss / mib, 1),
        "graphs": {
            g.name: {
                "bytes_mib": round(g.bytes / mib, 1),
                "resident_mib": round(g.resident_bytes / mib, 1),
            }
            for g in listed.graphs
        },
    }


if __name__ == "__main__":
    main()
