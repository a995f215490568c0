"""The channel every gateway client opens to a backend: shared options, fast reconnects."""

from __future__ import annotations

import logging

import grpc

from speculant.grpc_server import CLIENT_KEEPALIVE_OPTIONS, GRPC_OPTIONS
from speculant.tls import ClientTls, open_channel

log = logging.getLogger(__name__)


# Reconnect quickly after a backend restarts (gRPC's default backoff starts at 1 s, up to 120 s).
RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


def backend_channel(address: str, tls: ClientTls | None) -> grpc.Channel:
    return open_channel(address, tls, GRPC_OPTIONS + RECONNECT_OPTIONS + CLIENT_KEEPALIVE_OPTIONS)
