"""Writing the builder's files: a failed write names the file and the disk it is on.

numpy reports a short write as "188781 requested and 120816 written", and a write into a memory
map of a sparse file on a full disk raises SIGBUS. Run files are therefore written through
:func:`save_array`, and memory-mapped outputs get their blocks allocated first
(:func:`allocate`), so a full disk is an error naming the file, the space left and what to do.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np

from builder.errors import BuildError


def write_failure(path: Path, exc: Exception, hint: str = "") -> BuildError:
    """The BuildError for a write to path that failed with exc."""
    reason = getattr(exc, "strerror", None) or str(exc)
    short = re.fullmatch(r"(\d+) requested and (\d+) written", reason)
    if short:  # numpy's short write
        reason = f"only {short[2]} of {short[1]} bytes were written (disk full?)"
    try:
        free = f"{shutil.disk_usage(path.parent).free / 2**20:.0f} MiB free"
    except OSError:
        free = "free space unknown"
    return BuildError(
        f"cannot write {path}: {reason} ({free} on the disk holding {path.parent})"
        + (f"; {hint}" if hint else "")
    )


SCRATCH_HINT = "free space there or put the build's scratch files elsewhere with --work-dir DIR"


def save_array(path: Path, array: np.ndarray, hint: str = SCRATCH_HINT) -> None:
    """np.save(path, array) without pickle; a failed write is a BuildError naming the file."""
    try:
        np.save(path, array, allow_pickle=False)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise write_failure(path, exc, hint) from exc


def allocate(path: Path, hint: str = SCRATCH_HINT) -> None:
    """Give path's whole length disk blocks now (posix_fallocate), so that writing into a memory
    map of it cannot fail later with SIGBUS on a full disk; a BuildError naming it if not."""
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        finally:
            os.close(fd)
    except OSError as exc:
        raise write_failure(path, exc, hint) from exc


def open_array(path: Path, dtype: type, shape: tuple[int, ...], hint: str = SCRATCH_HINT):
    """A new .npy file of this dtype and shape, memory-mapped for writing, its blocks allocated
    (see allocate); a failed create is a BuildError naming the file."""
    from numpy.lib.format import open_memmap

    try:
        array = open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    except OSError as exc:
        raise write_failure(path, exc, hint) from exc
    allocate(path, hint)
    return array
