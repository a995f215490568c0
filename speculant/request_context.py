"""Request ids carried through gRPC metadata, and logs that name them (text or JSON lines); a
client request's deadline, carried by every backend call made for it (:func:`request_deadline`).

A *request id* names one client request across services: the gateway takes it from the
``x-request-id`` metadata of the incoming call (or makes one, a uuid4 in hex), returns it in the
call's initial metadata, and sends it with its calls to the draft and verifier services, which
do the same with it. While a call is served the id is in :data:`REQUEST_ID` (a context
variable), and every log record emitted meanwhile carries it as ``record.request_id``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID_CHARS = 128
LOG_FORMATS = ("text", "json")

# The id of the request being served on this thread (None outside a call).
REQUEST_ID: ContextVar[str | None] = ContextVar("request_id", default=None)


# The deadline (time.monotonic()) of the client request being served, if it has one: every
# backend call made for it carries the remaining time, so a request past its deadline stops
# its backends' work too. Set by the gateway's engine around each request (see `request_deadline`).
REQUEST_DEADLINE: ContextVar[float | None] = ContextVar("request_deadline", default=None)


@contextlib.contextmanager
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


def new_request_id() -> str:
    return uuid.uuid4().hex


def clean_request_id(value: str | bytes | None) -> str | None:
    """The id as given if it is 1..128 printable ASCII characters without spaces, else None."""
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not value or len(value) > MAX_REQUEST_ID_CHARS:
        return None
    if not all("!" <= c <= "~" for c in value):
        return None
    return value


def request_id_from_metadata(metadata: Any) -> str | None:
    """The clean x-request-id of call metadata (a sequence of (key, value) pairs), if any."""
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER:
            return clean_request_id(value)
    return None


def request_metadata() -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the current request id (empty outside a call)."""
    request_id = REQUEST_ID.get()
    return ((REQUEST_ID_HEADER, request_id),) if request_id else ()


@contextlib.contextmanager
def request_id_scope(request_id: str | None) -> Iterator[None]:
    """Within this block the current request id is `request_id` (unchanged when None)."""
    if request_id is None:
        yield
        return
    token = REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # a generator closed from another context
            REQUEST_ID.reset(token)


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (None outside a call) and ``request_tag`` (`` [id]`` or empty) to
    every record passing the handler it is attached to."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        record.request_tag = f" [{record.request_id}]" if record.request_id else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, request_id, and
    exception (the traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s%(request_tag)s: %(message)s"


def log_handler(log_format: str = "text", stream: Any = None) -> logging.Handler:
    """A stream handler (stderr by default) writing `log_format` ("text" or "json") records
    with their request ids."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    return handler


def configure_logging(level: int = logging.INFO, log_format: str = "text") -> None:
    """Log to stderr at `level` in `log_format` (no-op if the root logger has handlers)."""
    logging.basicConfig(level=level, handlers=[log_handler(log_format)])


def add_log_format_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text lines, or one JSON object per line (time, level, logger, message, request_id)",
    )
