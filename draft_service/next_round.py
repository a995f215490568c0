"""Which outcomes of a verification to prepare drafts for while the verifier runs.

The *outcome* of verifying a draft d_1..d_k: the verifier accepts d_1..d_j, then emits one
token t (a correction t != d_{j+1}, or the bonus token when j = k). Its likelihood is estimated
cheaply from the highest matching order's successor frequencies f:
f_1(d_1) * ... * f_j(d_j) * f_{j+1}(t).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from speculant.graph_format import tail_key
from speculant.graph_reader import NGramGraph


def likeliest_outcomes(
    graph: NGramGraph, context: list[int], draft: Sequence[int], limit: int
) -> list[tuple[int, int]]:
    """The `limit` likeliest outcomes (j, t) of verifying `draft` after `context`, likeliest
    first (ties: the shorter accepted prefix, then the more frequent token)."""
    best: list[tuple[float, int, int, int]] = []  # min-heap of (estimate, -j, -rank, t)
    running = 1.0  # f_1(d_1) * ... * f_j(d_j)
    for j in range(len(draft) + 1):
        if limit <= 0 or running <= 0 or (len(best) == limit and running <= best[0][0]):
            break  # no outcome from position j on can beat the ones kept (f <= 1)
        successors = top_successors(graph, context + list(draft[:j]), limit + 1)
        if not successors:
            break  # dead end: the drafter knows no continuation here
        frequency_of_draft = 0.0
        for rank, (token, frequency) in enumerate(successors):
            if j < len(draft) and token == draft[j]:
                frequency_of_draft = frequency
                continue  # accepting d_{j+1} is not an outcome that stops at j
            item = (running * frequency, -j, -rank, token)
            if len(best) < limit:
                heapq.heappush(best, item)
            elif item > best[0]:
                heapq.heapreplace(best, item)
        running *= frequency_of_draft
    return [(-neg_j, token) for _, neg_j, _, token in sorted(best, reverse=True)]


def top_successors(graph: NGramGraph, context: list[int], count: int) -> list[tuple[int, float]]:
    """(token, relative frequency) of the `count` most frequent successors at the highest
    order matching context's tail ([] at a dead end)."""
    orders, ids_list, counts_list = graph.match(tail_key(context, graph.max_order), False)
    if not orders:
        return []
    ids, counts = ids_list[0], counts_list[0]  # [n] each, counts descending
    total = float(counts.sum())
    top = min(ids.size, count)
    return [(int(t), float(c) / total) for t, c in zip(ids[:top], counts[:top], strict=True)]
