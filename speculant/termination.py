"""SIGINT and SIGTERM of a serving process: caught before it serves, so none is lost.

A serve command catches them as its first step (``catch()``, on the main thread). Until the
process has started serving (a service reports SERVING, or the command waits for the signal),
a signal acts as it would without a handler, so a slow start (a model loading) can still be
interrupted: SIGINT raises KeyboardInterrupt, SIGTERM exits 143 (128 + 15, what a kill by it
reads as in a shell), both unwinding the start. From then on a signal only sets `requested`:
the command stops its servers gracefully (speculant.grpc_server.ServiceServer.
wait_for_termination_signal). Catching them late instead would leave a moment, after SERVING,
in which a SIGTERM (a rollout, a test) killed the process with calls in flight.

Signals are per process, so this is one module-level state; processes that never call catch()
(tests serving in-process) keep their own handlers.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Termination:
    def __init__(self) -> None:
        self.requested = threading.Event()  # a signal came once serving
        self.serving = threading.Event()  # the process has started serving

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if not self.serving.is_set():
            log.info("received %s while starting: stopping now", name)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        log.info("received %s, shutting down", name)
        self.requested.set()


_caught: _Termination | None = None


def catch() -> None:
    """Catch SIGINT and SIGTERM from now on (once per process; on the main thread)."""
    global _caught
    if _caught is None:
        _caught = _Termination()
        for signum in _SIGNALS:
            signal.signal(signum, _caught.on_signal)


def started_serving() -> None:
    """The process serves now: a signal from here on asks for a graceful stop (a no-op where
    catch() was not called)."""
    if _caught is not None:
        _caught.serving.set()


def wait_for_signal() -> None:
    """Block until SIGINT or SIGTERM (catching them now if catch() was not called)."""
    catch()
    assert _caught is not None
    _caught.serving.set()
    while not _caught.requested.wait(0.5):
        pass


# -- Batch commands (distill): an interrupt that is never lost -------------------------------

_interrupt_requested = threading.Event()


def _on_interrupt(_signum: int, _frame: FrameType | None) -> None:
    _interrupt_requested.set()
    raise KeyboardInterrupt


def catch_interrupt() -> None:
    """SIGINT raises KeyboardInterrupt, as Python's default handler does, and is also
    remembered: a long loop that calls check_interrupt() stops even when the KeyboardInterrupt
    was raised where Python drops it (in a finalizer or a garbage-collection callback, where
    it is only printed as "Exception ignored"). On the main thread."""
    signal.signal(signal.SIGINT, _on_interrupt)


def check_interrupt() -> None:
    """Raise KeyboardInterrupt if SIGINT came since catch_interrupt()."""
    if _interrupt_requested.is_set():
        raise KeyboardInterrupt
