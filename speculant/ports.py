"""Free TCP ports on this machine, for a server about to be started (tests, bench, `up`'s
helpers): a port the OS handed out a moment ago, which the caller binds right after."""

from __future__ import annotations

import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct ports that were free a moment ago (all held open while choosing, so they
    differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago."""
    return free_ports(1, host)[0]
