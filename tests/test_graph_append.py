"""`speculant build --append`: a graph plus a new corpus equals a build of both corpora, a
mismatched tokenizer or max order is refused, and a failed append leaves the old graph as it was."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import lmdb
import pytest

from builder import GraphBuilder
from builder.errors import BuildError
from launcher.cli import main
from speculant.graph_format import META_DB, META_KEY
from speculant.graph_manifest import DATA_FILE, MANIFEST_FILE, write_manifest
from speculant.graph_reader import NGramGraph
from tests.assets import STORIES_MODEL
from tests.graph_factory import write_graph

CORPORA = {
    "a.txt": "Once upon a time, there was a cat.\n\nThe cat liked to play in the sun.\n\n" * 3,
    "b.txt": "The dog ran to the park.\n\nOnce upon a time, there was a big dog.\n\n" * 2,
    "c.txt": "Lily and Tom went to the sea. They saw a fish!\n\nThe cat ran after it.\n\n",
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("append-corpus")
    for name, text in CORPORA.items():
        (root / name).write_text(text, encoding="utf-8")
    return {name: root / name for name in CORPORA}


def build(out: Path, files: list[Path], *, append: bool = False, max_order: int = 3, **options):
    builder = GraphBuilder(str(STORIES_MODEL), max_order=max_order, progress=False, **options)
    with builder:
        builder.build_from_files(files, doc_separator="\n\n")
        return builder.save(out, append=append)


def entries(graph: Path) -> dict[int, dict[tuple, tuple[list[int], list[int]]]]:
    """Every context of every order with its successors and counts, as the graph answers."""
    with NGramGraph.open(graph) as opened:
        return {
            order: {
                ctx: (ids.tolist(), counts.tolist()) for ctx, ids, counts in opened.contexts(order)
            }
            for order in range(1, opened.max_order + 1)
        }


def snapshot(graph: Path) -> dict[str, str]:
    """SHA-256 of every file of the graph directory, and the names beside it."""
    files = {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in graph.iterdir()}
    siblings = [p.name for p in graph.parent.iterdir() if not p.name.endswith(".append.lock")]
    files["<siblings>"] = " ".join(sorted(siblings))
    return files


@pytest.mark.parametrize(
    ("max_order", "options"),
    [
        (3, {}),
        # a higher order, and each build's corpus cut into several partitions
        (7, {"partitions": 3}),
    ],
)
def test_appends_equal_a_build_of_all_corpora(tmp_path, corpus, max_order, options):
    graph = tmp_path / "graph"
    first = build(graph, [corpus["a.txt"]], max_order=max_order, **options)
    assert first.version == 1 and len(first.sources) == 1
    build(graph, [corpus["b.txt"]], append=True, max_order=max_order, **options)
    meta = build(graph, [corpus["c.txt"]], append=True, max_order=max_order, **options)
    scratch = build(tmp_path / "scratch", list(corpus.values()), max_order=max_order)

    assert entries(graph) == entries(tmp_path / "scratch")
    assert meta.orders == scratch.orders
    assert (meta.corpus_documents, meta.corpus_tokens) == (
        scratch.corpus_documents,
        scratch.corpus_tokens,
    )
    assert meta.version == 3
    assert [s["version"] for s in meta.sources] == [1, 2, 3]
    assert [s["inputs"] for s in meta.sources] == [[str(corpus[n])] for n in CORPORA]
    assert sum(s["documents"] for s in meta.sources) == meta.corpus_documents
    with NGramGraph.open(graph) as opened:  # manifest verified
        assert opened.meta.version == 3


def test_a_graph_built_before_versions_gets_version_2_and_its_sources(tmp_path, corpus):
    graph = tmp_path / "graph"
    build(graph, [corpus["a.txt"]])
    env = lmdb.open(str(graph), max_dbs=2, subdir=True)
    try:  # an older builder's meta record: no version, no sources
        db = env.open_db(META_DB, create=False)
        with env.begin(write=True, db=db) as txn:
            old = json.loads(txn.get(META_KEY))
            del old["version"], old["sources"]
            txn.put(META_KEY, json.dumps(old).encode())
    finally:
        env.close()
    write_manifest(graph)
    meta = build(graph, [corpus["b.txt"]], append=True)
    assert meta.version == 2
    assert meta.sources[0]["inputs"] == [str(corpus["a.txt"])]
    assert meta.sources[0]["documents"] == old["corpus_documents"]
    assert meta.corpus_documents == old["corpus_documents"] + meta.sources[1]["documents"]


def test_an_open_reader_keeps_reading_the_old_graph(tmp_path, corpus):
    graph = tmp_path / "graph"
    build(graph, [corpus["a.txt"]])
    with NGramGraph.open(graph) as old:
        before = entries(graph)
        build(graph, [corpus["b.txt"]], append=True)
        assert old.meta.version == 1
        for order, chain in before.items():  # every old lookup still answers as before
            for ctx, (expected_ids, expected_counts) in chain.items():
                ids, counts = old.successors(list(ctx))
                assert ids.tolist() == expected_ids, order
                assert counts.tolist() == expected_counts, order
        assert entries(graph) != before
        with NGramGraph.open(graph) as new:
            assert new.meta.version == 2
            assert new.file_id != old.file_id


def test_a_different_tokenizer_is_refused_and_the_graph_untouched(
    tmp_path, corpus, other_tokenizer
):
    graph = tmp_path / "graph"
    build(graph, [corpus["a.txt"]])
    before = snapshot(graph)
    builder = GraphBuilder(str(other_tokenizer), max_order=3, progress=False)
    with builder:
        with pytest.raises(BuildError, match=r"cannot append to .* built with tokenizer"):
            builder.check_append(graph)
        builder.build_from_files([corpus["b.txt"]], doc_separator="\n\n")
        with pytest.raises(BuildError, match="counts of different tokenizers do not add up"):
            builder.save(graph, append=True)
    assert snapshot(graph) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokenizer", "OTHER"], "it was built with tokenizer"),
        (["--tokenizer", str(STORIES_MODEL), "--max-order", "4"], "its max order is 3, this"),
    ],
)
def test_the_cli_refuses_a_mismatched_append_in_one_line(
    tmp_path, corpus, capsys, other_tokenizer, args, message
):
    graph = tmp_path / "graph"
    build(graph, [corpus["a.txt"]])
    before = snapshot(graph)
    args = [str(other_tokenizer) if a == "OTHER" else a for a in args]
    command = ["build", "--corpus", str(corpus["b.txt"]), *args, "--append", "--out", str(graph)]
    assert main([*command, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("speculant build: error: cannot append")
    assert message in err and "Traceback" not in err
    assert snapshot(graph) == before


def test_the_cli_appends_with_the_graphs_max_order(tmp_path, corpus, capsys):
    graph = tmp_path / "graph"
    build(graph, [corpus["a.txt"]], max_order=2)
    command = ["build", "--corpus", str(corpus["b.txt"]), "--tokenizer", str(STORIES_MODEL)]
    command += ["--doc-separator", "\\n\\n", "--append", "--out", str(graph)]
    assert main(command) == 0
    assert "(version 1 -> 2)" in capsys.readouterr().err
    assert main(["graph-info", str(graph), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["version"], info["max_order"]) == (2, 2)
    assert main(["graph-info", str(graph)]) == 0
    assert "v2: 4 documents" in capsys.readouterr().out


def test_append_to_nothing_is_refused(tmp_path, corpus, capsys):
    command = ["build", "--corpus", str(corpus["a.txt"]), "--tokenizer", str(STORIES_MODEL)]
    assert main([*command, "--append", "--out", str(tmp_path / "none"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "nothing to append to" in err and "Traceback" not in err
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("where", ["merge", "write"])
def test_an_interrupted_append_leaves_the_old_graph_intact(tmp_path, corpus, monkeypatch, where):
    graph = tmp_path / "graph"
    build(graph, [corpus["a.txt"]])
    before = snapshot(graph)

    def crash(*_args, **_kwargs):
        raise RuntimeError("simulated crash")

    if where == "merge":  # while merging the new corpus's index with the old graph's
        monkeypatch.setattr("builder.index_writer.merge_into", crash)
    else:  # after the index is written, before the meta record and the publish
        monkeypatch.setattr("builder.graph_output.GraphWriter.write_meta", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        build(graph, [corpus["b.txt"]], append=True)
    assert snapshot(graph) == before  # same files, nothing left beside it but the lock file
    with NGramGraph.open(graph) as opened:
        assert opened.meta.version == 1
    assert (graph / MANIFEST_FILE).is_file() and (graph / DATA_FILE).is_file()


def test_an_append_keeps_the_tuned_drafting_defaults(tmp_path, corpus):
    from dataclasses import replace

    from builder.meta_update import update_meta

    graph = tmp_path / "graph"
    build(graph, [corpus["a.txt"]])
    tuned = {"params": {"mixing": "backoff"}}
    update_meta(graph, lambda meta: replace(meta, tuned=tuned))
    meta = build(graph, [corpus["b.txt"]], append=True)
    assert meta.version == 2 and meta.tuned == tuned
    with NGramGraph.open(graph) as opened:
        assert opened.meta.tuned == tuned


def test_appending_to_a_graph_of_format_1_asks_for_a_rebuild(tmp_path, corpus, capsys):
    """A graph of per-order tables (format 1, built before the suffix index) keeps no stream of
    its corpus: an append is refused in one line, before any tokenizing, and it is untouched."""
    graph = write_graph(tmp_path / "old", {1: {(5,): {6: 1}}}, format_version=1, vocab_size=512)
    before = snapshot(graph)
    command = ["build", "--corpus", str(corpus["b.txt"]), "--tokenizer", str(STORIES_MODEL)]
    assert main([*command, "--append", "--out", str(graph), "--max-order", "1", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "format 1" in err and "rebuild it from its corpus" in err and "Traceback" not in err
    assert snapshot(graph) == before
