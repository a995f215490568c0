"""Measure the figures of the reliability table in docs/benchmarks.md (loopback, bounded).

    .venv/bin/python scripts/measure_reliability.py --graph GRAPH --model MODEL [--json OUT]

Each scenario is the one its test checks (tests/test_capacity.py, test_backend_faults.py,
test_input_bounds.py, test_damaged_graphs.py), run with timings: health-check latencies under
open streams, after a burst and with generations in flight (scripts/reliability_load.py); the
time a frozen (SIGSTOPped) verifier takes to fail a request and to turn the gateway NOT_SERVING;
how soon a gateway started without its draft tier drafts once it is up; how long oversize inputs
take to be refused; and the draft service's answers around a truncation of its graph file
(scripts/reliability_faults.py). Prints one line per figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from reliability_faults import frozen_verifier, oversize, truncated_graph  # noqa: E402
from reliability_load import burst_and_load, unread_streams  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--graph", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--freeze-runs", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    figures: dict = {}
    for step in (
        lambda: unread_streams(figures, args.graph),
        lambda: burst_and_load(figures, args.graph, args.model),
        lambda: frozen_verifier(figures, args.graph, args.model, args.freeze_runs),
        lambda: oversize(figures, args.graph, args.model),
        lambda: truncated_graph(figures, args.graph),
    ):
        step()
    for name, value in figures.items():
        print(f"{name}: {value}")
    frozen = [s for s, _ in figures["frozen verifier: stream failed after (s, code), per run"]]
    print(f"frozen verifier: median {statistics.median(frozen):.1f} s, max {max(frozen):.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
