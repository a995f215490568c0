"""In-process Propose latency of one checkout's drafter, for paired comparisons of two
checkouts: run it alternately under each one's code, from outside both checkouts (so that
PYTHONPATH picks the code), and compare the medians.

    cd /tmp && PYTHONPATH=/path/to/old python /path/to/scripts/propose_latency.py OLD_GRAPH
    cd /tmp && PYTHONPATH=/path/to/new python /path/to/scripts/propose_latency.py NEW_GRAPH

Prints one JSON line: the median microseconds of the default draft (a tree of 64 nodes, k 16)
and of a chain of 16, no step cache, over 1,500 seeded random graph contexts of up to 32 tokens
(bench.drafts, as `speculant bench draft` makes them).
"""

from __future__ import annotations

import json
import sys

from bench.drafts import bench_in_process, make_contexts
from speculant.config import DraftParams
from speculant.graph_reader import NGramGraph


def main() -> None:
    graph = NGramGraph.open(sys.argv[1])
    contexts = make_contexts(graph, 1500, 32, 0)
    warm_up = make_contexts(graph, 200, 32, 1)
    drafts = (("tree64", DraftParams()), ("chain16", DraftParams(k=16, tree_nodes=0)))
    medians = {
        name: bench_in_process(graph, contexts, warm_up, params, cache_size=0)["median_us"]
        for name, params in drafts
    }
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
