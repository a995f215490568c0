"""Streamed Propose round trips to a real ``serve-draft``: back to back, and after idle gaps.

A round over the services waits for the verifier's forward, so the draft service sits idle for
the forward's length before each Propose. This measures what that idle time alone does to the
hop (no forward runs here): the round trip beyond the drafter's own time, and that time.

    PYTHONPATH=. .venv/bin/python scripts/idle_hop.py GRAPH [--port 50561] [--gaps 0,2,10,50]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from gateway.backends import GrpcDraftClient
from speculant.config import DraftParams
from speculant.health import wait_until_serving


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph")
    parser.add_argument("--port", type=int, default=50561)
    parser.add_argument("--gaps", default="0,2,10,50", help="idle ms before each call")
    parser.add_argument("--calls", type=int, default=60, help="calls per gap (x5 at gap 0)")
    args = parser.parse_args(argv)
    command = [sys.executable, "-m", "launcher.cli", "serve-draft", "--graph", args.graph]
    server = subprocess.Popen(
        [*command, "--port", str(args.port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        address = f"127.0.0.1:{args.port}"
        if not wait_until_serving(address, timeout_s=120):
            raise SystemExit(f"serve-draft at {address} did not start")
        client = GrpcDraftClient([address])
        context = list(range(1000, 1200))  # 200 tokens, as a chat prompt's
        params = DraftParams(k=16, tree_nodes=0)

        def call() -> tuple[float, float]:
            started = time.perf_counter()
            proposal = client.propose(context, params)
            return time.perf_counter() - started - proposal.seconds, proposal.seconds

        for _ in range(50):
            call()
        for gap_ms in (float(g) for g in args.gaps.split(",")):
            hops, drafts = [], []
            for _ in range(args.calls * (5 if gap_ms == 0 else 1)):
                time.sleep(gap_ms / 1000)
                hop, draft = call()
                hops.append(hop)
                drafts.append(draft)
            print(
                f"idle {gap_ms:5.1f} ms before each call: hop p50 "
                f"{statistics.median(hops) * 1e3:.3f} ms, draft p50 "
                f"{statistics.median(drafts) * 1e3:.3f} ms",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
