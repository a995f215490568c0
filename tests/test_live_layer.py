"""The live layer (online learning in the draft tier) and its learn log, without a model.

- counts equal the definition (every n-gram of the documents kept, nothing of those forgotten),
  however many documents were learned and forgotten;
- the memory cap holds over a long bounded run, measured with tracemalloc (the estimate the cap
  applies to must cover what Python really allocates), and the oldest documents go first;
- concurrent learning and lookups neither fail nor see torn counts;
- a drafter combines c_graph + weight * c_live exactly, and drafts what only the layer knows;
- the learn log replays what was persisted, once per generation id, skips a torn last line,
  refuses another tokenizer's log, and stays bounded by rewriting itself.
"""

from __future__ import annotations

import json
import threading
import tracemalloc
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from graph_factory import write_graph

from draft_service.drafting import Drafter
from draft_service.learning import LearnLog, LearnLogError, LiveLayer
from speculant.config import DraftParams
from speculant.graph_reader import NGramGraph

MAX_ORDER = 3


def packed(ids: list[int]) -> bytes:
    return np.asarray(ids, dtype=">u4").tobytes()


def reference_counts(documents: list[list[int]], max_order: int) -> dict[tuple, Counter]:
    """context tuple -> successor counts, by the definition."""
    counts: dict[tuple, Counter] = defaultdict(Counter)
    for doc in documents:
        for i in range(1, len(doc)):
            for order in range(1, min(max_order, i) + 1):
                counts[tuple(doc[i - order : i])][doc[i]] += 1
    return counts


def layer_counts(layer: LiveLayer, contexts) -> dict[tuple, Counter]:
    got = {}
    for context in contexts:
        for order, items in layer.successors(packed(list(context))):
            if order == len(context):
                got[context] = Counter(dict(items))
    return got


def test_counts_equal_the_definition_as_documents_come_and_go() -> None:
    rng = np.random.default_rng(0)
    documents = [rng.integers(0, 20, rng.integers(2, 40)).tolist() for _ in range(300)]
    layer = LiveLayer(MAX_ORDER, max_bytes=400_000)
    for doc in documents:
        layer.learn(doc)
    kept = [list(np.frombuffer(d, dtype=">u4")) for d in layer.documents()]
    kept = [[int(t) for t in d] for d in kept]
    stats = layer.stats()
    assert 0 < stats.documents < len(documents), "the cap should have forgotten some documents"
    assert kept == documents[len(documents) - stats.documents :]  # the newest, in order
    expected = reference_counts(kept, MAX_ORDER)
    every_context = set(reference_counts(documents, MAX_ORDER))
    got = layer_counts(layer, every_context)
    assert got == {c: n for c, n in expected.items() if n}
    assert stats.contexts == len(expected)
    assert stats.pairs == sum(len(n) for n in expected.values())
    assert stats.tokens == sum(len(d) for d in kept)


def test_successors_are_highest_order_first_and_hashable() -> None:
    layer = LiveLayer(MAX_ORDER)
    layer.learn([5, 6, 7, 5, 6, 8])
    found = layer.successors(packed([9, 5, 6]))
    assert [order for order, _ in found] == [2, 1]  # (9, 5, 6) unseen; (5, 6) and (6,) seen
    assert dict(found)[2] == ((7, 1), (8, 1))
    hash(found)
    assert layer.successors(packed([42])) == ()


def test_the_memory_cap_holds_over_a_long_run() -> None:
    """20,000 tokens into a 2 MiB layer: the estimate never passes the cap, and what Python
    allocates for the layer (tracemalloc) stays below it too."""
    cap = 1 << 21
    rng = np.random.default_rng(1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        layer = LiveLayer(5, max_bytes=cap)
        for i in range(400):
            vocab = 32_000 if i % 2 else 300  # sparse and dense contexts
            layer.learn(rng.integers(0, vocab, 50).tolist())
            if i % 7 == 0:
                doc = layer.documents()[-1]
                for j in range(5, len(doc) // 4):
                    layer.successors(doc[4 * (j - 5) : 4 * j])
            assert layer.estimated_bytes() <= cap
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stats = layer.stats()
    assert stats.learned_documents == 400 and 300 < stats.forgotten_documents < 395
    assert used <= cap, f"the layer holds {used} bytes, over its cap of {cap}"


def test_a_document_larger_than_the_cap_keeps_its_last_tokens() -> None:
    layer = LiveLayer(MAX_ORDER, max_bytes=50_000)
    doc = list(range(200)) * 5
    kept = layer.learn(doc)
    assert 0 < kept < len(doc)
    assert layer.estimated_bytes() <= 50_000
    assert layer.documents()[-1] == packed(doc[-kept:])


def test_concurrent_learning_and_lookups() -> None:
    layer = LiveLayer(MAX_ORDER, max_bytes=200_000)
    rng = np.random.default_rng(2)
    docs = [rng.integers(0, 50, 100).tolist() for _ in range(400)]
    errors: list[BaseException] = []

    def learner(part: list[list[int]]) -> None:
        try:
            for doc in part:
                layer.learn(doc)
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            for _ in range(20_000):
                for order, items in layer.successors(packed(docs[0][:3])):
                    assert 1 <= order <= MAX_ORDER and all(c > 0 for _, c in items)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=learner, args=(docs[i::2],)) for i in range(2)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert layer.estimated_bytes() <= 200_000


# -- drafting with a live layer ---------------------------------------------------------------

CHAINS = {1: {(1,): {2: 3}}, 2: {(1, 2): {3: 1}}}  # the graph: 1 -> 2 -> 3, then a dead end


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory):
    path = write_graph(tmp_path_factory.mktemp("live") / "graph", CHAINS, vocab_size=50)
    with NGramGraph.open(path) as g:
        yield g


