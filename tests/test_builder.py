"""Builder: exact counts (vs brute force), long-document tokenization, the graph layout."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import builder.index_task
from builder import GraphBuilder
from speculant.graph_format import FORMAT_VERSION, open_graph_env, read_meta
from speculant.graph_reader import NGramGraph
from tests.assets import GPT2_TOKENIZER, STORIES_MODEL, STORY_SEPARATOR, TINYSTORIES_CORPUS, needs


def read_graph(path: Path) -> tuple[dict[int, dict[tuple, dict[int, int]]], object]:
    """Every context of the graph as {order: {context: {successor: count}}}, plus the meta.

    Also checks the successors' order: by count desc, then id asc.
    """
    with NGramGraph.open(path) as graph:
        chains = {}
        for o in range(1, graph.max_order + 1):
            chain = {}
            for ctx, ids, counts in graph.contexts(o):
                assert len(ctx) == o and ctx not in chain
                pairs = list(zip(ids.tolist(), counts.tolist(), strict=True))
                assert pairs == sorted(pairs, key=lambda p: (-p[1], p[0]))
                chain[ctx] = dict(pairs)
            chains[o] = chain
        return chains, graph.meta


def brute_force(docs_ids: list[list[int]], max_order: int) -> dict[int, dict[tuple, Counter]]:
    """collections.Counter of successors per context, per order, within each document."""
    out: dict[int, dict[tuple, Counter]] = {o: {} for o in range(1, max_order + 1)}
    for ids in docs_ids:
        for o in range(1, max_order + 1):
            for i in range(len(ids) - o):
                out[o].setdefault(tuple(ids[i : i + o]), Counter())[ids[i + o]] += 1
    return out


def small_corpus(tmp_path: Path) -> tuple[list[Path], list[str]]:
    """Two plain files (one split by a separator) and their documents."""
    stories = TINYSTORIES_CORPUS.read_text(encoding="utf-8")[:20000].split(STORY_SEPARATOR)[:-1]
    extra = ["a", "Hi", "x y x y x y x y x y", "The end. The end. The end."]
    f1 = tmp_path / "stories.txt"
    f1.write_text(STORY_SEPARATOR.join(stories[:4] + extra + stories[4:]), encoding="utf-8")
    f2 = tmp_path / "single.txt"
    f2.write_text("Once upon a time, once upon a time there was a cat.", encoding="utf-8")
    docs = stories[:4] + extra + stories[4:]
    return [f1, f2], [*docs, f2.read_text(encoding="utf-8")]


def assert_graph_equals(path: Path, expected: dict[int, dict[tuple, Counter]], docs: int):
    chains, meta = read_graph(path)
    assert meta.corpus_documents == docs
    for o, exp in expected.items():
        got = chains[o]
        assert got.keys() == exp.keys(), f"order {o}: contexts differ"
        for ctx, counter in exp.items():
            assert got[ctx] == dict(counter), f"order {o} context {ctx}"
        stats = meta.orders[o - 1]
        assert stats.order == o
        assert stats.contexts == len(exp)
        assert stats.ngrams == sum(len(c) for c in exp.values())
        assert stats.total_count == sum(sum(c.values()) for c in exp.values())


@pytest.mark.parametrize(
    ("sort_chunk", "partitions"),
    [(1 << 22, None), (700, 3), (1, None)],
    ids=["defaults", "small-chunks-and-partitions", "one-document-chunks"],
)
def test_counts_exact_vs_brute_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sort_chunk: int, partitions: int | None
) -> None:
    """The graph's counts equal a brute-force count, whether a task sorts its documents at once
    or in chunks that are merged, and whether the corpus is one partition or several."""
    monkeypatch.setattr(builder.index_task, "SORT_CHUNK_TOKENS", sort_chunk)
    files, docs = small_corpus(tmp_path)
    graph_builder = GraphBuilder(
        tokenizer_name=str(STORIES_MODEL), max_order=5, partitions=partitions
    )
    graph_builder.build_from_files([str(f) for f in files], doc_separator=STORY_SEPARATOR)
    if partitions:
        assert len(graph_builder.parts) > 1
    graph_builder.save(tmp_path / "graph")
    ids = [graph_builder.tokenizer(d).input_ids for d in docs]
    assert ids[0][0] == graph_builder.tokenizer.bos_token_id  # documents start with BOS
    assert_graph_equals(tmp_path / "graph", brute_force(ids, 5), len(docs))
    assert graph_builder.stats.tokens == sum(len(i) for i in ids)


@needs(GPT2_TOKENIZER)
def test_counts_exact_with_a_large_vocabulary(tmp_path: Path) -> None:
    """gpt-2 (50,257 ids) at order 6: the counts are exact."""
    files, docs = small_corpus(tmp_path)
    graph_builder = GraphBuilder(tokenizer_name=str(GPT2_TOKENIZER), max_order=6)
    graph_builder.build_from_files([str(f) for f in files], doc_separator=STORY_SEPARATOR)
    graph_builder.save(tmp_path / "graph")
    ids = [graph_builder.tokenizer(d).input_ids for d in docs]
    assert_graph_equals(tmp_path / "graph", brute_force(ids, 6), len(docs))


def test_jsonl_text_field(tmp_path: Path) -> None:
    records = [{"body": "Tom has a red ball.", "id": 1}, {"body": "Tom has a red hat."}]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    builder = GraphBuilder(tokenizer_name=str(STORIES_MODEL), max_order=3)
    builder.build_from_files([str(path)], text_field="body")
    meta = builder.save(tmp_path / "graph")
    ids = [builder.tokenizer(r["body"]).input_ids for r in records]
    assert_graph_equals(tmp_path / "graph", brute_force(ids, 3), 2)
    assert meta.build_params["text_field"] == "body"


@pytest.mark.parametrize(
    "name", [STORIES_MODEL, pytest.param(GPT2_TOKENIZER, marks=needs(GPT2_TOKENIZER))]
)
def test_long_document_tokenized_exactly(tmp_path: Path, name: Path) -> None:
    """Documents over long_doc_chars are encoded in stitched pieces: same ids as one call."""
    from builder.tokenize import DocumentTokenizer
    from speculant.tokenizer import load_tokenizer

    text = TINYSTORIES_CORPUS.read_text(encoding="utf-8")[:60000]
    code = "def f(x):\n    return x  # ok\n\n\nclass A:\n    pass\n" * 400
    tok = load_tokenizer(str(name))
    dt = DocumentTokenizer(tok, long_doc_chars=3000, piece_chars=2500, overlap_chars=400)
    for doc in (text, code, "short"):
        got = dt.encode_batch([doc, "tail"])
        assert got[0].tolist() == tok(doc).input_ids
        assert got[1].tolist() == tok("tail").input_ids


def test_meta_record(tinystories_graph: Path) -> None:
    chains_meta = read_meta(open_graph_env(tinystories_graph), tinystories_graph)
    m = chains_meta
    assert m.format_version == FORMAT_VERSION and m.max_order == 5 and m.vocab_size == 512
    assert m.tokenizer_name == str(STORIES_MODEL)
    assert m.tokenizer_fingerprint.startswith("sha256:")
    stories = TINYSTORIES_CORPUS.read_text(encoding="utf-8").split(STORY_SEPARATOR)
    assert m.corpus_documents == sum(1 for s in stories if s.strip())
    assert m.build_params["doc_separator"] == STORY_SEPARATOR
    assert m.build_params["inputs"] == [str(TINYSTORIES_CORPUS)]
    assert m.build_params["max_order"] == 5
    assert m.index["stream_tokens"] == m.corpus_tokens + m.corpus_documents  # a SEP after each
    assert m.index["entries"] == m.orders[0].total_count and not m.index["weighted"]
    assert m.built_at.endswith("+00:00") and m.build_seconds > 0
    # order 1: one n-gram per token but the last of each document
    assert m.orders[0].total_count == m.corpus_tokens - m.corpus_documents
    assert [o.total_count for o in m.orders] == sorted(
        (o.total_count for o in m.orders), reverse=True
    )


def test_tinystories_sample_vs_brute_force(tinystories_graph: Path) -> None:
    """1,000 random contexts per order (half from the graph, half from the corpus) are exact,
    and orders past the graph's max order are answered exactly too (the index has them all)."""
    from speculant.tokenizer import load_tokenizer

    tok = load_tokenizer(str(STORIES_MODEL))
    docs = TINYSTORIES_CORPUS.read_text(encoding="utf-8").split(STORY_SEPARATOR)
    docs = [d for d in docs if d.strip()]
    # one stream, documents separated by -1 so that no window crosses a boundary
    stream = np.concatenate([np.append(np.asarray(i, np.int64), -1) for i in tok(docs).input_ids])
    rng = random.Random(1234)
    with NGramGraph.open(tinystories_graph) as graph:
        for o in (1, 2, 3, 4, 5, 7):
            wins = np.lib.stride_tricks.sliding_window_view(stream, o + 1)  # [N, o+1]
            wins = wins[(wins >= 0).all(axis=1)]
            keys = [ctx for ctx, _, _ in graph.contexts(o)]  # every context of the order
            wanted_size = min(1000, len(keys))
            sample = set(rng.sample(keys, min(500, len(keys))))
            for row in wins[rng.sample(range(len(wins)), 5000)]:
                if len(sample) >= wanted_size:
                    break
                sample.add(tuple(row[:o].tolist()))
            assert len(sample) == wanted_size
            # brute force: a Counter of successors of each sampled context over the stream
            expected: dict[tuple, Counter] = {c: Counter() for c in sample}
            mult = np.array([512**j for j in range(o)], dtype=np.int64)  # exact: ids < 512
            hashes = wins[:, :o] @ mult
            wanted = np.array([np.array(c, np.int64) @ mult for c in sample])
            for row in wins[np.isin(hashes, wanted)].tolist():
                ctx = tuple(row[:o])
                if ctx in expected:
                    expected[ctx][row[o]] += 1
            tails = {ctx: np.asarray(ctx, ">u4").tobytes() for ctx in expected}
            for ctx, counter in expected.items():
                orders, ids, counts = graph.match(tails[ctx], every_order=False)
                assert orders and orders[0] == o, f"order {o}: context {ctx} missing"
                assert dict(zip(ids[0].tolist(), counts[0].tolist(), strict=True)) == dict(counter)
