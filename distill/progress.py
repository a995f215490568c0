"""The progress of a distillation as it generates: generations and tokens done, their rates
and an ETA, shown as a tqdm bar or as log lines (logger ``distill``)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

log = logging.getLogger("distill")


class Progress:
    """The progress of a distillation: generations and tokens done, their rates and an ETA;
    shown as a tqdm bar (mode "bar"), or logged (mode "log": a line when `every` seconds have
    passed since the last one, checked at each decoding step, and one at the end), or not
    ("off": the end line only)."""

    def __init__(
        self, *, total: int, batch_size: int, max_tokens: int, mode: str, every: float, label: str
    ) -> None:
        from tqdm import tqdm

        self.total, self.batch_size, self.max_tokens = total, batch_size, max_tokens
        self.last_rows = 0  # rows of the last batch (batches shrink for long prompts)
        self.mode, self.every = mode, every
        self.begun = self.last_line = time.perf_counter()
        self.done = self.tokens = self.batches_done = 0
        self.bar = tqdm(
            total=total,
            desc=label,
            unit="gen",
            file=sys.stderr,
            disable=mode != "bar",
            dynamic_ncols=True,
        )

    def batch_done(self, generations: int, tokens: int) -> None:
        self.done += generations
        self.tokens += tokens
        self.batches_done += 1
        self.last_rows = generations
        elapsed = max(time.perf_counter() - self.begun, 1e-9)
        self.bar.update(generations)
        self.bar.set_postfix_str(
            f"{self.done / elapsed:,.1f} gen/s, {self.tokens / elapsed:,.0f} tokens/s",
            refresh=False,
        )
        if self.mode == "log" and self.done < self.total and self._due():
            log.info("%s", self.line())

    def step(self, step: int, batch_tokens: Callable[[], int]) -> None:
        """A decoding step of the batch in progress: `step` tokens generated per row so far;
        batch_tokens() counts those kept (up to each row's EOS)."""
        if self._due():
            log.info("%s", self.line(step, batch_tokens()))

    def _due(self) -> bool:
        now = time.perf_counter()
        if now - self.last_line < self.every:
            return False
        self.last_line = now
        return True

    def line(self, step: int = 0, batch_tokens: int = 0) -> str:
        """generations done / total, rates, elapsed time and ETA (with the batch in progress
        at its step-th token)."""
        elapsed = max(time.perf_counter() - self.begun, 1e-9)
        rows = min(self.total - self.done, self.last_rows or self.batch_size)  # in progress
        equivalent = self.done + rows * min(step / self.max_tokens, 1.0)
        rate = equivalent / elapsed
        eta = (self.total - equivalent) / rate if rate > 0 else None
        text = (
            f"progress: {self.done:,}/{self.total:,} generations "
            f"({100 * self.done / max(self.total, 1):.0f}%), {self.done / elapsed:,.1f} gen/s, "
            f"{(self.tokens + batch_tokens) / elapsed:,.0f} tokens/s, {duration(elapsed)} "
            f"elapsed, ETA {duration(eta) if eta is not None else '?'}"
        )
        if step:
            text += f" (batch {self.batches_done + 1} at token {step}/{self.max_tokens})"
        return text

    def close(self) -> None:
        self.bar.close()
        elapsed = max(time.perf_counter() - self.begun, 1e-9)
        log.info(
            "generated %s/%s continuations (%s tokens) in %.1f s: %.1f gen/s, %s tokens/s",
            f"{self.done:,}",
            f"{self.total:,}",
            f"{self.tokens:,}",
            elapsed,
            self.done / elapsed,
            f"{self.tokens / elapsed:,.0f}",
        )


def duration(seconds: float) -> str:
    """A duration for a log line: "42 s", "3m05s", "2h07m"."""
    seconds = max(round(seconds), 0)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
