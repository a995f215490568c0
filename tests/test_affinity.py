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
