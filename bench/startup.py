"""``speculant bench startup``: how long ``speculant serve-draft`` takes to be SERVING.

Each run launches ``serve-draft --graph G`` as a fresh process (the interpreter, the imports, the
graph opened and its lookup kernels loaded) and times it from the launch to the first health
check that answers SERVING (polled every 5 ms, :func:`bench.drafts.start_service`), then stops it.
The figures are the runs' seconds and their median, min and max, and the CPU seconds (user +
system) the process had used by then: on a shared, busy machine the wall time stretches with
the other load, the CPU time much less.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def run_startup_bench(graph: str, runs: int, workers: int = 8) -> dict[str, Any]:
    """Launch the draft service ``runs`` times; its seconds to SERVING, each and summarised."""
    import psutil

    from bench.drafts import start_service

    seconds, cpu = [], []
    for _ in range(runs):
        process, _, ready_s = start_service(graph, workers)
        times = psutil.Process(process.pid).cpu_times()
        process.terminate()
        process.wait(30)
        seconds.append(ready_s)
        cpu.append(times.user + times.system)
    return {
        "graph": str(Path(graph).resolve()),
        "runs": runs,
        "seconds": [round(s, 4) for s in seconds],
        "median_s": round(statistics.median(seconds), 4),
        "min_s": round(min(seconds), 4),
        "max_s": round(max(seconds), 4),
        "cpu_seconds": [round(s, 4) for s in cpu],
        "median_cpu_s": round(statistics.median(cpu), 4),
    }


def bench_startup(args: argparse.Namespace) -> int:
    """Print (and optionally write as JSON) serve-draft's time to SERVING."""
    figures = run_startup_bench(args.graph, args.runs, args.workers)
    print(
        f"serve-draft {figures['graph']}: SERVING after {figures['median_s'] * 1e3:.0f} ms "
        f"median of {figures['runs']} launches (min {figures['min_s'] * 1e3:.0f}, "
        f"max {figures['max_s'] * 1e3:.0f}); CPU {figures['median_cpu_s'] * 1e3:.0f} ms median"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0
