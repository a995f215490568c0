"""Running a build's partition tasks on an engine while showing their progress: a bar on a
terminal, elsewhere a log line every few seconds (:class:`~builder.heartbeat.Heartbeat`)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from builder.build_stats import BuildStats
from builder.engines import Engine
from builder.heartbeat import Heartbeat

log = logging.getLogger("builder")


def run_tasks(
    engine: Engine,
    specs: list[dict[str, Any]],
    stats: BuildStats,
    on_manifest: Callable[[dict[str, Any]], None],
    *,
    progress: bool,
    progress_seconds: float,
) -> list[dict[str, Any]]:
    """Run the tasks on the engine; each finished task's manifest goes to on_manifest and its
    figures into stats. progress: a progress bar; progress_seconds (> 0): a progress line that
    often. Their manifests, in spec order."""
    from tqdm import tqdm

    bar = tqdm(
        desc=f"tokenizing+sorting ({engine.name})",
        total=len(specs),
        unit="partition",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    begun = time.perf_counter()
    heartbeat = Heartbeat(
        log,
        progress_seconds,
        lambda: (
            f"tokenizing+sorting ({engine.name}): {bar.n}/{len(specs)} partitions, "
            f"{stats.tokens:,} tokens, {time.perf_counter() - begun:.0f} s"
        ),
    )

    def done(manifest: dict[str, Any]) -> None:
        on_manifest(manifest)
        stats.add_task(manifest)
        bar.update(1)
        rate = stats.tokens / max(time.perf_counter() - begun, 1e-9)
        bar.set_postfix_str(f"{stats.tokens:,} tokens, {rate:,.0f} tokens/s", refresh=False)

    try:
        with heartbeat:
            return engine.map(specs, done)
    finally:
        bar.close()
        stats.count_wall_seconds += time.perf_counter() - begun
