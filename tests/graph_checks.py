"""Graph comparison for tests: two graphs answer the same contexts and corpus figures."""

from __future__ import annotations

from pathlib import Path

from speculant.graph_reader import NGramGraph


def graph_contexts(path: Path) -> tuple[dict[int, dict[tuple, tuple[list, list]]], object]:
    """Every context of every order with its successors and counts, and the meta."""
    with NGramGraph.open(path) as graph:
        out = {
            o: {ctx: (ids.tolist(), counts.tolist()) for ctx, ids, counts in graph.contexts(o)}
            for o in range(1, graph.max_order + 1)
        }
        return out, graph.meta


def assert_same_graph(a: Path, b: Path) -> None:
    """Same contexts, successors and counts, context by context; same corpus figures."""
    ea, ma = graph_contexts(a)
    eb, mb = graph_contexts(b)
    assert ma.max_order == mb.max_order
    for o in ea:
        assert ea[o].keys() == eb[o].keys(), f"order {o}: {len(ea[o])} vs {len(eb[o])} contexts"
        for ctx, successors in ea[o].items():
            assert successors == eb[o][ctx], f"order {o}: successors of {ctx} differ"
    assert (ma.corpus_documents, ma.corpus_tokens) == (mb.corpus_documents, mb.corpus_tokens)
    assert ma.orders == mb.orders
