"""The draft tier's replicas as the gateway sees them: addresses expanded from DNS, and each
replica's stream and hold-off after a failure."""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from gateway.backends.backend_channel import backend_channel
from gateway.backends.streams import StreamExchange, StreamPool
from speculant.errors import InvalidArgumentError, RemoteError, UnavailableError
from speculant.tls import ClientTls
from speculant.v1 import admin_pb2_grpc, draft_pb2_grpc

log = logging.getLogger(__name__)


def expand_addresses(addresses: Sequence[str]) -> list[str]:
    """Replica addresses: HOST:PORT entries as given; ``dns:NAME:PORT`` becomes one replica per
    address NAME resolves to now (GrpcDraftClient resolves again every refresh interval)."""
    out: list[str] = []
    for address in addresses:
        if not address.startswith("dns:"):
            out.append(address)
            continue
        name, _, port = address.removeprefix("dns:").rpartition(":")
        if not name or not port.isdigit():
            raise InvalidArgumentError("--draft", f"{address!r} is not dns:NAME:PORT")
        try:
            infos = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
        except OSError as exc:
            raise UnavailableError(f"--draft: cannot resolve {name}: {exc}") from exc
        for family, *_, sockaddr in infos:
            host = f"[{sockaddr[0]}]" if family == socket.AF_INET6 else sockaddr[0]
            if f"{host}:{port}" not in out:
                out.append(f"{host}:{port}")
    return out


# A draft replica that failed is asked last for this long (then it is back in the rotation).
REPLICA_HOLD_OFF_S = 1.0


@dataclass(eq=False)
class Replica:
    """One draft service: its stub, its open streams, and its hold-off after a failure."""

    address: str
    stub: draft_pb2_grpc.DraftServiceStub
    streams: StreamPool
    admin: admin_pb2_grpc.AdminServiceStub | None = None  # its catalog (AdminService)
    held_off_until: float = 0.0  # time.monotonic()

    @classmethod
    def connect(cls, address: str, tls: ClientTls | None) -> Replica:
        channel = backend_channel(address, tls)
        stub = draft_pb2_grpc.DraftServiceStub(channel)
        return cls(
            address,
            stub,
            StreamPool(lambda: StreamExchange(stub.ProposeStream, None)),
            admin_pb2_grpc.AdminServiceStub(channel),
        )


def stream_refused(exc: RemoteError, exchange: StreamExchange) -> bool:
    """Whether a stream failed because the service refused it (it serves its limit of streams,
    see speculant.grpc_server.CallLimit), not because of the request or the service."""
    return exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and exchange.responses == 0
