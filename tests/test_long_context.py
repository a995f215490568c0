"""Long context (speculant.graph_reader, opt-in): a format 2 graph is matched over the last
``window`` tokens; the orders 1..max_order count as ever, and the longest match joins them when
it is longer and at least LONGEST_FROM tokens. Drafts read that window; off, or a format 1
graph, they read max_order."""

from __future__ import annotations

from pathlib import Path

import pytest

from draft_service.drafting import Drafter
from speculant.config import LONG_CONTEXT, DraftConfig, DraftParams
from speculant.errors import InvalidArgumentError
from speculant.graph_format import tail_key
from speculant.graph_reader import LONGEST_FROM, NGramGraph
from speculant.tokenizer import load_tokenizer
from tests.assets import STORIES_MODEL, TINYSTORIES_CORPUS


@pytest.fixture(scope="module")
def story_tokens() -> list[int]:
    """The token ids of a passage of the graph's corpus (its second story)."""
    text = TINYSTORIES_CORPUS.read_text(encoding="utf-8")
    story = [s for s in text.split("\n\n\n") if len(s) > 400][1]
    return load_tokenizer(str(STORIES_MODEL))(story).input_ids


WINDOW = LONG_CONTEXT


@pytest.fixture(scope="module")
def graph(tinystories_graph: Path):
    graph = NGramGraph.open(tinystories_graph)
    assert graph.use_long_context(WINDOW) == WINDOW
    yield graph
    graph.close()


def test_off_by_default_and_bounded(tinystories_graph: Path, story_tokens: list[int]) -> None:
    with NGramGraph.open(tinystories_graph) as plain:
        assert plain.window == plain.max_order == 5
        orders, _, _ = plain.match(tail_key(story_tokens[20 : 20 + WINDOW], WINDOW))
        assert orders == list(range(WINDOW, 0, -1))  # every order of a long tail, as ever
        assert plain.use_long_context(3) == 5  # a window within max_order: off
        with pytest.raises(InvalidArgumentError, match="long_context"):
            plain.use_long_context(65)


def test_a_passage_of_the_corpus_adds_its_longest_match(
    graph: NGramGraph, story_tokens: list[int]
) -> None:
    context = story_tokens[20 : 20 + WINDOW]  # seen verbatim: the match is the whole window
    orders, ids, _counts = graph.match(tail_key(context, WINDOW))
    assert orders == [WINDOW, 5, 4, 3, 2, 1]
    assert story_tokens[20 + WINDOW] in ids[0].tolist()  # what followed it in the corpus
    short, short_ids, _ = graph.match(tail_key(context, 5))  # a max_order tail: as ever
    assert short == [5, 4, 3, 2, 1]
    assert [i.tolist() for i in short_ids] == [i.tolist() for i in ids[1:]]


def test_a_short_longest_match_is_left_out(graph: NGramGraph, story_tokens: list[int]) -> None:
    seen = 0
    for start in range(0, len(story_tokens) - WINDOW, 3):
        context = [0] * (WINDOW - LONGEST_FROM + 1) + story_tokens[start : start + LONGEST_FROM - 1]
        orders, _, _ = graph.match(tail_key(context, WINDOW))  # the match is < LONGEST_FROM
        assert all(o <= graph.max_order for o in orders)
        seen += bool(orders)
    assert seen


def test_backoff_and_top_keep_to_the_kept_orders(graph: NGramGraph, story_tokens: list[int]):
    tail = tail_key(story_tokens[40 : 40 + WINDOW], WINDOW)
    assert graph.match(tail, every_order=False)[0] == [WINDOW]
    assert graph.match(tail, True, top=WINDOW - 1)[0] == [5, 4, 3, 2, 1]
    assert graph.match(tail, True, top=3)[0] == [3, 2, 1]


def test_drafts_follow_the_longest_match(graph: NGramGraph, story_tokens: list[int]) -> None:
    drafter = Drafter(graph)
    params = DraftParams.from_config(DraftConfig(k=4, tree_nodes=0, overlay_weight=0.0))
    proposal = drafter.propose(story_tokens[:60], params)
    assert proposal.matched_orders and proposal.matched_orders[0] >= LONGEST_FROM


def test_a_format_1_graph_reads_its_order(core_graph: NGramGraph) -> None:
    """The hand-made graph of the core tests is a format 1 (LMDB) graph."""
    assert core_graph.meta.format_version == 1
    assert core_graph.window == core_graph.max_order


def test_the_draft_service_installs_every_graph_with_it(tinystories_graph: Path) -> None:
    from draft_service.catalog import GraphSlot

    slot = GraphSlot(long_context=WINDOW)
    loaded = slot.install(NGramGraph.open(tinystories_graph))
    assert loaded.graph.window == loaded.drafter.window == WINDOW
    loaded.graph.close()
