"""Graph checksums: the builder writes a manifest (size and SHA-256 of data.mdb) at publish;
the draft service checks it when it opens a graph and refuses a damaged one."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from builder import GraphBuilder
from launcher.cli import main
from speculant.graph_format import GraphFormatError
from speculant.graph_manifest import DATA_FILE, MANIFEST_FILE
from speculant.graph_reader import NGramGraph
from tests.assets import STORIES_MODEL

STORIES = "Once upon a time, there was a cat.\n\nThe cat liked to play in the sun.\n\n"


@pytest.fixture(scope="module")
def small_graph(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    corpus = root / "corpus.txt"
    corpus.write_text(STORIES * 20)
    builder = GraphBuilder(tokenizer_name=str(STORIES_MODEL), max_order=3, progress=False)
    builder.build_from_files([corpus], doc_separator="\n\n")
    builder.save(root / "graph")
    return root / "graph"


@pytest.fixture
def copy_of(small_graph, tmp_path) -> Path:
    copy = tmp_path / "graph"
    shutil.copytree(small_graph, copy)
    return copy


def test_the_builder_writes_a_manifest_that_matches(small_graph):
    manifest = json.loads((small_graph / MANIFEST_FILE).read_text())
    data = (small_graph / DATA_FILE).read_bytes()
    assert manifest["files"][DATA_FILE] == {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    NGramGraph.open(small_graph).close()


def test_a_flipped_byte_is_refused(copy_of):
    data = copy_of / DATA_FILE
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(GraphFormatError, match="does not match its checksum"):
        NGramGraph.open(copy_of)


def test_a_truncated_data_file_is_refused_by_the_service_cli(copy_of, capsys):
    data = copy_of / DATA_FILE
    data.write_bytes(data.read_bytes()[:4096])
    assert main(["serve-draft", "--graph", str(copy_of), "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "bytes, the manifest says" in err and "Traceback" not in err


def test_a_graph_without_manifest_is_refused_before_it_is_mapped(copy_of):
    (copy_of / MANIFEST_FILE).unlink()
    with pytest.raises(GraphFormatError, match=r"has no manifest\.json"):
        NGramGraph.open(copy_of)


def test_an_unreadable_manifest_is_refused(copy_of):
    (copy_of / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(GraphFormatError, match=r"unreadable manifest\.json"):
        NGramGraph.open(copy_of)
