"""What the scenarios of scripts/measure_reliability.py share: the request they send, health
latencies, the code a call ends with, and the draft and verifier services run in process.

Imported by scripts/measure_reliability.py, which puts the repository root on sys.path first.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc

from speculant.config import VerifierConfig
from speculant.health import health_status

CONTEXT = [1, 403, 407, 261, 378, 432]
PROMPT = "Once upon a time"


def health_ms(address: str, checks: int = 10) -> float:
    """The slowest of `checks` health checks (1 s deadline; inf when one is unanswered), ms."""
    worst = 0.0
    for _ in range(checks):
        started = time.perf_counter()
        if health_status(address, timeout_s=1.0) == "UNREACHABLE":
            return float("inf")
        worst = max(worst, (time.perf_counter() - started) * 1e3)
        time.sleep(0.05)
    return worst


def rpc_code(call: Callable[[], Any]) -> str:
    """The gRPC status code name that call() ends with ("OK" when it returns)."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code().name
    return "OK"


@contextmanager
def draft_and_verifier(graph: str, model: str) -> Iterator[tuple[Any, Any]]:
    """A draft service of graph and a verifier service of model (CPU), in this process on free
    ports: (draft server, verifier server); stopped on leaving."""
    from draft_service.server import start_server as start_draft
    from verifier_service.server import start_server as start_verifier

    draft = start_draft(graph, port=0)
    verifier_server, verifier = start_verifier(VerifierConfig(model_name=model, device="cpu"))
    try:
        yield draft, verifier_server
    finally:
        verifier_server.stop(0)
        verifier.close()
        draft.stop(0)
