"""Compiled greedy drafts (draft_service.greedy_kernels) against the Python drafters they
replace on the hot path (draft_service.chain, draft_service.tree): replayed contexts give the
same tokens, tree shapes, matched orders, sources and path probabilities, bit for bit."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from bench.drafts import make_contexts
from draft_service.drafting import Drafter
from draft_service.greedy_kernels import SHORT_LIST, CompiledDrafts, row_of, views_of
from draft_service.learning import LiveLayer
from speculant.config import LONG_CONTEXT, DraftParams
from speculant.graph_format import GraphFormatError
from speculant.graph_reader import NGramGraph
from speculant.suffix_index import table_row
from speculant.tokenizer import load_tokenizer
from speculant.types import DraftProposal
from tests.assets import STORIES_MODEL, TINYSTORIES_CORPUS

PARAMS = {
    "default tree": DraftParams(),
    "chain": DraftParams(tree_nodes=0),
    "no overlay": DraftParams(overlay_weight=0.0),
    "chain, no overlay": DraftParams(tree_nodes=0, overlay_weight=0.0),
    "backoff tree": DraftParams(mixing="backoff"),
    "small tree": DraftParams(k=4, tree_nodes=12, overlay_weight=2.0),
    "escape 0.5": DraftParams(escape_weight=0.5, overlay_weight=8.0),
}


def python_drafter(graph: NGramGraph, live: LiveLayer | None = None) -> Drafter:
    """A drafter that never takes the compiled path (today's drafts)."""
    drafter = Drafter(graph, cache_size=0, live=live)
    drafter.compiled = None
    return drafter


def fields(proposal: DraftProposal) -> tuple:
    return (
        proposal.token_ids,
        proposal.parents,
        proposal.matched_orders,
        proposal.sources,
        proposal.path_probs,
    )


@pytest.fixture(scope="module")
def graph(tinystories_graph: Path):
    with NGramGraph.open(tinystories_graph) as g:
        yield g


@pytest.fixture(scope="module")
def stories() -> list[list[int]]:
    """The token ids of the corpus's stories of more than 1,200 characters."""
    text = TINYSTORIES_CORPUS.read_text(encoding="utf-8")
    tokenizer = load_tokenizer(str(STORIES_MODEL))
    return [tokenizer(s).input_ids for s in text.split("\n\n\n") if len(s) > 1200]


@pytest.fixture(scope="module")
def contexts(graph: NGramGraph, stories: list[list[int]]) -> list[list[int]]:
    """Random walks through the graph, and passages of a story (whose own repetitions the
    overlay finds), cut at several points."""
    tokens = stories[3]
    passages = [tokens[:cut] for cut in range(5, len(tokens), max(1, len(tokens) // 25))]
    return make_contexts(graph, 60, 48, seed=7) + passages + [[], [5], [tokens[0]] * 3]


@pytest.mark.parametrize("name", list(PARAMS))
def test_compiled_drafts_equal_the_python_drafts(
    graph: NGramGraph, contexts: list[list[int]], name: str
) -> None:
    params = PARAMS[name]
    compiled, python = Drafter(graph, cache_size=0), python_drafter(graph)
    assert compiled.compiled is not None and compiled.compiled.serves(compiled.resolve(params))
    drafted = 0
    for context in contexts:
        expected = python.propose(context, params)
        got = compiled.propose(context, params)
        assert fields(got) == fields(expected), context
        assert [d.token_ids.tolist() for d in got.distributions] == [[t] for t in got.token_ids]
        drafted += len(got.token_ids)
    assert drafted > 10 * len(contexts)  # the contexts draft: the comparison has content


def test_long_context_drafts_equal_the_python_drafts(
    tinystories_graph: Path, contexts: list[list[int]]
) -> None:
    with NGramGraph.open(tinystories_graph) as graph:
        graph.use_long_context(LONG_CONTEXT)
        compiled, python = Drafter(graph, cache_size=0), python_drafter(graph)
        orders = set()
        for context in contexts:
            for params in (DraftParams(), DraftParams(tree_nodes=0)):
                got = compiled.propose(context, params)
                assert fields(got) == fields(python.propose(context, params))
                orders.update(got.matched_orders)
        assert max(orders) > graph.max_order  # longest matches were drafted from


def test_the_python_path_serves_what_the_kernels_do_not() -> None:
    assert not CompiledDrafts.serves(DraftParams(strategy="sampling").validate())
    assert not CompiledDrafts.serves(DraftParams(mixing="seed").validate())


@pytest.mark.parametrize("name", ["default tree", "chain", "no overlay", "backoff tree"])
def test_drafts_with_a_live_layer_equal_the_python_drafts(
    graph: NGramGraph, contexts: list[list[int]], stories: list[list[int]], name: str
) -> None:
    """The live layer's counts (its documents' suffix index, built again as it learns) join
    the graph's as the Python drafters join its dictionaries: c_graph + w_live c_live; from
    a few documents (short lists) to many (long lists read from their heads)."""
    params = PARAMS[name]
    live = LiveLayer(graph.max_order, build_share=math.inf)  # built at every change
    compiled, python = Drafter(graph, cache_size=0, live=live), python_drafter(graph, live)
    passages = [c for c in contexts if len(c) > 40]
    for learned in [*passages[:2], stories[10:]]:
        for document in learned if isinstance(learned[0], list) else [learned]:
            live.learn([*document[: len(document) // 2], 5, 9, 5, 9, 5])  # odd n-grams too
        changed = 0
        for context in contexts:
            got = compiled.propose(context, params)
            assert fields(got) == fields(python.propose(context, params)), context
            changed += (
                got.token_ids != Drafter(graph, cache_size=0).propose(context, params).token_ids
            )
        assert changed  # the layer's counts moved some drafts


def test_threads_draft_with_scratch_of_their_own(
    graph: NGramGraph, contexts: list[list[int]]
) -> None:
    drafter = Drafter(graph, cache_size=0)
    params = DraftParams()
    expected = [fields(python_drafter(graph).propose(c, params)) for c in contexts]

    def draft(i: int) -> tuple:
        return fields(drafter.propose(contexts[i % len(contexts)], params))

    with ThreadPoolExecutor(max_workers=4) as pool:
        got = list(pool.map(draft, range(3 * len(contexts))))
    assert got == [expected[i % len(contexts)] for i in range(3 * len(contexts))]


def test_a_closed_graph_refuses_to_draft(
    tinystories_graph: Path, contexts: list[list[int]]
) -> None:
    graph = NGramGraph.open(tinystories_graph)
    drafter = Drafter(graph, cache_size=0)
    assert drafter.propose(contexts[0], DraftParams()).token_ids
    graph.close()
    with pytest.raises(GraphFormatError, match="closed"):
        drafter.propose(contexts[0], DraftParams())


def test_by_id_views_hold_the_long_rows_sorted(graph: NGramGraph) -> None:
    index = graph.suffix_index
    offsets, ids, counts, totals, _, _ = views_of(index)
    start = index.table_start
    long_rows = np.flatnonzero(np.diff(start.astype(np.int64)) > SHORT_LIST)
    assert long_rows.size and (offsets[long_rows] >= 0).all()
    for row in long_rows[:50].tolist():
        a, b = int(start[row]), int(start[row + 1])
        at = int(offsets[row])
        view = ids[at : at + b - a]
        assert (np.diff(view.astype(np.int64)) > 0).all()
        by_id = dict(
            zip(index.table_ids[a:b].tolist(), index.table_counts[a:b].tolist(), strict=True)
        )
        assert dict(zip(view.tolist(), counts[at : at + b - a].tolist(), strict=True)) == by_id
    sums = np.add.reduceat(index.table_counts.astype(np.float64), start[:-1].astype(np.int64))
    assert np.array_equal(totals, sums)


def test_the_views_hash_finds_every_tabled_range_and_no_other(graph: NGramGraph) -> None:
    index = graph.suffix_index
    views = views_of(index)
    ranges = list(zip(index.table_lo.tolist(), index.table_hi.tolist(), strict=True))
    assert [row_of(views, lo, hi) for lo, hi in ranges] == list(range(len(ranges)))
    for lo, hi in ranges[:200]:
        for other in ((lo, hi + 1), (lo + 1, hi), (hi, hi + 5)):
            expected = table_row(index.table_lo, index.table_hi, *other)
            assert row_of(views, *other) == expected
