"""Hot reload of the draft service: a graph newly published at its path is served without a
restart, calls in flight finish on the graph they started with, and a graph of another
tokenizer or a damaged one is refused while the old graph keeps serving."""

from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from graph_factory import is_closed, write_graph
from grpc_health.v1 import health_pb2, health_pb2_grpc

from builder import GraphBuilder
from builder.publish import publish
from draft_service import cli as draft_cli
from draft_service.catalog import GraphSlot
from draft_service.reload import DEFAULT_RELOAD_INTERVAL_S
from draft_service.server import DraftServer, start_server
from speculant.graph_manifest import DATA_FILE, write_manifest
from speculant.graph_reader import NGramGraph
from speculant.ports import free_port
from speculant.tokenizer import load_tokenizer
from speculant.v1 import draft_pb2, draft_pb2_grpc
from tests.assets import STORIES_MODEL

OLD_STORY = "The cat sat on the mat."
NEW_STORY = "The cat ran to the park."
CONTEXT_TEXT = "The cat"
DEADLINE_S = 60  # generous: only a failure waits this long


def wait_for(condition: Callable[[], bool], what: str, clients: tuple = ()) -> None:
    """Poll condition until it holds; fail after DEADLINE_S (never reached when it works), or
    at once when one of the clients (threads with ``errors``) has failed."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        for client in clients:
            assert client.errors == [], f"a call failed while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def stories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Two corpora that continue CONTEXT_TEXT differently, and the tokens involved."""
    root = tmp_path_factory.mktemp("reload-corpus")
    (root / "old.txt").write_text(f"{OLD_STORY}\n\n" * 3, encoding="utf-8")
    (root / "new.txt").write_text(f"{NEW_STORY}\n\n" * 12, encoding="utf-8")
    tokenizer = load_tokenizer(str(STORIES_MODEL))
    context = tokenizer(CONTEXT_TEXT)["input_ids"]
    successors = []
    for story in (OLD_STORY, NEW_STORY):
        ids = tokenizer(story)["input_ids"]
        assert ids[: len(context)] == context
        successors.append(ids[len(context)])
    assert successors[0] != successors[1]
    return {"root": root, "context": context, "old": successors[0], "new": successors[1]}


def build(out: Path, corpus: Path, *, append: bool = False) -> None:
    with GraphBuilder(str(STORIES_MODEL), max_order=3, progress=False) as builder:
        builder.build_from_files([corpus], doc_separator="\n\n")
        builder.save(out, append=append)


def first_token(stub: draft_pb2_grpc.DraftServiceStub, context: list[int]) -> int:
    response = stub.Propose(draft_pb2.ProposeRequest(context_token_ids=context, k=1), timeout=10)
    return response.draft_token_ids[0]


def graph_version(stub: draft_pb2_grpc.DraftServiceStub) -> int:
    return stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=10).graph_version


class StreamClient(threading.Thread):
    """Keeps one ProposeStream busy: a request as soon as the previous answer arrives,
    recording each draft's first token and any error."""

    def __init__(self, address: str, context: list[int]) -> None:
        super().__init__(daemon=True)
        self.address, self.context = address, context
        self.tokens: list[int] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        requests: queue.Queue = queue.Queue()
        with grpc.insecure_channel(self.address) as channel:
            responses = draft_pb2_grpc.DraftServiceStub(channel).ProposeStream(
                iter(requests.get, None)
            )
            try:
                while not self.stop.is_set():
                    requests.put(draft_pb2.ProposeRequest(context_token_ids=self.context, k=3))
                    draft = next(responses)
                    self.tokens.append(draft.draft_token_ids[0])
            except BaseException as exc:  # recorded: the test fails on it
                self.errors.append(exc)
            finally:
                requests.put(None)


