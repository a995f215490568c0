"""CPU pinning (speculant.affinity): the model's cores and the others, applied to every thread."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from speculant.affinity import pin_process, split_cores


def test_split_cores_leaves_at_least_one_core_to_the_others():
    cores = len(os.sched_getaffinity(0))
    for model_cores in range(1, cores + 2):
        split = split_cores(model_cores)
        if model_cores >= cores:
            assert split is None
        else:
            assert split is not None
            assert len(split.model) == model_cores and split.model.isdisjoint(split.other)
            assert split.model | split.other == frozenset(os.sched_getaffinity(0))
    assert split_cores(0) is None


@pytest.mark.skipif(split_cores(1) is None, reason="needs 2 CPU cores")
def test_pin_process_pins_every_thread_and_later_threads_inherit():
    split = split_cores(1)
    assert split is not None
    code = (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "time.sleep(1.0)\n"  # pinned here
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "time.sleep(30)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.5)
        assert pin_process(child.pid, split.other)
        time.sleep(1.0)
        threads = psutil.Process(child.pid).threads()
        assert len(threads) == 3
        assert all(set(psutil.Process(t.id).cpu_affinity()) == split.other for t in threads)
    finally:
        child.kill()
        child.wait()


# -- the default threads for the host ------------------------------------------------------


@pytest.fixture
def host(monkeypatch, tmp_path):
    """A fake host: set(cores=N, quota=Q cores or None, v1=True for cgroup v1 files)."""
    import speculant.affinity as affinity

    def set_host(cores: int, quota: float | None = None, v1: bool = False) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
        v2_file, v1_dir = tmp_path / "cpu.max", tmp_path / "cpu"
        monkeypatch.setattr(affinity, "_CGROUP_V2_MAX", v2_file)
        monkeypatch.setattr(affinity, "_CGROUP_V1", v1_dir)
        v2_file.unlink(missing_ok=True)
        if quota is not None and not v1:
            v2_file.write_text(f"{int(quota * 100000)} 100000\n")
        elif v1:
            v1_dir.mkdir(exist_ok=True)
            quota_us = -1 if quota is None else int(quota * 100000)
            (v1_dir / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")
            (v1_dir / "cpu.cfs_period_us").write_text("100000\n")

    return set_host


def test_usable_cores_count_affinity_and_the_container_quota(host):
    from speculant.affinity import usable_cores

    host(16)
    assert usable_cores() == 16
    host(16, quota=2.0)  # docker run --cpus 2 on a 16-core host
    assert usable_cores() == 2
    host(16, quota=1.5, v1=True)
    assert usable_cores() == 2  # rounded up
    host(4, quota=8.0)
    assert usable_cores() == 4
    host(16, quota=None, v1=True)  # v1 without a quota: -1
    assert usable_cores() == 16


def test_default_threads_leave_a_core_on_a_cpu(host):
    from speculant.affinity import default_torch_threads

    host(2)
    assert default_torch_threads("cpu", 2).threads == 1
    assert "2 usable core(s)" in default_torch_threads("cpu", 2).reason
    host(1)
    assert default_torch_threads("cpu", 1).threads == 1
    host(16)
    assert default_torch_threads("cpu", 8).threads == 8  # torch's default: physical cores
    host(16, quota=4.0)
    assert default_torch_threads("cpu", 8).threads == 3
    assert default_torch_threads("cuda", 8).threads == 4  # a GPU: torch's, capped by the quota
