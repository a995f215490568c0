"""Builder: exact counting (vs brute force), long-document tokenization, the graph layout."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from builder import GraphBuilder
from builder.merge import FAN_IN
from speculant.graph_format import (
    decode_successors,
    open_graph_env,
    order_db_name,
    read_meta,
)
from tests.assets import GPT2_TOKENIZER, STORIES_MODEL, STORY_SEPARATOR, TINYSTORIES_CORPUS, needs


def read_graph(path: Path) -> tuple[dict[int, dict[tuple, dict[int, int]]], object]:
    """Every chain of the graph as {order: {context: {successor: count}}}, plus the meta.

    Also checks the value layout: successors sorted by count desc, then id asc.
    """
    env = open_graph_env(path)
    try:
        meta = read_meta(env, path)
        chains = {}
        for o in range(1, meta.max_order + 1):
            db = env.open_db(order_db_name(o), create=False)
            chain = {}
            with env.begin(db=db) as txn:
                for key, value in txn.cursor():
                    ctx = tuple(np.frombuffer(key, dtype=">u4").tolist())
                    assert len(ctx) == o
                    ids, counts = decode_successors(value)
                    pairs = list(zip(ids.tolist(), counts.tolist(), strict=True))
                    assert pairs == sorted(pairs, key=lambda p: (-p[1], p[0]))
                    chain[ctx] = dict(pairs)
            chains[o] = chain
        return chains, meta
    finally:
        env.close()


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
    ("chunk", "spill", "block"),
    [(10000, 2_000_000, 262_144), (7, 400, 64), (1, 3, 1)],
    ids=["defaults", "tiny-chunks", "one-token-chunks"],
)
def test_counts_exact_vs_brute_force(tmp_path: Path, chunk: int, spill: int, block: int) -> None:
    files, docs = small_corpus(tmp_path)
    if chunk == 1:  # keep the slowest variant small
        files, docs = files[1:], docs[-1:]
    builder = GraphBuilder(
        tokenizer_name=str(STORIES_MODEL),
        max_order=5,
        chunk_size=chunk,
        spill_rows=spill,
        merge_block_rows=block,
    )
    builder.build_from_files([str(f) for f in files], doc_separator=STORY_SEPARATOR)
    if chunk == 7:  # more runs than one merge pass takes: an intermediate pass runs too
        assert max(len(r) for r in builder.runs.values()) > FAN_IN
    builder.save(tmp_path / "graph")
    ids = [builder.tokenizer(d).input_ids for d in docs]
    assert ids[0][0] == builder.tokenizer.bos_token_id  # documents start with BOS, like prompts
    assert_graph_equals(tmp_path / "graph", brute_force(ids, 5), len(docs))
    assert builder.stats.tokens == sum(len(i) for i in ids)


@needs(GPT2_TOKENIZER)
def test_counts_exact_multiword_keys(tmp_path: Path) -> None:
    """gpt-2 (16-bit ids) at order 6: 7 ids per row need two uint64 words per key."""
    files, docs = small_corpus(tmp_path)
    builder = GraphBuilder(
        tokenizer_name=str(GPT2_TOKENIZER), max_order=6, chunk_size=13, spill_rows=1000
    )
    builder.merge_block_rows = 400
    builder.build_from_files([str(f) for f in files], doc_separator=STORY_SEPARATOR)
    builder.save(tmp_path / "graph")
    ids = [builder.tokenizer(d).input_ids for d in docs]
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
    assert m.format_version == 1 and m.max_order == 5 and m.vocab_size == 512
    assert m.tokenizer_name == str(STORIES_MODEL)
    assert m.tokenizer_fingerprint.startswith("sha256:")
    stories = TINYSTORIES_CORPUS.read_text(encoding="utf-8").split(STORY_SEPARATOR)
    assert m.corpus_documents == sum(1 for s in stories if s.strip())
    assert m.build_params["doc_separator"] == STORY_SEPARATOR
    assert m.build_params["inputs"] == [str(TINYSTORIES_CORPUS)]
    assert m.build_params["max_order"] == 5 and m.build_params["chunk_size"] == 10000
    assert m.built_at.endswith("+00:00") and m.build_seconds > 0
    # order 1: one n-gram per token but the last of each document
    assert m.orders[0].total_count == m.corpus_tokens - m.corpus_documents
    assert [o.total_count for o in m.orders] == sorted(
        (o.total_count for o in m.orders), reverse=True
    )


def test_tinystories_sample_vs_brute_force(tinystories_graph: Path) -> None:
    """1,000 random contexts per order (half from the graph, half from the corpus) are exact."""
    from speculant.tokenizer import load_tokenizer

    tok = load_tokenizer(str(STORIES_MODEL))
    docs = TINYSTORIES_CORPUS.read_text(encoding="utf-8").split(STORY_SEPARATOR)
    docs = [d for d in docs if d.strip()]
    # one stream, documents separated by -1 so that no window crosses a boundary
    stream = np.concatenate([np.append(np.asarray(i, np.int64), -1) for i in tok(docs).input_ids])
    rng = random.Random(1234)
    env = open_graph_env(tinystories_graph)
    try:
        for o in range(1, 6):
            db = env.open_db(order_db_name(o), create=False)
            with env.begin(db=db) as txn:
                keys = list(txn.cursor().iternext(keys=True, values=False))
                wins = np.lib.stride_tricks.sliding_window_view(stream, o + 1)  # [N, o+1]
                wins = wins[(wins >= 0).all(axis=1)]
                picked = rng.sample(keys, min(500, len(keys)))
                sample = {tuple(np.frombuffer(k, ">u4").tolist()) for k in picked}
                for row in wins[rng.sample(range(len(wins)), 5000)]:
                    if len(sample) >= min(1000, len(keys)):
                        break
                    sample.add(tuple(row[:o].tolist()))
                assert len(sample) == min(1000, len(keys))
                # brute force: a Counter of successors of each sampled context over the stream
                expected: dict[tuple, Counter] = {c: Counter() for c in sample}
                mult = np.array([512**j for j in range(o)], dtype=np.int64)  # exact: ids < 512
                hashes = wins[:, :o] @ mult
                wanted = np.array([np.array(c, np.int64) @ mult for c in sample])
                for row in wins[np.isin(hashes, wanted)].tolist():
                    ctx = tuple(row[:o])
                    if ctx in expected:
                        expected[ctx][row[o]] += 1
                for ctx, counter in expected.items():
                    value = txn.get(np.asarray(ctx, ">u4").tobytes())
                    assert value is not None, f"order {o}: context {ctx} missing"
                    ids, counts = decode_successors(value)
                    assert dict(zip(ids.tolist(), counts.tolist(), strict=True)) == dict(counter)
    finally:
        env.close()
