"""`speculant serve-draft` and `speculant bench draft` as subprocesses; a real tinystories graph."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from graph_factory import write_graph
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.drafts import FAST_RECONNECT
from speculant.config import DraftParams
from speculant.graph_manifest import DATA_FILE
from speculant.ports import free_port
from tests.fixtures.graphs import CORE_CHAINS

SPECULANT = [sys.executable, "-m", "launcher.cli"]


def graph_private_dirty(pid: int, file_name: str = DATA_FILE) -> int:
    """Private_Dirty bytes of the process's mappings of `file_name` (from /proc/PID/smaps): a
    per-process copy of the graph's pages, which must be 0 (the graph is mapped shared)."""
    dirty = 0
    in_mapping = False
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if not first.endswith(":"):  # a mapping header: "start-end perms offset dev inode path"
                in_mapping = line.rstrip().endswith("/" + file_name)
            elif in_mapping and first == "Private_Dirty:":
                dirty += int(line.split()[1]) * 1024  # "Private_Dirty:  12 kB"
    return dirty


def run_serve(graph: Path) -> subprocess.CompletedProcess:
    cmd = [*SPECULANT, "serve-draft", "--graph", str(graph), "--port", str(free_port())]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: tmp / "missing", "graph not found"),
        (lambda tmp: tmp, "has no data.mdb"),
        (lambda tmp: write_graph(tmp / "g", CORE_CHAINS, write_meta=False), "unfinished graph"),
        (lambda tmp: write_graph(tmp / "g", CORE_CHAINS, format_version=7), "format version 7"),
    ],
)
def test_serve_draft_refuses_a_bad_graph(tmp_path: Path, make, message) -> None:
    result = run_serve(make(tmp_path))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1
    assert lines[0].startswith("speculant serve-draft: error:")
    assert message in lines[0]


def test_serve_draft_refuses_a_long_context_past_the_index(core_graph_dir: Path) -> None:
    cmd = [*SPECULANT, "serve-draft", "--graph", str(core_graph_dir), "--long-context", "65"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--long-context: must be in 0..64, got 65" in result.stderr


def test_serve_draft_serves_then_stops_on_sigterm(core_graph_dir: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    cmd = [*SPECULANT, "serve-draft", "--graph", str(core_graph_dir), "--port", str(port)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with grpc.insecure_channel(address, options=FAST_RECONNECT) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                try:
                    request = health_pb2.HealthCheckRequest()
                    if health.Check(request, timeout=0.5).status == 1:
                        break
                except grpc.RpcError:
                    pass
                assert proc.poll() is None, proc.stderr.read()
                assert time.perf_counter() - started < 20, "not SERVING after 20 s"
                time.sleep(0.01)
        # The target is 1 s on an idle machine (see `speculant bench draft`); be lenient here.
        assert time.perf_counter() - started < 10
        # The graph is mapped read-only and shared: its pages are the page cache's, one copy
        # for every draft process, and this one holds no private copy of them.
        assert graph_private_dirty(proc.pid) == 0
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert f"on {address}" in stderr
    assert "Traceback" not in stderr


def test_bench_draft_writes_its_figures(core_graph_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [*SPECULANT, "bench", "draft", "--graph", str(core_graph_dir), "--requests", "100"]
    cmd += ["--k", "4", "--concurrency", "1,2", "--json", str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "in-process Propose" in result.stdout
    figures = json.loads(out.read_text())
    assert figures["in_process"]["median_us"] > 0
    assert [(g["rpc"], g["concurrency"]) for g in figures["grpc"]] == [
        ("unary", 1),
        ("unary", 2),
        ("stream", 1),
        ("stream", 2),
    ]
    assert all(g["p99_ms"] >= g["p50_ms"] > 0 for g in figures["grpc"])
    assert 0 < figures["time_to_serving_s"] < 30
    assert figures["server_rss_bytes"] > 0
    assert figures["server_exit_code"] == 0


def test_bench_draft_refuses_a_bad_graph(tmp_path: Path) -> None:
    cmd = [*SPECULANT, "bench", "draft", "--graph", str(tmp_path / "missing")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "graph not found" in result.stderr


def test_graph_private_dirty_counts_only_the_named_file(tmp_path: Path) -> None:
    import mmap

    data = tmp_path / "data.mdb"
    data.write_bytes(b"\0" * 65536)
    with data.open("r+b") as f, mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE) as private:
        assert graph_private_dirty(os.getpid()) == 0
        private[:8192] = b"x" * 8192  # copy-on-write: two private dirty pages
        assert graph_private_dirty(os.getpid()) == 8192


# -- a real graph (built by builder.GraphBuilder from tinystories) -----------------------------


def test_drafts_on_the_tinystories_graph(tinystories_graph: Path) -> None:
    from draft_service.drafting import Drafter
    from speculant.graph_reader import NGramGraph
    from speculant.tokenizer import load_tokenizer
    from tests.assets import STORIES_MODEL

    tokenizer = load_tokenizer(str(STORIES_MODEL))
    context = tokenizer("Once upon a time, there was a little")["input_ids"]
    with NGramGraph.open(tinystories_graph) as graph:
        assert graph.max_order == 5
        drafter = Drafter(graph)
        proposal = drafter.propose(context, DraftParams(k=8, tree_nodes=0))
        assert len(proposal.token_ids) == 8  # a very common opening never dead-ends
        assert all(1 <= o <= 5 for o in proposal.matched_orders)
        assert proposal.matched_orders[0] == 5
        text = tokenizer.decode(context + proposal.token_ids, skip_special_tokens=True)
        assert text.startswith("Once upon a time, there was a little")
        for strategy in ("greedy", "sampling"):
            for mix in (True, False):
                params = DraftParams(k=8, strategy=strategy, attentive_mix=mix, tree_nodes=0)
                result = drafter.propose(context, params, seed=3)
                for dist in result.distributions:
                    assert np.isclose(dist.probs.sum(), 1.0)
                    assert (dist.probs > 0).all()
                    assert dist.token_ids.max() < graph.vocab_size
    if os.environ.get("SPECULANT_PRINT_DRAFTS"):
        print(text)
