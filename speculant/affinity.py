"""CPU pinning for small hosts: the model's forward passes on cores of their own.

On a host with few cores, the verifier's forward pass competes with the gateway's and the draft
service's gRPC threads for the same cores, and the scheduler moves them around; giving the model
its own core and the rest of the system the others makes each round faster (measured in the
README's benchmark notes). Linux only: elsewhere pinning is skipped.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


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
