"""Distributed builds: partition planning, local worker processes and Dask (local cluster).

Every engine and partitioning must give the graph of the one-process build, LMDB entry by LMDB
entry; a Dask worker killed mid-build is retried (or, with no retries allowed, the build fails and
publishes nothing).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from pathlib import Path

import lmdb
import psutil
import pytest

import builder.corpus as corpus
import builder.partition as partition
from builder import BuildError, GraphBuilder
from builder.corpus import iter_documents, iter_file_documents
from builder.engines import DaskEngine, LocalEngine
from builder.partition import find_cut, plan_partitions
from speculant.cli import main
from speculant.graph_format import open_graph_env, read_meta
from tests.assets import (
    GPT2_TOKENIZER,
    PYTHON_CORPUS,
    STORIES_MODEL,
    STORY_SEPARATOR,
    TINYSTORIES_CORPUS,
    needs,
)
from tests.graph_checks import assert_same_graph

distributed = pytest.importorskip("distributed")
STORIES = str(STORIES_MODEL)
PY_SEPARATOR = " ===== file: "  # both files of ../shared/corpus/python start a file with it


def build(out: Path, files: list[Path], tokenizer: str, sep: str | None, **kw) -> object:
    b = GraphBuilder(tokenizer_name=tokenizer, max_order=kw.pop("max_order", 4), **kw)
    with b:
        b.build_from_files([str(f) for f in files], doc_separator=sep)
        return b.save(out)


class Slices:
    """Small corpus slices, written on first use: tinystories (2 files, from the demo kit) and
    python source (1 file, from ../shared/corpus/python: tests using it are marked)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.made: dict[str, list[Path]] = {}

    def __getitem__(self, name: str) -> list[Path]:
        if name not in self.made:
            self.made[name] = self._stories() if name == "stories" else self._python()
        return self.made[name]

    def _stories(self) -> list[Path]:
        d = self.directory
        text = TINYSTORIES_CORPUS.read_text(encoding="utf-8")[:600_000]
        stories = text.split(STORY_SEPARATOR)[:-1]
        (d / "s1.txt").write_text(STORY_SEPARATOR.join(stories[:700]), encoding="utf-8")
        (d / "s2.txt").write_text(STORY_SEPARATOR.join(stories[700:]), encoding="utf-8")
        return [d / "s1.txt", d / "s2.txt"]

    def _python(self) -> list[Path]:
        with (PYTHON_CORPUS / "stdlib.py.txt").open(encoding="utf-8") as f:
            code = f.read(1_500_000)
        path = self.directory / "py.txt"
        path.write_text(code[: code.rindex(PY_SEPARATOR)], encoding="utf-8")
        return [path]


# The python slice is tokenized with gpt-2: both come from ../shared.
needs_python = needs(PYTHON_CORPUS, GPT2_TOKENIZER)


@pytest.fixture(scope="module")
def slices(tmp_path_factory: pytest.TempPathFactory) -> Slices:
    return Slices(tmp_path_factory.mktemp("slices"))


class References:
    """The one-process, one-partition builds the other engines must equal, built on first use."""

    def __init__(self, slices: Slices, directory: Path) -> None:
        self.slices = slices
        self.directory = directory
        self.built: dict[str, Path] = {}

    def __getitem__(self, name: str) -> Path:
        if name not in self.built:
            out = self.directory / name
            if name == "stories":
                build(out, self.slices[name], STORIES, STORY_SEPARATOR, workers=1)
            else:
                build(out, self.slices[name], str(GPT2_TOKENIZER), PY_SEPARATOR, workers=1)
            self.built[name] = out
        return self.built[name]


