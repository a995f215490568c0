"""Where a verifier's forwards and sampling steps run: one at a time on the shared model, on a
dedicated *model thread* or under a lock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class ModelRunner:
    """Runs functions (forward + sampling) alone on the model.

    thread: run every one on one dedicated thread. Servers with more than one torch thread want
    this: torch's OpenMP pool is per calling thread, so forwards from many RPC worker threads
    would each start a pool of spinning threads and starve the CPU. With one torch thread (no
    pool) or one in-process caller, a lock does and saves a thread hand-off per call.
    """

    def __init__(self, thread: bool = False) -> None:
        self._lock = threading.Lock()  # one forward at a time on the shared model
        self._thread = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="model") if thread else None
        )

    def run(self, fn: Callable[[], T]) -> T:
        """fn's result, run alone on the model: on the model thread, or under the lock."""
        if self._thread is not None:
            return self._thread.submit(fn).result()
        with self._lock:
            return fn()

    def close(self) -> None:
        """Stop the model thread (if any), without waiting for it."""
        if self._thread is not None:
            self._thread.shutdown(wait=False)
