"""The graph is one LMDB environment (format 3): a real build leaves no ``.npy`` file, the index
arrays are zero-copy views over the map that outlive the graph object, a damaged layout is
refused, and a format 2 graph (its index in ``.npy`` files) is still served, with the same
drafts, and appended to (the result is format 3)."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from builder import GraphBuilder
from builder.info import graph_info
from builder.lmdb_writer import GraphWriter
from builder.meta_update import update_meta
from speculant.graph_format import (
    FORMAT_VERSION,
    NPY_FORMAT,
    GraphFormatError,
    open_graph_env,
    read_meta,
)
from speculant.graph_manifest import DATA_FILE, MANIFEST_FILE, write_manifest
from speculant.graph_reader import NGramGraph
from tests.assets import STORIES_MODEL

CORPUS = "Once upon a time, there was a cat.\n\nThe cat liked to play in the sun.\n\n" * 40
MORE = "The dog ran to the park.\n\nOnce upon a time, there was a big dog.\n\n" * 5


def build(out: Path, corpus: Path, *, append: bool = False) -> None:
    builder = GraphBuilder(str(STORIES_MODEL), max_order=4, progress=False)
    with builder:
        builder.build_from_files([corpus], doc_separator="\n\n")
        builder.save(out, append=append)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("store-corpus")
    (root / "a.txt").write_text(CORPUS, encoding="utf-8")
    (root / "b.txt").write_text(MORE, encoding="utf-8")
    return root / "a.txt", root / "b.txt"


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory, corpora: tuple[Path, Path]) -> Path:
    out = tmp_path_factory.mktemp("store") / "graph"
    build(out, corpora[0])
    return out


def answers(path: Path) -> dict[int, list]:
    """Every context of every order with its successors, and the drafts' lookups of a few."""
    with NGramGraph.open(path) as opened:
        found = {
            o: [(c, i.tolist(), n.tolist()) for c, i, n in opened.contexts(o)]
            for o in range(1, opened.max_order + 1)
        }
        rng = np.random.default_rng(0)
        for context in opened.sample_contexts(4, 20, rng):
            tail = np.asarray(context, dtype=">u4").tobytes()
            orders, ids, counts = opened.match(tail)
            found.setdefault(0, []).append((orders, [a.tolist() for a in ids + counts]))
        return found


def as_format_2(graph: Path, out: Path) -> Path:
    """The graph rewritten as format 2 built it: the index as .npy files beside a data.mdb
    holding only the meta record."""
    out.mkdir()
    with NGramGraph.open(graph) as opened:
        for name, array in opened.suffix_index.arrays.items():
            np.save(out / name, np.asarray(array), allow_pickle=False)
        meta = opened.meta
    meta.format_version = NPY_FORMAT
    meta.index = {k: v for k, v in meta.index.items() if k != "arrays"}
    writer = GraphWriter(out)
    writer.write_meta(meta)
    writer.close()
    write_manifest(out)
    return out


def test_a_built_graph_is_one_lmdb_environment(graph):
    assert sorted(f.name for f in graph.iterdir()) == [DATA_FILE, MANIFEST_FILE]
    meta = read_graph_meta(graph)
    assert meta.format_version == FORMAT_VERSION == 3
    assert set(meta.index["arrays"]) >= {"stream.npy", "entries.npy", "table_ids.npy"}


def mappings_of(path: Path) -> list[tuple[int, int]]:
    """The address ranges this process maps of the file (Linux /proc/self/maps)."""
    target, ranges = os.path.realpath(path), []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == target:
            start, end = (int(a, 16) for a in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_index_arrays_are_views_of_the_map_that_outlive_the_graph(graph):
    data = graph / DATA_FILE
    opened = NGramGraph.open(graph)
    arrays = opened.suffix_index.arrays
    for name in ("stream.npy", "entries.npy"):  # the large ones: over the map, not copies
        address = arrays[name].__array_interface__["data"][0]
        assert any(start <= address < end for start, end in mappings_of(data)), name
        assert not arrays[name].flags.writeable and not arrays[name].flags.owndata
    entries = arrays["entries.npy"][2:7]
    expected = entries.tolist()
    del arrays
    opened.close()
    gc.collect()
    assert entries.tolist() == expected  # still mapped: the view holds the lease
    assert mappings_of(data)
    del entries
    gc.collect()
    assert not mappings_of(data)  # the last view gone: the map closes


def test_a_wrong_array_layout_is_refused(graph, tmp_path):
    copy = tmp_path / "graph"
    shutil.copytree(graph, copy)

    def longer_entries(meta):
        meta.index["arrays"]["entries.npy"][1][0] += 1
        return meta

    update_meta(copy, longer_entries)  # a meta record that disagrees with the stored array
    with pytest.raises(GraphFormatError, match=r"entries\.npy has .* bytes, its shape"):
        NGramGraph.open(copy)
    fresh = tmp_path / "no-index"
    fresh.mkdir()
    writer = GraphWriter(fresh)  # the meta record alone: no index database
    writer.write_meta(read_graph_meta(graph))
    writer.close()
    write_manifest(fresh)
    with pytest.raises(GraphFormatError, match="no index database"):
        NGramGraph.open(fresh)


def read_graph_meta(path: Path):
    env = open_graph_env(path)
    try:
        return read_meta(env, path)
    finally:
        env.close()


def test_a_format_2_graph_is_read_with_the_same_answers(graph, tmp_path):
    old = as_format_2(graph, tmp_path / "old")
    with NGramGraph.open(old) as opened:
        assert opened.meta.format_version == NPY_FORMAT and opened.indexed
    assert answers(old) == answers(graph)
    assert graph_info(old)["format_version"] == NPY_FORMAT  # graph-info reads it too


def test_appending_to_a_format_2_graph_writes_format_3(graph, corpora, tmp_path):
    old = as_format_2(graph, tmp_path / "old")
    build(old, corpora[1], append=True)
    fresh = tmp_path / "fresh"
    build(fresh, corpora[0])
    build(fresh, corpora[1], append=True)
    assert not list(old.glob("*.npy"))
    with NGramGraph.open(old) as opened:
        assert opened.meta.format_version == FORMAT_VERSION and opened.meta.version == 2
    assert answers(old) == answers(fresh)