@pytest.fixture(scope="module")
def reference(slices, tmp_path_factory: pytest.TempPathFactory) -> References:
    return References(slices, tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module")
def dask_cluster():
    """A Dask LocalCluster: 2 worker processes, one thread each (with nannies: restartable)."""
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    client = distributed.Client(cluster)
    yield cluster, client
    client.close()
    cluster.close()


# -- partition planning ----------------------------------------------------------------------


@pytest.mark.parametrize("sep", ["\n\n\n", "ab", "é|"])
def test_cuts_match_the_sequential_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sep: str
) -> None:
    """Runs of repeated separators, UTF-8 text and scan blocks smaller than the separator's
    context: whatever the cut points, the partitions yield the documents of one sequential read.
    """
    monkeypatch.setattr(partition, "SCAN_BLOCK_BYTES", 3)
    monkeypatch.setattr(corpus, "READ_BLOCK_BYTES", 5)
    docs = ["héllo", "", sep[:-1], "wörld" + sep[0], "x", " ", "€€€", "last one"]
    text = sep.join(docs) + sep * 3 + "a" + sep[-1] + sep * 2 + "tail"
    path = tmp_path / "c.txt"
    path.write_text(text, encoding="utf-8")
    expected = list(iter_documents([path], doc_separator=sep))
    for size in range(1, len(text.encode()) + 2):
        plan = plan_partitions([path], doc_separator=sep, partition_bytes=size)
        got = [
            d
            for part in plan
            for piece in part.pieces
            for d in iter_file_documents(
                Path(piece.path), doc_separator=sep, start=piece.start, stop=piece.stop
            )
        ]
        assert got == expected, f"partition_bytes={size}"
        assert next(p.start for part in plan for p in part.pieces) == 0


def test_find_cut_is_safe() -> None:
    import io

    data = b"ab\n\n\n\n\ncd\n\n\nef"
    f = io.BytesIO(data)
    # from 3 the occurrences at 3 and 4 overlap the one at 2: the next safe one is at 9
    assert find_cut(f, 3, b"\n\n\n", len(data)) == 12
    assert find_cut(f, 2, b"\n\n\n", len(data)) == 5
    assert find_cut(f, 13, b"\n\n\n", len(data)) is None


def test_plan_packs_small_files_and_cuts_large_ones(tmp_path: Path) -> None:
    small = []
    for i in range(5):
        small.append(tmp_path / f"s{i}.jsonl")
        small[-1].write_text(json.dumps({"text": f"doc {i}"}) + "\n")
    big = tmp_path / "big.jsonl"
    big.write_text("".join(json.dumps({"text": f"record {i} " * 5}) + "\n" for i in range(500)))
    whole = tmp_path / "whole.txt"  # no separator: one document, never cut
    whole.write_text("one document " * 2000)
    files = [*small, big, whole]
    plan = plan_partitions(files, partition_bytes=4000)
    assert len(plan[0].pieces) == 5  # the small files, packed together
    assert all(p.kind == "jsonl" for p in plan[0].pieces)
    cut = [p for part in plan for p in part.pieces if p.path == str(big)]
    assert len(cut) > 5 and cut[0].start == 0 and cut[-1].stop == big.stat().st_size
    assert all(a.stop == b.start for a, b in itertools.pairwise(cut))
    assert [(p.start, p.stop) for p in plan[-1].pieces] == [(0, whole.stat().st_size)]
    assert len(plan_partitions(files, partitions=3)) >= 3
    docs = [
        d
        for part in plan
        for p in part.pieces
        for d in iter_file_documents(Path(p.path), start=p.start, stop=p.stop)
    ]
    assert docs == list(iter_documents(files))


def test_jsonl_error_in_later_partition_names_file_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    good = "".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(100))
    path.write_text(good + "{oops\n")
    plan = plan_partitions([path], partition_bytes=200)
    last = plan[-1].pieces[-1]
    assert last.start > 0
    with pytest.raises(BuildError, match=rf"c\.jsonl \(byte {len(good)}\): not a JSON line"):
        list(iter_file_documents(path, start=last.start, stop=last.stop))


# -- local engine ----------------------------------------------------------------------------


