"""Child processes that must not outlive their parent: start, wait until ready, stop.

Used by ``speculant up`` and by the benchmarks that start services. A child gets SIGTERM when
its parent dies (Linux: PR_SET_PDEATHSIG), so no orphan keeps a port or a model in memory, and
counts as ready only when its health check answers SERVING *and* the answering socket is its own
(another stack already on the port must not pass for it).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from speculant.cli_errors import fail
from speculant.health import wait_until_serving

PR_SET_PDEATHSIG = 1


def port_is_free(host: str, port: int) -> bool:
    """Whether nothing listens on host:port (a bind with SO_REUSEADDR succeeds, as gRPC's
    does: a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def listens_on(pid: int, port: int) -> bool:
    """Whether process pid has a listening socket on port (True where it cannot be seen)."""
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="inet")
    except (psutil.AccessDenied, NotImplementedError):
        return True
    except psutil.NoSuchProcess:
        return False
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections
    )


def child_setup(cores: frozenset[int] | None) -> Callable[[], None]:
    """preexec_fn for a child process: it gets SIGTERM when its parent dies (Linux), and runs
    on `cores` when given (None: wherever the parent may)."""

    def setup() -> None:
        # Not on Linux: `up` still stops its children when it exits normally.
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if cores is not None and hasattr(os, "sched_setaffinity"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, cores)  # every thread it starts inherits it

    return setup


@dataclass
class Child:
    name: str
    address: str
    process: subprocess.Popen
    port: int = 0
    other_ports: tuple[int, ...] = ()


def stop_children(children: list[Child], grace_s: float = 10.0) -> None:
    """SIGTERM every child, then SIGKILL whoever is still running after grace_s."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def wait_ready(
    child: Child, timeout_s: float, stop: dict[str, bool], *, health: bool = True
) -> bool:
    """Wait until the child serves: its health SERVING on its address (unless health is
    False), from its own listening socket, and it listens on its other ports."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop["requested"]:
        if child.process.poll() is not None:
            fail(f"the {child.name} service failed to start (code {child.process.returncode})")
            return False
        serving = wait_until_serving(child.address, timeout_s=0.5) if health else True
        ports = (child.port, *child.other_ports)
        if serving and all(listens_on(child.process.pid, port) for port in ports):
            return True
        if not health:
            time.sleep(0.1)
    if not stop["requested"]:
        fail(f"the {child.name} service did not become ready in {timeout_s:.0f} s")
    return False
