"""A draft service's online learning: its live layer and learn log, kept across graph reloads.

The gateway reports every finished generation (``DraftService/Learn``); this module keeps what the
service learned (:mod:`draft_service.live_layer`) and persists the generations it is asked to
persist (:mod:`draft_service.learn_log`), which a service replays when it starts. Learning never
fails a request: a log that cannot be written is logged (once) and learning goes on in memory.

The live layer belongs to the tokenizer and max order of the graph it was learned under: a graph
reloaded with the same tokenizer keeps it (its documents are counted again if the max order
changed); one with another tokenizer starts an empty layer (and does not write the old log).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from draft_service.learn_log import LearnLog, LearnLogError
from draft_service.live_layer import DEFAULT_MAX_BYTES, DEFAULT_WEIGHT, LiveLayer
from speculant.errors import InvalidArgumentError
from speculant.graph_reader import NGramGraph
from speculant.types import LiveStats

log = logging.getLogger(__name__)

MAX_LEARN_TOKENS = 65_536  # tokens of one learned generation (LearnRequest.token_ids)
MAX_GENERATION_ID = 128
LOG_SUFFIX = ".learned.jsonl"  # the default learn log: GRAPH_DIR + this, beside the graph


@dataclass(frozen=True)
class LearningConfig:
    """How a draft service learns. log_path: "" = GRAPH_DIR.learned.jsonl beside the graph,
    None = no log (learning in memory only, lost at a restart)."""

    enabled: bool = True
    max_bytes: int = DEFAULT_MAX_BYTES
    weight: float = DEFAULT_WEIGHT
    log_path: str | None = ""


def default_log_path(graph_path: str | Path) -> Path:
    path = Path(graph_path).expanduser().absolute()
    return path.with_name(path.name + LOG_SUFFIX)


@dataclass(frozen=True)
class LearnOutcome:
    learned_tokens: int
    persisted: bool
    stats: LiveStats


class Learning:
    """The live layer and learn log of one draft service (see the module docstring)."""

    def __init__(self, config: LearningConfig | None = None) -> None:
        self.config = config or LearningConfig()
        self._lock = threading.Lock()
        self.layer: LiveLayer | None = None
        self._fingerprint: str | None = None
        self._log: LearnLog | None = None
        self._log_failed = False

    def attach(self, graph: NGramGraph) -> LiveLayer:
        """The live layer for a graph being installed (see the module docstring); the first
        graph's attach replays the learn log."""
        meta = graph.meta
        with self._lock:
            layer = self.layer
            if layer is not None and self._fingerprint == meta.tokenizer_fingerprint:
                if layer.max_order != meta.max_order:  # count the documents again
                    documents = layer.documents()
                    layer = self._new_layer(meta.max_order)
                    for packed in documents:
                        layer.learn(_unpack(packed))
                    self.layer = layer
                return layer
            if layer is not None:
                log.warning("the graph's tokenizer changed: the live layer starts empty")
            self.layer = layer = self._new_layer(meta.max_order)
            self._fingerprint = meta.tokenizer_fingerprint
            self._log = self._open_log(graph.path, meta.tokenizer_fingerprint, meta.max_order)
            if self._log is not None:
                try:
                    generations, tokens = self._log.replay(layer)
                except (LearnLogError, OSError) as exc:
                    log.warning("learn log not replayed: %s", exc)
                    self._log = None
                else:
                    log.info(
                        "replayed %d learned generations (%d tokens) from %s; live layer %.1f MiB",
                        generations,
                        tokens,
                        self._log.path,
                        layer.estimated_bytes() / 2**20,
                    )
            return layer

    def log_path(self) -> Path | None:
        """The learn log in use (None: none, or not yet attached)."""
        return self._log.path if self._log is not None else None

    def _new_layer(self, max_order: int) -> LiveLayer:
        return LiveLayer(max_order, max_bytes=self.config.max_bytes, weight=self.config.weight)

    def _open_log(self, graph_path: Path, fingerprint: str, max_order: int) -> LearnLog | None:
        if self.config.log_path is None:
            return None
        path = self.config.log_path or default_log_path(graph_path)
        return LearnLog(path, tokenizer_fingerprint=fingerprint, max_order=max_order)

    def learn(
        self, token_ids: Sequence[int], generation_id: str, persist: bool, vocab_size: int
    ) -> LearnOutcome:
        """Validate a report (InvalidArgumentError naming the field), learn it, persist it."""
        check_report(token_ids, generation_id, vocab_size)
        layer = self.layer
        if layer is None:
            raise InvalidArgumentError("token_ids", "no graph is loaded yet")
        kept = layer.learn(token_ids)
        persisted = False
        learn_log = self._log
        if persist and learn_log is not None and kept:
            try:
                learn_log.append(generation_id, token_ids)
                persisted = True
            except OSError as exc:
                if not self._log_failed:
                    self._log_failed = True
                    log.warning(
                        "learn log %s not written (learning goes on): %s", learn_log.path, exc
                    )
        return LearnOutcome(kept, persisted, layer.stats())


def check_report(token_ids: Sequence[int], generation_id: str, vocab_size: int) -> None:
    """InvalidArgumentError naming the field of a bad Learn report."""
    if len(token_ids) < 2:
        raise InvalidArgumentError("token_ids", f"need at least 2 tokens, got {len(token_ids)}")
    if len(token_ids) > MAX_LEARN_TOKENS:
        raise InvalidArgumentError(
            "token_ids", f"at most {MAX_LEARN_TOKENS} tokens, got {len(token_ids)}"
        )
    low, high = min(token_ids), max(token_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InvalidArgumentError(
            "token_ids", f"token id {bad} is outside the graph's vocabulary [0, {vocab_size})"
        )
    if len(generation_id) > MAX_GENERATION_ID or not all(32 < ord(c) < 127 for c in generation_id):
        raise InvalidArgumentError(
            "generation_id", f"at most {MAX_GENERATION_ID} printable ASCII characters, no spaces"
        )


def _unpack(packed: bytes) -> list[int]:
    import numpy as np

    return np.frombuffer(packed, dtype=">u4").tolist()
