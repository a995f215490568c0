"""A watchdog for blocking stream reads: a read that outlives its deadline is cancelled."""

from __future__ import annotations

import logging
import threading
import time

from speculant.stream_exchange import StreamExchange

log = logging.getLogger(__name__)


class StreamWatchdog:
    """Cancels stream exchanges that run past their deadline (streams have no per-message
    timeout). One thread, waking every `tick_s` only while calls are in flight."""

    def __init__(self, tick_s: float = 0.01, name: str = "draft-watchdog") -> None:
        self._tick_s = tick_s
        self._in_flight: dict[int, tuple[float, StreamExchange]] = {}
        self._lock = threading.Condition()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def watch(self, exchange: StreamExchange, timeout_s: float) -> int:
        with self._lock:
            ticket = id(exchange)
            self._in_flight[ticket] = (time.monotonic() + timeout_s, exchange)
            self._lock.notify()
            return ticket

    def done(self, ticket: int) -> bool:
        """The exchange is answered (or failed); False when the watchdog had cancelled it."""
        with self._lock:
            return self._in_flight.pop(ticket, None) is not None

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._in_flight:
                    self._lock.wait()
                now = time.monotonic()
                late = [t for t, (deadline, _) in self._in_flight.items() if deadline < now]
                for ticket in late:
                    self._in_flight.pop(ticket)[1].cancel()
            time.sleep(self._tick_s)
