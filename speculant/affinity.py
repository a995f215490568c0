"""CPU pinning for small hosts: the model's forward passes on cores of their own.

On a host with few cores, the verifier's forward pass competes with the gateway's and the draft
service's gRPC threads for the same cores, and the scheduler moves them around; giving the model
its own core and the rest of the system the others makes each round faster (measured in the
docs/benchmarks.md). Linux only: elsewhere pinning is skipped.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CoreSplit:
    """model: the cores for forward passes; other: the cores for everything else."""

    model: frozenset[int]
    other: frozenset[int]


def split_cores(model_cores: int = 1) -> CoreSplit | None:
    """The first `model_cores` usable cores for the model (one per torch thread), the rest for
    the other processes; None when no core would be left over, or without sched_getaffinity."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    if model_cores < 1 or len(cores) <= model_cores:
        return None
    return CoreSplit(frozenset(cores[:model_cores]), frozenset(cores[model_cores:]))


def pin_process(pid: int, cores: frozenset[int]) -> bool:
    """Pin every thread of process pid (0 = this one) to cores; threads it starts later inherit
    it. False when pinning is not possible here."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    pid = pid or os.getpid()
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    pinned = False
    for thread in threads:
        with contextlib.suppress(OSError):  # a thread may have exited meanwhile
            os.sched_setaffinity(thread, cores)
            pinned = True
    return pinned


_CGROUP_V2_MAX = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1 = Path("/sys/fs/cgroup/cpu")


def _cgroup_cpu_limit() -> float | None:
    """The container's CPU quota in cores (``docker run --cpus``, a Kubernetes CPU limit), or
    None without one. cgroup v2 (cpu.max) or v1 (cpu.cfs_quota_us / cpu.cfs_period_us)."""
    with contextlib.suppress(OSError, ValueError):
        quota, period = _CGROUP_V2_MAX.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    with contextlib.suppress(OSError, ValueError):
        quota = int((_CGROUP_V1 / "cpu.cfs_quota_us").read_text())
        period = int((_CGROUP_V1 / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 or period <= 0 else quota / period
    return None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a cpuset), capped by the
    container's CPU quota (rounded up); os.cpu_count() counts the whole host instead."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, max(1, math.ceil(limit)))
    return max(1, cores)


@dataclass(frozen=True)
class ThreadChoice:
    """The verifier's torch intra-op threads and why (logged at start-up)."""

    threads: int
    reason: str


def default_torch_threads(device_type: str, torch_default: int) -> ThreadChoice:
    """The verifier's torch threads when --torch-threads is not given.

    On a CPU: one core is left to the rest of the stack (the gRPC threads, the draft service
    and the gateway), so threads = usable cores - 1, at least 1, and at most torch's own default
    (the physical cores). A second OpenMP thread that has to share its core spins and makes
    every forward slower, which is what the former default (torch's) did on small hosts. On a
    GPU the forward runs on the device: torch's default, capped by the usable cores.
    """
    cores = usable_cores()
    if device_type != "cpu":
        threads = max(1, min(torch_default, cores))
        return ThreadChoice(threads, f"{device_type} device, {cores} usable core(s)")
    threads = max(1, min(torch_default, cores - 1))
    return ThreadChoice(
        threads,
        f"{cores} usable core(s), one left for the gRPC threads and the other services",
    )
