"""Reporting finished generations to the draft tier, off the request's path (online learning).

The coordinator hands each finished generation's tokens (prompt and output) to a
:class:`LearnReporter`, which queues them and returns at once; one background thread sends each
to every draft replica (``GrpcDraftClient.learn``: all replicas learn it, one persists it). A
full queue drops the newest report, a failed call is logged at DEBUG and counted: learning is an
optimisation, so a report never fails, delays or slows a request.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.backends.draft_client import GrpcDraftClient

log = logging.getLogger(__name__)

DEFAULT_QUEUE = 1024  # reports waiting to be sent; more are dropped


@dataclass
class ReporterCounts:
    """Reports queued, sent (taken by at least one replica), failed (by every replica), and
    dropped because the queue was full."""

    queued: int = 0
    sent: int = 0
    failed: int = 0
    dropped: int = 0


class LearnReporter:
    """Sends finished generations to the draft tier in the background (see the module)."""

    def __init__(self, drafter: GrpcDraftClient, *, queue_size: int = DEFAULT_QUEUE) -> None:
        self.drafter = drafter
        self.counts = ReporterCounts()
        self._queue: queue.Queue[tuple[str, list[int]] | None] = queue.Queue(queue_size)
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="learn-reporter", daemon=True)
        self._thread.start()

    def learn(self, token_ids: Sequence[int]) -> None:
        """Queue one finished generation's tokens (returns at once)."""
        with self._idle:
            try:
                self._queue.put_nowait((uuid.uuid4().hex, list(token_ids)))
            except queue.Full:
                self.counts.dropped += 1
                return
            self._pending += 1
            self.counts.queued += 1

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued report was sent (tests, graceful shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (for up to timeout_s), then stop the thread."""
        self.wait_idle(timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            generation_id, token_ids = item
            try:
                delivery = self.drafter.learn(token_ids, generation_id)
                if delivery.delivered:
                    self.counts.sent += 1
                else:
                    self.counts.failed += 1
                    log.debug("no draft replica took learn report %s", generation_id)
            except Exception as exc:  # never let the thread die
                self.counts.failed += 1
                log.warning("learn report %s not sent: %s", generation_id, exc)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
