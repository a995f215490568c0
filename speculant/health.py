"""Client side of grpc.health.v1: is a service up, and waiting until it is."""

from __future__ import annotations

import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def health_status(address: str, service: str = "", timeout_s: float = 1.0) -> str:
    """The service's health status name (SERVING, NOT_SERVING, ...) or UNREACHABLE."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return "UNREACHABLE"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def wait_until_serving(address: str, timeout_s: float = 60.0, poll_s: float = 0.05) -> bool:
    """Poll until the service at address reports SERVING; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if health_status(address) == "SERVING":
            return True
        time.sleep(poll_s)
    return False