def test_local_worker_processes_equal_one_process(
    slices, reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's default engine with 2 worker processes and 5 partitions: the same graph."""
    out = tmp_path / "graph"
    args = ["build", "--corpus", *map(str, slices["stories"]), "--tokenizer", STORIES]
    args += ["--doc-separator", r"\n\n\n", "--max-order", "4", "--out", str(out)]
    args += ["--workers", "2", "--partitions", "5", "--work-dir", str(tmp_path / "work")]
    assert main(args) == 0
    assert "local engine, 5 partition(s)" in capsys.readouterr().err
    assert_same_graph(out, reference["stories"])
    meta = read_meta(open_graph_env(out), out)
    assert meta.build_params["engine"] == "local" and meta.build_params["workers"] == 2
    assert meta.build_params["partitioning"]["partitions"] == 5
    assert list((tmp_path / "work").iterdir()) == []  # partial counts removed


def test_cli_engine_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["build", "--corpus", str(TINYSTORIES_CORPUS), "--tokenizer", STORIES]
    base += ["--out", str(tmp_path / "g")]
    assert main([*base, "--address", "tcp://127.0.0.1:1"]) == 1
    assert "--address needs --engine dask" in capsys.readouterr().err
    assert main([*base, "--engine", "dask", "--address", "tcp://127.0.0.1:1"]) == 1
    assert "--address needs --work-dir" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()


# -- Dask ------------------------------------------------------------------------------------

# How long a nanny may take to restart a killed worker (it imports the builder again; on a loaded
# 2-core box that took over 60 s once).
WORKER_RESTART_S = 180


@pytest.mark.parametrize(
    "name", ["stories", pytest.param("python", marks=[needs_python, pytest.mark.slow])]
)
def test_dask_equals_local(slices, reference, dask_cluster, tmp_path: Path, name: str) -> None:
    _, client = dask_cluster
    tok, sep = (
        (STORIES, STORY_SEPARATOR) if name == "stories" else (str(GPT2_TOKENIZER), PY_SEPARATOR)
    )
    meta = build(
        tmp_path / "graph",
        slices[name],
        tok,
        sep,
        engine=DaskEngine(client=client),
        partitions=6,
        work_dir=tmp_path / "work",
    )
    assert_same_graph(tmp_path / "graph", reference[name])
    assert meta.build_params["engine"] == "dask"
    assert meta.build_params["partitioning"]["partitions"] >= 6
    assert 1 <= meta.build_params["workers"] <= 2


def test_dask_jsonl_and_parquet_globs(slices, reference, dask_cluster, tmp_path: Path) -> None:
    """The same stories as JSON lines and Parquet (small row groups), by glob: the same graph."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    _, client = dask_cluster
    docs = list(iter_documents(slices["stories"], doc_separator=STORY_SEPARATOR))
    half = len(docs) // 2
    (tmp_path / "in").mkdir()
    with (tmp_path / "in" / "a.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps({"body": d}) + "\n" for d in docs[:half])
    table = pa.table({"body": docs[half:], "n": list(range(len(docs) - half))})
    pq.write_table(table, tmp_path / "in" / "b.parquet", row_group_size=50)
    b = GraphBuilder(
        tokenizer_name=STORIES,
        max_order=4,
        engine=DaskEngine(client=client),
        partition_bytes=60_000,
        work_dir=tmp_path / "work",
    )
    with b:
        b.build_from_files([str(tmp_path / "in" / "*")], text_field="body")
        kinds = {p["kind"] for m in b._manifests for p in m["partition"]["pieces"]}
        meta = b.save(tmp_path / "graph")
    assert kinds == {"jsonl", "parquet"} and meta.build_params["partitioning"]["partitions"] > 4
    assert_same_graph(tmp_path / "graph", reference["stories"])


def test_dask_hf_dataset_streaming(slices, reference, dask_cluster, tmp_path: Path) -> None:
    """The same stories as a Hugging Face dataset (3 JSON-lines shards, streamed by the Dask
    workers, one task per shard): the same graph."""
    pytest.importorskip("datasets")
    _, client = dask_cluster
    docs = list(iter_documents(slices["stories"], doc_separator=STORY_SEPARATOR))
    (tmp_path / "ds").mkdir()
    for i in range(3):
        with (tmp_path / "ds" / f"{i}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps({"body": d}) + "\n" for d in docs[i::3])
    b = GraphBuilder(
        tokenizer_name=STORIES,
        max_order=4,
        engine=DaskEngine(client=client),
        work_dir=tmp_path / "work",
    )
    with b:
        b.build_from_dataset(
            "json", data_files=[str(tmp_path / "ds" / "*.jsonl")], text_field="body"
        )
        meta = b.save(tmp_path / "graph")
    assert_same_graph(tmp_path / "graph", reference["stories"])
    assert meta.build_params["engine"] == "dask"
    assert meta.build_params["datasets"][0]["n_shards"] == 3
    assert meta.build_params["partitioning"]["partitions"] == 3


def test_dask_task_error_names_the_file(dask_cluster, tmp_path: Path) -> None:
    """A bad record in a later partition: one clear error from the worker, nothing published."""
    _, client = dask_cluster
    path = tmp_path / "c.jsonl"
    good = "".join(json.dumps({"text": f"story number {i}"}) + "\n" for i in range(200))
    path.write_text(good + '{"body": "no text"}\n')
    with pytest.raises(BuildError, match=r"c\.jsonl \(byte \d+\): record has no 'text' field"):
        build(
            tmp_path / "graph",
            [path],
            STORIES,
            None,
            engine=DaskEngine(client=client),
            partition_bytes=1000,
            work_dir=tmp_path / "work",
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "work"]


def _kill_a_busy_worker(client, work: Path, killed: list[int], stop: threading.Event) -> None:
    """Once a build task runs, SIGKILL the process of a worker that is processing one."""
    while not stop.is_set():
        busy = [w for w, keys in client.processing().items() if keys]
        if busy and any(work.glob(".speculant-runs-*/part*")):
            pid = client.run(os.getpid, workers=[busy[0]])[busy[0]]
            psutil.Process(pid).kill()
            killed.append(pid)
            return
        time.sleep(0.005)


def _build_while_killing(client, slices, out: Path, work: Path) -> list[int]:
    files = slices["python"]  # written now, before the killer watches the build
    killed: list[int] = []
    stop = threading.Event()
    killer = threading.Thread(target=_kill_a_busy_worker, args=(client, work, killed, stop))
    killer.start()
    try:
        build(
            out,
            files,
            str(GPT2_TOKENIZER),
            PY_SEPARATOR,
            engine=DaskEngine(client=client),
            partitions=10,
            work_dir=work,
        )
    finally:
        stop.set()
        killer.join()
    return killed


@needs_python
def test_dask_worker_killed_mid_build_is_retried(
    slices, reference, dask_cluster, tmp_path: Path
) -> None:
    """The nanny restarts the killed worker, the scheduler reruns its tasks: the same graph."""
    _, client = dask_cluster
    killed = _build_while_killing(client, slices, tmp_path / "graph", tmp_path / "work")
    assert killed, "no worker was killed: the test did not exercise a failure"
    assert not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == "zombie"
    assert_same_graph(tmp_path / "graph", reference["python"])
    assert list((tmp_path / "work").iterdir()) == []
    client.wait_for_workers(2, timeout=WORKER_RESTART_S)


@needs_python
def test_dask_worker_killed_without_retries_fails_cleanly(
    slices, reference, dask_cluster, tmp_path: Path
) -> None:
    """allowed-failures 0: the build fails with a clear error; the previous graph stays."""
    cluster, client = dask_cluster
    out = tmp_path / "graph"
    build(out, slices["stories"][1:], STORIES, STORY_SEPARATOR, workers=1)
    before = read_meta(open_graph_env(out), out)
    client.wait_for_workers(2, timeout=WORKER_RESTART_S)
    cluster.scheduler.allowed_failures = 0
    try:
        with pytest.raises(BuildError, match="failed on the Dask cluster: KilledWorker"):
            _build_while_killing(client, slices, out, tmp_path / "work")
    finally:
        cluster.scheduler.allowed_failures = 3
    after = read_meta(open_graph_env(out), out)
    assert after.built_at == before.built_at and after.corpus_tokens == before.corpus_tokens
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph", "work"]  # no temp graph
    env = lmdb.open(str(out), readonly=True, lock=False, max_dbs=16)
    env.close()
    client.wait_for_workers(2, timeout=WORKER_RESTART_S)


@needs_python
def test_local_engine_worker_death_fails_cleanly(slices, tmp_path: Path) -> None:
    """A local worker process killed mid-build: BuildError, nothing published."""
    files = slices["python"]  # written now, before the killer watches the build
    engine = LocalEngine(workers=2)
    work = tmp_path / "work"
    killed: list[int] = []

    me = psutil.Process()
    others = {c.pid for c in me.children(recursive=True)}  # e.g. the Dask cluster's processes

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            if any(work.glob(".speculant-runs-*/part*")):
                for child in me.children():
                    if child.pid not in others and "spawn_main" in " ".join(child.cmdline()):
                        child.kill()
                        killed.append(child.pid)
                        return
            time.sleep(0.005)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        with pytest.raises(BuildError, match="worker process died"):
            build(
                tmp_path / "graph",
                files,
                str(GPT2_TOKENIZER),
                PY_SEPARATOR,
                engine=engine,
                partitions=10,
                work_dir=work,
            )
    finally:
        thread.join()
    assert killed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