class UnaryClient(threading.Thread):
    """Calls Propose (and GetGraphInfo) in a loop, recording first tokens and errors."""

    def __init__(self, address: str, context: list[int]) -> None:
        super().__init__(daemon=True)
        self.address, self.context = address, context
        self.tokens: list[int] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(self.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            while not self.stop.is_set():
                try:
                    self.tokens.append(first_token(stub, self.context))
                    graph_version(stub)
                except BaseException as exc:  # recorded: the test fails on it
                    self.errors.append(exc)
                    return


def test_a_published_append_is_served_without_failing_a_call(tmp_path, stories):
    graph = tmp_path / "graph"
    build(graph, stories["root"] / "old.txt")
    server = start_server(graph, port=0, reload_interval_s=0.1)
    clients = (
        StreamClient(server.address, stories["context"]),
        StreamClient(server.address, stories["context"]),
        UnaryClient(server.address, stories["context"]),
    )
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            assert graph_version(stub) == 1
            assert first_token(stub, stories["context"]) == stories["old"]
            old_graph = server.servicer.graph
            for client in clients:
                client.start()
            wait_for(
                lambda: all(len(c.tokens) >= 5 for c in clients), "the clients to run", clients
            )

            build(graph, stories["root"] / "new.txt", append=True)  # while they run
            wait_for(lambda: graph_version(stub) == 2, "the reload", clients)
            assert first_token(stub, stories["context"]) == stories["new"]
            info = stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=10)
            assert info.corpus_documents == 15
            # the open streams switch at their next request
            seen = [len(c.tokens) for c in clients]
            wait_for(
                lambda: all(
                    len(c.tokens) > n + 3 and c.tokens[-1] == stories["new"]
                    for c, n in zip(clients, seen, strict=True)
                ),
                "the clients to draft from the new graph",
                clients,
            )
    finally:
        for client in clients:
            client.stop.set()
        for client in clients:
            client.join(timeout=DEADLINE_S)
        server.stop(0)
    for client in clients:
        assert client.errors == []
        assert set(client.tokens) == {stories["old"], stories["new"]}
        switch = client.tokens.index(stories["new"])  # once switched, never back
        assert set(client.tokens[switch:]) == {stories["new"]}
    assert server.watcher is not None and server.watcher.reloads == 1
    with pytest.raises(Exception, match="is closed"):  # retired once no call used it
        old_graph.successors(stories["context"][-1:])


def test_a_call_in_flight_keeps_its_graph_until_it_ends(tmp_path):
    first = NGramGraph.open(write_graph(tmp_path / "v1", {1: {(1,): {2: 1}}}, vocab_size=10))
    second = NGramGraph.open(write_graph(tmp_path / "v2", {1: {(1,): {3: 1}}}, vocab_size=10))
    slot = GraphSlot()
    slot.install(first)
    with slot.use() as in_flight:
        slot.install(second)
        with slot.use() as later:
            assert later.graph is second
        assert in_flight.graph.successors([1])[0].tolist() == [2]  # still open
        assert not is_closed(first)
    assert is_closed(first) and not is_closed(second)
    slot.close()
    assert is_closed(second)


@pytest.fixture
def quiet_server(tmp_path) -> Iterator[tuple[DraftServer, Path]]:
    """A server on a hand-made graph that reloads only when asked (no polling)."""
    graph = write_graph(tmp_path / "graph", {1: {(1,): {2: 5}}}, vocab_size=10, fingerprint="fp")
    write_manifest(graph)
    server = start_server(graph, port=0, reload_interval_s=0)
    try:
        yield server, graph
    finally:
        server.stop(0)


def publish_graph(target: Path, chains, *, fingerprint: str = "fp", version: int = 2) -> Path:
    """Write a graph beside target and publish it there atomically, as the builder does."""
    staged = write_graph(
        target.parent / f".staged-{version}",
        chains,
        vocab_size=10,
        fingerprint=fingerprint,
        version=version,
    )
    write_manifest(staged)
    publish(staged, target)
    return target


def test_a_graph_of_another_tokenizer_is_refused(quiet_server, caplog):
    server, graph = quiet_server
    publish_graph(graph, {1: {(1,): {3: 5}}}, fingerprint="other-fp")
    with caplog.at_level(logging.ERROR, logger="draft_service.reload"):
        assert server.reload_graph() is False
    assert "is not the served graph's" in caplog.text and "still serving" in caplog.text
    with grpc.insecure_channel(server.address) as channel:
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        assert first_token(stub, [1]) == 2
        info = stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=10)
        assert (info.tokenizer_fingerprint, info.graph_version) == ("fp", 1)
        publish_graph(graph, {1: {(1,): {4: 5}}}, version=3)  # a good one is taken next
        assert server.reload_graph() is True
        assert first_token(stub, [1]) == 4 and graph_version(stub) == 3


