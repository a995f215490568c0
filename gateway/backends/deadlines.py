"""A client request's deadline, carried by every backend call made for it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

log = logging.getLogger(__name__)


# The deadline (time.monotonic()) of the client request being served, if it has one: every
# backend call made for it carries the remaining time, so a request past its deadline stops
# its backends' work too. Set by the gateway around each request (see `request_deadline`).
REQUEST_DEADLINE: ContextVar[float | None] = ContextVar("request_deadline", default=None)


@contextmanager
def request_deadline(remaining_s: float | None) -> Iterator[None]:
    """Within this block, backend calls carry at most `remaining_s` (None: no deadline)."""
    token = REQUEST_DEADLINE.set(
        None if remaining_s is None else time.monotonic() + max(0.0, remaining_s)
    )
    try:
        yield
    finally:
        REQUEST_DEADLINE.reset(token)


def remaining_time(default_s: float | None) -> float | None:
    """The smaller of default_s and the time left before the request's deadline."""
    deadline = REQUEST_DEADLINE.get()
    if deadline is None:
        return default_s
    left = max(0.001, deadline - time.monotonic())
    return left if default_s is None else min(default_s, left)
