"""Surviving a graph file that shrinks or changes under its memory map.

A graph's ``data.mdb`` is mapped read-only (LMDB). When the file is truncated while mapped (an
operator's ``truncate``, a copy written in place over it), the next read of a page past its new
end raises SIGBUS, which kills a Python process without a word; a file rewritten in place
changes under the readers. Terms: a *mapped file* is such a file, with the size and modification
time it was verified at (against its manifest) and the address ranges of its maps in this
process; it is *damaged* once it no longer has that size or time. Two defences:

1. :meth:`MappedFile.damage` compares the file's size and modification time (``fstat`` of a
   descriptor held on the mapped inode, about a microsecond) with the verified ones. The draft
   service checks before and after every call it answers from a graph, and never reads a
   damaged one again (the call answers UNAVAILABLE).
2. For the reads already in progress when the file shrinks, a SIGBUS handler: a fault inside a
   mapped file's map gets an anonymous zero page mapped over the faulting page (the read then
   completes, reading zeros) and marks the file damaged, so the check after the call refuses
   its answer. A SIGBUS anywhere else gets the handler that was there before (the default: the
   process dies, as it would have). Linux on x86-64 and arm64 only (elsewhere, defence 1 alone).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import platform
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_PROT_READ = 1
_MAP_PRIVATE = 0x02
_MAP_FIXED = 0x10
_MAP_ANONYMOUS = 0x20
_SA_SIGINFO = 4
_SI_ADDR_OFFSET = 16  # siginfo_t.si_addr on 64-bit Linux (after three ints and padding)
_PAGE = mmap.PAGESIZE


class MappedFile:
    """A file this process maps read-only, checked for damage (see the module docstring)."""

    def __init__(self, path: Path, size: int, fd: int) -> None:
        """path: the file; size: its verified size; fd: a descriptor on the mapped inode
        (this object closes it)."""
        self.path = path
        self.size = size
        self._fd = fd
        stat = os.fstat(fd)
        self.mtime_ns = stat.st_mtime_ns
        self.file_id = (stat.st_dev, stat.st_ino)
        self.regions: list[tuple[int, int]] = []  # [start, end) of each map of the file
        self.fault_reason: str | None = None  # set by the SIGBUS handler

    def find_regions(self) -> None:
        """Find the file's maps in /proc/self/maps (after LMDB mapped it) and guard them."""
        self.regions = map_regions(self.file_id)
        _register(self)

    def damage(self) -> str | None:
        """Why the file is damaged (shrunk, modified, a read past its end), or None."""
        if self.fault_reason is not None:
            return self.fault_reason
        try:
            stat = os.fstat(self._fd)
        except OSError as exc:
            return f"cannot stat {self.path}: {exc}"
        if stat.st_size < self.size:
            return f"{self.path} shrank from {self.size} to {stat.st_size} bytes while mapped"
        if stat.st_size != self.size or stat.st_mtime_ns != self.mtime_ns:
            return f"{self.path} was modified in place while mapped"
        return None

    def close(self) -> None:
        """Stop guarding (call once the file is unmapped) and close the descriptor."""
        _unregister(self)
        with contextlib.suppress(OSError):
            os.close(self._fd)


def map_regions(file_id: tuple[int, int]) -> list[tuple[int, int]]:
    """[start, end) of this process's maps of the file with this (device, inode) (Linux)."""
    device, inode = file_id
    wanted_dev = f"{os.major(device):02x}:{os.minor(device):02x}"
    regions = []
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) >= 5 and fields[4] == str(inode) and fields[3] == wanted_dev:
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    regions.append((start, end))
    except OSError:
        pass
    return regions


def libc_function(name: str, argtypes: list) -> Callable[..., int] | None:
    """libc's function `name` (returning an int), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = argtypes
    function.restype = ctypes.c_int
    return function


_MINCORE = libc_function("mincore", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p])
_LOW_BIT = bytes(b & 1 for b in range(256))  # mincore's residency bit of each page's byte


def resident_bytes(regions: list[tuple[int, int]]) -> int:
    """Bytes of these maps' file pages in the host's page cache now (``mincore``; 0 off
    Linux): for a file map, whether or not this process has touched the pages, so one count,
    shared by every process that maps the file."""
    if _MINCORE is None:
        return 0
    resident = 0
    for start, end in regions:
        pages = (end - start + _PAGE - 1) // _PAGE
        vector = (ctypes.c_ubyte * pages)()
        if _MINCORE(ctypes.c_void_p(start), ctypes.c_size_t(end - start), vector) == 0:
            resident += sum(bytes(vector).translate(_LOW_BIT)) * _PAGE
    return resident


# The guarded maps: (start, end, file). Replaced whole (never mutated), so the signal handler
# reads a consistent tuple without a lock.
_guarded: tuple[tuple[int, int, MappedFile], ...] = ()
_guard_lock = threading.Lock()


def _register(mapped: MappedFile) -> None:
    global _guarded
    _install_handler()
    with _guard_lock:
        _guarded = _guarded + tuple((s, e, mapped) for s, e in mapped.regions)


def _unregister(mapped: MappedFile) -> None:
    global _guarded
    with _guard_lock:
        _guarded = tuple(entry for entry in _guarded if entry[2] is not mapped)


class _SigAction(ctypes.Structure):
    """glibc's struct sigaction (the same layout on x86-64 and arm64)."""

    _fields_ = [
        ("sa_sigaction", ctypes.c_void_p),
        ("sa_mask", ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong)))),
        ("sa_flags", ctypes.c_int),
        ("sa_restorer", ctypes.c_void_p),
    ]


_HANDLER_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_handler: object = None  # the installed callback (kept alive), None before, False if unsupported
_previous = _SigAction()
_libc: ctypes.CDLL | None = None


def _on_sigbus(signum: int, info: int, _context: int) -> None:
    """SIGBUS: a read past the end of a guarded file gets a zero page; others the old handler."""
    address = ctypes.c_void_p.from_address(info + _SI_ADDR_OFFSET).value or 0
    for start, end, mapped in _guarded:
        if start <= address < end:
            page = address - address % _PAGE
            result = _libc.mmap(  # type: ignore[union-attr]
                ctypes.c_void_p(page),
                ctypes.c_size_t(_PAGE),
                _PROT_READ,
                _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_FIXED,
                -1,
                0,
            )
            if result == page:
                mapped.fault_reason = (
                    f"a read past the end of {mapped.path} (truncated while mapped)"
                )
                return  # the read is retried, and reads zeros
            break
    # Not ours (or no page could be mapped): the previous handler takes the retried fault.
    _libc.sigaction(signal.SIGBUS, ctypes.byref(_previous), None)  # type: ignore[union-attr]


def _install_handler() -> None:
    """Install the SIGBUS handler once (where supported)."""
    global _handler, _libc
    if _handler is not None:
        return
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        _handler = False
        return
    try:
        libc = ctypes.PyDLL(None, use_errno=True)  # PyDLL: calls keep the GIL
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_int,
            ctypes.c_long,
        ]
        libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        _libc = libc
        callback = _HANDLER_TYPE(_on_sigbus)
        action = _SigAction()
        action.sa_sigaction = ctypes.cast(callback, ctypes.c_void_p).value
        action.sa_flags = _SA_SIGINFO
        if libc.sigaction(signal.SIGBUS, ctypes.byref(action), ctypes.byref(_previous)) != 0:
            raise OSError(ctypes.get_errno(), "sigaction(SIGBUS) failed")
        _handler = callback
    except (OSError, AttributeError) as exc:
        log.warning("no SIGBUS guard for mapped graphs: %s", exc)
        _handler = False
