"""A progress line every few seconds for long work where no progress bar shows (stderr is not a
terminal: a log file, a container, CI)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

PROGRESS_SECONDS = 15.0  # a line this often by default (as distill)


class Heartbeat:
    """While open, logs ``line()`` at INFO every `every` seconds from a daemon thread (every 0:
    never). ``line`` runs on that thread: it must only read what the work updates."""

    def __init__(self, log: logging.Logger, every: float, line: Callable[[], str]) -> None:
        self._log = log
        self._every = every
        self._line = line
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self._every > 0:
            self._thread = threading.Thread(target=self._beat, name="progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._every):
            self._log.info("%s", self._line())