def test_drafts_continue_with_what_only_the_layer_knows(graph: NGramGraph) -> None:
    params = DraftParams(k=8, tree_nodes=0, mixing="backoff")
    assert Drafter(graph).propose([1], params).token_ids == [2, 3]  # 3: a dead end
    layer = LiveLayer(graph.max_order)
    layer.learn([1, 2, 3, 4, 5, 6])
    drafted = Drafter(graph, live=layer).propose([1], params)
    assert drafted.token_ids == [2, 3, 4, 5, 6]
    assert set(drafted.sources) == {"graph"}  # the draft tier's shared counts


def test_q_is_the_graph_plus_weight_times_the_layer(graph: NGramGraph) -> None:
    """Backoff at order 1 after (1,): graph {2: 3}, layer {2: 1, 7: 2}, weight 4:
    counts {2: 3 + 4, 7: 8}, q = {2: 7/15, 7: 8/15}."""
    layer = LiveLayer(graph.max_order, weight=4.0)
    layer.learn([9, 1, 2])
    layer.learn([9, 1, 7])
    layer.learn([8, 1, 7])
    drafter = Drafter(graph, live=layer)
    dist, order = drafter.next_distribution([9, 9, 1], DraftParams(mixing="backoff"))
    assert order == 2  # (9, 1) is in the layer only
    assert dict(zip(dist.token_ids.tolist(), dist.probs.tolist(), strict=True)) == pytest.approx(
        {2: 1 / 2, 7: 1 / 2}
    )
    dist, order = drafter.next_distribution([1], DraftParams(mixing="backoff"))
    assert order == 1
    assert dict(zip(dist.token_ids.tolist(), dist.probs.tolist(), strict=True)) == pytest.approx(
        {2: 7 / 15, 7: 8 / 15}
    )


def test_greedy_and_tree_caches_see_what_the_layer_learns(graph: NGramGraph) -> None:
    layer = LiveLayer(graph.max_order, weight=10.0)
    drafter = Drafter(graph, live=layer)
    for tree_nodes in (0, 12):
        params = DraftParams(k=2, tree_nodes=tree_nodes, mixing="backoff")
        assert drafter.propose([1], params).token_ids[0] == 2  # cached now
    layer.learn([1, 7])
    layer.learn([1, 7])
    for tree_nodes in (0, 12):
        params = DraftParams(k=2, tree_nodes=tree_nodes, mixing="backoff")
        assert drafter.propose([1], params).token_ids[0] == 7  # 10 * 2 > 3


# -- the learn log ----------------------------------------------------------------------------


def log_at(path: Path, fingerprint: str = "sha256:abc", max_bytes: int = 1 << 30) -> LearnLog:
    return LearnLog(
        path, tokenizer_fingerprint=fingerprint, max_order=MAX_ORDER, max_bytes=max_bytes
    )


def test_the_log_replays_each_generation_once(tmp_path: Path) -> None:
    log = log_at(tmp_path / "g.learned.jsonl")
    log.append("a", [1, 2, 3])
    log.append("b", [4, 5, 6])
    log.append("a", [1, 2, 3])  # persisted twice (say, by two gateways' retries)
    layer = LiveLayer(MAX_ORDER)
    assert log.replay(layer) == (2, 6)
    assert layer.documents() == [packed([4, 5, 6]), packed([1, 2, 3])]
    header = json.loads((tmp_path / "g.learned.jsonl").read_text().splitlines()[0])
    assert header["format"] == "speculant-learn-log" and header["tokenizer_fingerprint"]


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "g.learned.jsonl"
    log = log_at(path)
    log.append("a", [1, 2, 3])
    with path.open("a") as f:
        f.write('{"id": "b", "tokens": [4, 5')  # a writer killed mid-line
    layer = LiveLayer(MAX_ORDER)
    assert log.replay(layer) == (1, 3)


def test_another_tokenizers_log_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "g.learned.jsonl"
    log_at(path, "sha256:one").append("a", [1, 2, 3])
    with pytest.raises(LearnLogError, match="another tokenizer"):
        log_at(path, "sha256:two").replay(LiveLayer(MAX_ORDER))
    path.write_text("not a log\n")
    with pytest.raises(LearnLogError, match="not a learn log"):
        log_at(path).replay(LiveLayer(MAX_ORDER))


def test_the_log_rewrites_itself_keeping_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "g.learned.jsonl"
    log = log_at(path, max_bytes=4096)
    for i in range(400):
        log.append(f"g{i}", [i % 50, 1, 2, 3])
    assert path.stat().st_size <= 4096
    layer = LiveLayer(MAX_ORDER)
    generations, _ = log.replay(layer)
    assert 10 < generations < 400
    assert layer.documents()[-1] == packed([399 % 50, 1, 2, 3])  # the newest survived
