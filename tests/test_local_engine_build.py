"""Builds with the local engine (worker processes, the CLI's default): the graph of the
one-process build (tests.build_corpora), the CLI's engine errors, and a worker killed mid-build
(BuildError, nothing published)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import psutil
import pytest

from builder import BuildError
from builder.engines import LocalEngine
from launcher.cli import main
from speculant.graph_format import open_graph_env, read_meta
from tests.assets import GPT2_TOKENIZER, TINYSTORIES_CORPUS
from tests.build_corpora import PY_SEPARATOR, STORIES, build, needs_python
from tests.graph_checks import assert_same_graph


def test_local_worker_processes_equal_one_process(
    corpus_slices, reference_graphs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI's default engine with 2 worker processes and 5 partitions: the same graph."""
    out = tmp_path / "graph"
    args = ["build", "--corpus", *map(str, corpus_slices["stories"]), "--tokenizer", STORIES]
    args += ["--doc-separator", r"\n\n\n", "--max-order", "4", "--out", str(out)]
    args += ["--workers", "2", "--partitions", "5", "--work-dir", str(tmp_path / "work")]
    assert main(args) == 0
    assert "local engine, 5 partition(s)" in capsys.readouterr().err
    assert_same_graph(out, reference_graphs["stories"])
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


@needs_python
def test_local_engine_worker_death_fails_cleanly(corpus_slices, tmp_path: Path) -> None:
    """A local worker process killed mid-build: BuildError, nothing published."""
    files = corpus_slices["python"]  # written now, before the killer watches the build
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