def test_a_damaged_graph_is_refused(quiet_server, caplog):
    server, graph = quiet_server
    publish_graph(graph, {1: {(1,): {3: 5}}})
    data = graph / DATA_FILE
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))  # in place: a new mtime, same inode as the published one
    with caplog.at_level(logging.ERROR, logger="draft_service.reload"):
        assert server.reload_graph() is False
    assert "does not match its checksum" in caplog.text
    with grpc.insecure_channel(server.address) as channel:
        assert first_token(draft_pb2_grpc.DraftServiceStub(channel), [1]) == 2


def test_a_flipped_symlink_is_followed(tmp_path):
    for version, successor in ((1, 2), (2, 3)):
        path = write_graph(
            tmp_path / f"graph.v{version}",
            {1: {(1,): {successor: 5}}},
            vocab_size=10,
            version=version,
        )
        write_manifest(path)
    link = tmp_path / "graph"
    link.symlink_to("graph.v1")
    server = start_server(link, port=0, reload_interval_s=0)
    try:
        (tmp_path / "graph.new").symlink_to("graph.v2")
        os.replace(tmp_path / "graph.new", link)  # atomic flip
        assert server.reload_graph() is True
        with grpc.insecure_channel(server.address) as channel:
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            assert first_token(stub, [1]) == 3
            info = stub.GetGraphInfo(draft_pb2.GetGraphInfoRequest(), timeout=10)
            assert (info.graph_version, Path(info.graph_path).name) == (2, "graph.v2")
    finally:
        server.stop(0)


def test_the_cli_default_interval_is_the_services():
    assert draft_cli.DEFAULT_RELOAD_INTERVAL_S == DEFAULT_RELOAD_INTERVAL_S


def test_serve_draft_reloads_on_sighup(tmp_path):
    graph = write_graph(tmp_path / "graph", {1: {(1,): {2: 5}}}, vocab_size=10, fingerprint="fp")
    write_manifest(graph)
    port = free_port()
    address = f"127.0.0.1:{port}"
    command = [sys.executable, "-m", "launcher.cli", "serve-draft", "--graph", str(graph)]
    command += ["--port", str(port), "--reload-interval", "0"]  # no polling: SIGHUP only
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            wait_for(lambda: serving(health) or proc.poll() is not None, "SERVING")
            assert proc.poll() is None
            stub = draft_pb2_grpc.DraftServiceStub(channel)
            assert graph_version(stub) == 1
            publish_graph(graph, {1: {(1,): {3: 5}}})
            assert graph_version(stub) == 1  # polling is off
            proc.send_signal(signal.SIGHUP)
            wait_for(lambda: graph_version(stub) == 2, "the reload on SIGHUP")
            assert first_token(stub, [1]) == 3
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert "reloaded graph" in stderr and "version 1 -> 2" in stderr
    assert "Traceback" not in stderr


def test_serve_draft_refuses_a_negative_interval(tmp_path):
    graph = write_graph(tmp_path / "graph", {1: {(1,): {2: 5}}}, vocab_size=10)
    command = [sys.executable, "-m", "launcher.cli", "serve-draft", "--graph", str(graph)]
    result = subprocess.run(
        [*command, "--port", "0", "--reload-interval", "-1"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )
    assert result.returncode == 2
    assert "--reload-interval must be >= 0" in result.stderr and "Traceback" not in result.stderr


def serving(health: health_pb2_grpc.HealthStub) -> bool:
    try:
        return health.Check(health_pb2.HealthCheckRequest(), timeout=0.5).status == 1
    except grpc.RpcError:
        return False


def test_the_reload_line_says_what_changed():
    """A rebuild keeps version 1: the line names the build times and the corpus figures that
    changed instead of 'version 1 -> 1'."""
    from dataclasses import replace

    from draft_service.reload import describe_change
    from speculant.graph_format import GraphMeta

    old = GraphMeta(1, 3, "t", "sha256:x", 10, 5, 100, [], {"inputs": ["a.txt"]}, "T1")
    rebuilt = replace(old, corpus_documents=7, corpus_tokens=150, build_params={"inputs": ["b"]})
    rebuilt.built_at = "T2"
    line = describe_change(old, rebuilt)
    assert line.startswith("rebuilt (version 1, built T1 -> T2)")
    assert "documents 5 -> 7" in line and "tokens 100 -> 150" in line
    assert "inputs ['a.txt'] -> ['b']" in line and "version 1 -> 1" not in line
    appended = replace(old, version=2, corpus_documents=9)
    line = describe_change(old, appended)
    assert line.startswith("version 1 -> 2") and "documents 5 -> 9" in line
    assert "100 tokens" in line and "max order 3" in line
