"""Damaged graphs never kill a process: the builder writes a manifest (size and SHA-256 of
data.mdb) at publish, and a graph is checked against it before it is mapped (one without a
manifest, or with a flipped byte, is refused), and a data file that shrinks under a running draft
service makes it answer UNAVAILABLE and report NOT_SERVING (a read already past the new end
reads a zero page instead of raising SIGBUS) until a good graph is published. The commands run
as processes of their own, so a signal shows as a negative exit code."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest

from builder import GraphBuilder
from launcher.cli import main
from speculant.graph_format import GraphFormatError
from speculant.graph_manifest import DATA_FILE, MANIFEST_FILE
from speculant.graph_reader import NGramGraph
from speculant.health import health_status, wait_until_serving
from speculant.ports import free_ports
from speculant.v1 import draft_pb2, draft_pb2_grpc
from tests.assets import ROOT, STORIES_MODEL, STORY_SEPARATOR, TINYSTORIES_CORPUS

CONTEXT = [1, 403, 407, 261, 378, 432]


@pytest.fixture(scope="module")
def good_graph(tmp_path_factory) -> Path:
    """A graph of a slice of the tinystories corpus (a few MB: many pages to truncate)."""
    root = tmp_path_factory.mktemp("damaged")
    corpus = root / "corpus.txt"
    with TINYSTORIES_CORPUS.open(encoding="utf-8") as f:  # the demo kit's 3 MB slice
        corpus.write_text(f.read(2_000_000), encoding="utf-8")
    builder = GraphBuilder(tokenizer_name=str(STORIES_MODEL), max_order=5, progress=False)
    builder.build_from_files([corpus], doc_separator=STORY_SEPARATOR)
    builder.save(root / "graph")
    return root / "graph"


def damaged_copy(good_graph: Path, where: Path, *, manifest: bool, keep: float = 0.5) -> Path:
    """A copy of the graph whose LMDB file (its index and meta record) keeps only `keep` of
    its bytes."""
    copy = where / "graph"
    shutil.copytree(good_graph, copy)
    data = copy / DATA_FILE
    os.truncate(data, int(data.stat().st_size * keep) // 4096 * 4096)
    if not manifest:
        (copy / MANIFEST_FILE).unlink()
    return copy


def speculant(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode > 0, (result.returncode, result.stderr[-500:])  # no signal
    lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert all(needle in lines[0] for needle in needles), lines[0]


@pytest.mark.parametrize("manifest", [True, False], ids=["with-manifest", "no-manifest"])
def test_commands_refuse_a_truncated_graph_with_one_line(good_graph, tmp_path, manifest):
    graph = damaged_copy(good_graph, tmp_path, manifest=manifest)
    why = "the manifest says" if manifest else "has no manifest.json"
    (port,) = free_ports(1)
    assert_one_line_error(speculant("serve-draft", "--graph", str(graph), "--port", str(port)), why)
    assert_one_line_error(speculant("graph-info", str(graph)), why)
    corpus = tmp_path / "more.txt"
    corpus.write_text("Once upon a time there was a cat.", encoding="utf-8")
    appended = speculant(
        "build",
        "--append",
        "--quiet",
        "--out",
        str(graph),
        "--tokenizer",
        str(STORIES_MODEL),
        "--corpus",
        str(corpus),
    )
    assert_one_line_error(appended, why)


def start_draft_process(graph: Path, port: int, log: Path) -> subprocess.Popen:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "serve-draft",
            "--graph",
            str(graph),
            "--port",
            str(port),
            "--reload-interval",
            "0.2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
        cwd=ROOT,
    )
    assert wait_until_serving(f"127.0.0.1:{port}", timeout_s=60), log.read_text()[-2000:]
    return process


def publish(source: Path, graph: Path) -> None:
    """Put a copy of source at graph atomically (as `speculant build` publishes)."""
    staging = graph.parent / f".{graph.name}.staging"
    shutil.copytree(source, staging)
    old = graph.parent / f".{graph.name}.old"
    os.rename(graph, old)
    os.rename(staging, graph)
    shutil.rmtree(old)


def propose(
    stub: draft_pb2_grpc.DraftServiceStub, context: list[int] = CONTEXT
) -> draft_pb2.ProposeResponse:
    return stub.Propose(draft_pb2.ProposeRequest(context_token_ids=context, k=8), timeout=10)


def test_a_hot_reload_onto_a_truncated_graph_keeps_the_old_one_serving(good_graph, tmp_path):
    graph = tmp_path / "served" / "graph"
    graph.parent.mkdir()
    shutil.copytree(good_graph, graph)
    (port,) = free_ports(1)
    log = tmp_path / "draft.log"
    process = start_draft_process(graph, port, log)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            before = propose(stub)
            publish(damaged_copy(good_graph, tmp_path, manifest=False), graph)
            deadline = time.monotonic() + 10
            while "not reloading" not in log.read_text():
                assert process.poll() is None, f"the draft service died: {process.returncode}"
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.1)
            assert process.poll() is None
            assert propose(stub).draft_token_ids == before.draft_token_ids
            assert health_status(f"127.0.0.1:{port}") == "SERVING"
    finally:
        process.kill()
        process.wait(10)


def test_a_graph_file_truncated_under_the_service_never_kills_it(good_graph, tmp_path):
    graph = tmp_path / "served" / "graph"
    graph.parent.mkdir()
    shutil.copytree(good_graph, graph)
    (port,) = free_ports(1)
    address = f"127.0.0.1:{port}"
    log = tmp_path / "draft.log"
    process = start_draft_process(graph, port, log)
    try:
        with grpc.insecure_channel(address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            expected = propose(stub).draft_token_ids
            os.truncate(graph / DATA_FILE, 8192)  # under the running service
            codes = set()
            for i in range(50):  # other contexts each time: lookups in the map, not caches
                try:
                    propose(stub, [*CONTEXT[:-2], 300 + i, 400 - i])
                    codes.add(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.add(exc.code())
                    assert "damaged" in exc.details()
            assert process.poll() is None, f"the draft service died: {process.returncode}"
            assert codes == {grpc.StatusCode.UNAVAILABLE}
            assert health_status(address) == "NOT_SERVING"
            assert "shrank from" in log.read_text()
            publish(good_graph, graph)  # a good graph again: served without a restart
            assert wait_until_serving(address, timeout_s=10)
            assert propose(stub).draft_token_ids == expected
    finally:
        process.kill()
        process.wait(10)


def test_a_read_past_a_truncated_end_reads_zeros_instead_of_killing(good_graph, tmp_path):
    graph = tmp_path / "graph"
    shutil.copytree(good_graph, graph)
    # Read every context of the highest order straight from the maps, after truncating the
    # graph's LMDB file (its index arrays) under them: without the guard, the first page past
    # the new end raises SIGBUS.
    script = textwrap.dedent(
        f"""
        import os
        from speculant.graph_reader import NGramGraph
        graph = NGramGraph.open({str(graph)!r})
        os.truncate({str(graph / DATA_FILE)!r}, 8192)
        try:
            for context in graph.contexts(graph.max_order):
                pass
        except Exception as exc:
            print("lookup error:", type(exc).__name__)
        print("damage:", graph.damage())
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert "damage: a read past the end" in result.stdout, result.stdout  # the guard's doing


# -- the manifest: written at publish, checked at open -----------------------------------------


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
