"""The graph reader (speculant.graph_reader.NGramGraph) on hand-made graphs: successor lookups,
graphs refused (missing, unfinished, of an unknown version, corrupt, missing an order), a
closed graph, and released pages."""

from __future__ import annotations

import sys
from pathlib import Path

import lmdb
import pytest

from draft_service.drafting import Drafter
from speculant.graph_format import META_DB, META_KEY, GraphFormatError
from speculant.graph_manifest import write_manifest
from speculant.graph_reader import NGramGraph
from tests.fixtures.graphs import CORE_CHAINS, CORE_VOCAB
from tests.graph_factory import write_graph
from tests.seed_formula import SeedParams


def test_successors_lookup(core_graph: NGramGraph) -> None:
    ids, counts = core_graph.successors([20])
    assert ids.tolist() == [21, 22, 23, 24]
    assert counts.tolist() == [5, 3, 1, 1]
    assert core_graph.successors([1, 2, 3])[0].tolist() == [9]
    assert core_graph.successors([5]) is None
    assert core_graph.successors([]) is None
    assert core_graph.successors([1, 2, 3, 4]) is None  # beyond max order
    assert core_graph.meta.max_order == 3
    assert core_graph.vocab_size == CORE_VOCAB


def test_missing_graph_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GraphFormatError, match="not found"):
        NGramGraph.open(tmp_path / "nope")
    with pytest.raises(GraphFormatError, match=r"no data\.mdb"):
        NGramGraph.open(tmp_path)


def test_unfinished_graph_is_refused(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g", CORE_CHAINS, write_meta=False)
    with pytest.raises(GraphFormatError, match="unfinished"):
        NGramGraph.open(path)


def test_unknown_version_is_refused(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g", CORE_CHAINS, format_version=99)
    with pytest.raises(GraphFormatError, match="format version 99"):
        NGramGraph.open(path)


def test_corrupt_meta_is_refused(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g", CORE_CHAINS)
    env = lmdb.open(str(path), max_dbs=4)
    with env.begin(write=True, db=env.open_db(META_DB)) as txn:
        txn.put(META_KEY, b"{not json")
    env.close()
    with pytest.raises(GraphFormatError, match="corrupt"):
        NGramGraph.open(path)


def test_corrupt_data_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data.mdb").write_bytes(b"\x00garbage" * 1000)
    with pytest.raises(GraphFormatError):
        NGramGraph.open(tmp_path)


def test_missing_order_is_refused(tmp_path: Path) -> None:
    path = write_graph(tmp_path / "g", {1: {(1,): {2: 1}}}, max_order=1)
    # Claim a higher max order than the databases hold.
    env = lmdb.open(str(path), max_dbs=4)
    meta_db = env.open_db(META_DB)
    with env.begin(write=True, db=meta_db) as txn:
        raw = txn.get(META_KEY).replace(b'"max_order": 1', b'"max_order": 2')
        txn.put(META_KEY, raw)
    env.close()
    write_manifest(path)  # a consistent graph, only its meta claims order 2
    with pytest.raises(GraphFormatError, match="order 2"):
        NGramGraph.open(path)


def test_closed_graph_refuses_lookups(tmp_path: Path) -> None:
    graph = NGramGraph.open(write_graph(tmp_path / "g", CORE_CHAINS))
    graph.close()
    graph.close()  # idempotent
    with pytest.raises(GraphFormatError, match="closed"):
        Drafter(graph).propose([1], SeedParams())


def test_release_pages_keeps_lookups_working(core_graph: NGramGraph, core_drafter: Drafter) -> None:
    params = SeedParams(k=8, attentive_mix=False)
    before = core_drafter.propose([7, 1], params).token_ids
    released = core_graph.release_pages()
    if sys.platform.startswith("linux"):
        assert released > 0  # the data.mdb mapping was found and advised
    assert core_drafter.propose([7, 1], params).token_ids == before == [2, 3, 9]
