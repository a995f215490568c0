"""speculant.ports: the one helper that picks free ports for servers about to start."""

from __future__ import annotations

import socket

from speculant.ports import free_port, free_ports


def test_free_ports_are_distinct_and_can_be_bound() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in [*ports, free_port()]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
