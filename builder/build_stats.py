"""The figures a graph build reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class BuildStats:
    """Figures of a build: counts and the time spent in each phase (seconds).

    read, tokenize and count seconds are summed over the tasks (worker time, which exceeds the
    wall time when tasks run in parallel); ``count_wall_seconds`` is the wall time of step 2.
    """

    documents: int = 0
    tokens: int = 0
    read_seconds: float = 0.0  # reading and decoding corpus files
    tokenize_seconds: float = 0.0
    count_seconds: float = 0.0  # counting chunks and spilling runs
    count_wall_seconds: float = 0.0  # wall time of the counting step (all tasks)
    write_seconds: float = 0.0  # merging runs and writing LMDB
    graph_bytes: int = 0
    partitions: int = 0

    def add_task(self, manifest: dict[str, Any]) -> None:
        """Add one finished task's figures (its manifest, builder.index_task) as a partition."""
        self.documents += manifest["documents"]
        self.tokens += manifest["tokens"]
        self.read_seconds += manifest["seconds"]["read"]
        self.tokenize_seconds += manifest["seconds"]["tokenize"]
        self.count_seconds += manifest["seconds"]["count"]
        self.partitions += 1
