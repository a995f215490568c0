"""The machine a benchmark ran on, and the memory its processes peaked at."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import sys
from typing import Any


def load_average() -> list[float] | None:
    with contextlib.suppress(OSError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def self_peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports kB


def peak_rss_bytes(pid: int) -> int | None:
    """VmHWM (the peak resident set) of a process, where /proc has it."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def machine_info() -> dict[str, Any]:
    """Versions, CPU count and torch threads (the load average is added by the caller)."""
    import grpc
    import torch
    import transformers

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "grpcio": grpc.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
    }
