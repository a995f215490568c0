"""Distributed builds on Dask (a local cluster): every input kind and partitioning must give
the graph of the one-process build (tests.build_corpora), LMDB entry by LMDB entry; a Dask worker
killed mid-build is retried (or, with no retries allowed, the build fails and publishes nothing).
Partition planning is tested in test_build_partitions.py, the local engine in
test_local_engine_build.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

import lmdb
import psutil
import pytest

from builder import BuildError, GraphBuilder
from builder.corpus import iter_documents
from builder.engines import DaskEngine
from speculant.graph_format import open_graph_env, read_meta
from tests.assets import GPT2_TOKENIZER, STORY_SEPARATOR
from tests.build_corpora import PY_SEPARATOR, STORIES, build, needs_python
from tests.graph_checks import assert_same_graph

distributed = pytest.importorskip("distributed")


def _local_cluster():
    """A Dask LocalCluster: 2 worker processes, one thread each (with nannies: restartable)."""
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        silence_logs=logging.ERROR,
    )
    client = distributed.Client(cluster)
    return cluster, client


@pytest.fixture(scope="module")
def dask_cluster():
    """A cluster shared by the tests that kill no worker."""
    cluster, client = _local_cluster()
    yield cluster, client
    client.close()
    cluster.close()


@pytest.fixture
def fresh_dask_cluster():
    """A cluster of the test's own, for a test that kills one of its workers: no later test waits
    for a nanny to bring the worker back (on a loaded 2-core box that took over 180 s once)."""
    cluster, client = _local_cluster()
    yield cluster, client
    client.close()
    cluster.close()


@pytest.mark.parametrize(
    "name", ["stories", pytest.param("python", marks=[needs_python, pytest.mark.slow])]
)
def test_dask_equals_local(
    corpus_slices, reference_graphs, dask_cluster, tmp_path: Path, name: str
) -> None:
    _, client = dask_cluster
    tok, sep = (
        (STORIES, STORY_SEPARATOR) if name == "stories" else (str(GPT2_TOKENIZER), PY_SEPARATOR)
    )
    meta = build(
        tmp_path / "graph",
        corpus_slices[name],
        tok,
        sep,
        engine=DaskEngine(client=client),
        partitions=6,
        work_dir=tmp_path / "work",
    )
    assert_same_graph(tmp_path / "graph", reference_graphs[name])
    assert meta.build_params["engine"] == "dask"
    assert meta.build_params["partitioning"]["partitions"] >= 6
    assert 1 <= meta.build_params["workers"] <= 2


def test_dask_jsonl_and_parquet_globs(
    corpus_slices, reference_graphs, dask_cluster, tmp_path: Path
) -> None:
    """The same stories as JSON lines and Parquet (small row groups), by glob: the same graph."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    _, client = dask_cluster
    docs = list(iter_documents(corpus_slices["stories"], doc_separator=STORY_SEPARATOR))
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
    assert_same_graph(tmp_path / "graph", reference_graphs["stories"])


def test_dask_hf_dataset_streaming(
    corpus_slices, reference_graphs, dask_cluster, tmp_path: Path
) -> None:
    """The same stories as a Hugging Face dataset (3 JSON-lines shards, streamed by the Dask
    workers, one task per shard): the same graph."""
    pytest.importorskip("datasets")
    _, client = dask_cluster
    docs = list(iter_documents(corpus_slices["stories"], doc_separator=STORY_SEPARATOR))
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
    assert_same_graph(tmp_path / "graph", reference_graphs["stories"])
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


def _build_while_killing(client, corpus_slices, out: Path, work: Path) -> list[int]:
    files = corpus_slices["python"]  # written now, before the killer watches the build
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
    corpus_slices, reference_graphs, fresh_dask_cluster, tmp_path: Path
) -> None:
    """The scheduler reruns the killed worker's tasks on the other worker: the same graph."""
    _, client = fresh_dask_cluster
    killed = _build_while_killing(client, corpus_slices, tmp_path / "graph", tmp_path / "work")
    assert killed, "no worker was killed: the test did not exercise a failure"
    assert not psutil.pid_exists(killed[0]) or psutil.Process(killed[0]).status() == "zombie"
    assert_same_graph(tmp_path / "graph", reference_graphs["python"])
    assert list((tmp_path / "work").iterdir()) == []


@needs_python
def test_dask_worker_killed_without_retries_fails_cleanly(
    corpus_slices, reference_graphs, fresh_dask_cluster, tmp_path: Path
) -> None:
    """allowed-failures 0: the build fails with a clear error; the previous graph stays."""
    cluster, client = fresh_dask_cluster
    out = tmp_path / "graph"
    build(out, corpus_slices["stories"][1:], STORIES, STORY_SEPARATOR, workers=1)
    before = read_meta(open_graph_env(out), out)
    cluster.scheduler.allowed_failures = 0
    with pytest.raises(BuildError, match="failed on the Dask cluster: KilledWorker"):
        _build_while_killing(client, corpus_slices, out, tmp_path / "work")
    after = read_meta(open_graph_env(out), out)
    assert after.built_at == before.built_at and after.corpus_tokens == before.corpus_tokens
    assert sorted(p.name for p in tmp_path.iterdir()) == ["graph", "work"]  # no temp graph
    env = lmdb.open(str(out), readonly=True, lock=False, max_dbs=16)
    env.close()
