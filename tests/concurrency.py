"""Concurrency helpers of the batching tests: hold a verify batcher's first batch until the
other calls are queued (so the next batch serves them together), and run a function on several
threads at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from verifier_service.batching import VerifyBatcher

HOLD_LIMIT_S = 60.0  # never wait longer than this for the other calls (a bound, not a check)


def hold_first_batch(batcher: VerifyBatcher, others: int) -> None:
    """Make the batcher's first batch wait at the model until `others` more calls are queued
    (at most HOLD_LIMIT_S), so that the second batch serves those calls together."""
    run_alone = batcher.on_model
    first = threading.Event()

    def held(fn: Callable[[], None]) -> None:
        if not first.is_set():
            first.set()
            deadline = time.monotonic() + HOLD_LIMIT_S
            while batcher.queued < others and time.monotonic() < deadline:
                time.sleep(0.001)
        run_alone(fn)

    batcher.on_model = held


def run_threads(target: Callable[[int], None], count: int) -> None:
    """target(0..count-1) on one thread each; re-raise the first failure."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
