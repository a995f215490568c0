"""A draft service's online learning: a live layer and a learn log per (graph, tenant), kept
across graph reloads.

The gateway reports every finished generation (``DraftService/Learn``) with the graph it drafted
from and the tenant it served; this module keeps what the service learned from it in that
(graph, tenant)'s *learned layer* (:mod:`draft_service.live_layer`) and persists the generations
it is asked to persist into that layer's learn log (:mod:`draft_service.learn_log`), which a
service replays when it opens the graph. So one tenant's generations shape only its own drafts
of that graph: another tenant's drafts, and another graph's, stay byte-identical. Learning never
fails a request: a log that cannot be written is logged (once) and learning goes on in memory.

Learn logs: with no ``--learn-log``, beside each graph folder, ``GRAPH_DIR.learned.jsonl`` for
the default tenant and ``GRAPH_DIR.learned.TENANT.jsonl`` for the others; with ``--learn-log
PATH``, PATH is the default graph's default tenant's and the others sit beside it as
``STEM.GRAPH.jsonl`` / ``STEM.GRAPH.TENANT.jsonl`` (names hold no dots, so each file name says
whose it is). A layer learned under one max order is counted again when a reload changes it.
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
from speculant.graph_catalog import NAME_PATTERN
from speculant.graph_reader import NGramGraph
from speculant.types import LiveStats

log = logging.getLogger(__name__)

MAX_LEARN_TOKENS = 65_536  # tokens of one learned generation (LearnRequest.token_ids)
MAX_GENERATION_ID = 128
LOG_SUFFIX = ".learned.jsonl"  # the default learn log: GRAPH_DIR + this, beside the graph


@dataclass(frozen=True)
class LearningConfig:
    """How a draft service learns. max_bytes: the memory cap of each (graph, tenant) layer.
    log_path: "" = beside each graph (see the module docstring), None = no log (learning in
    memory only, lost at a restart), else the default graph's default tenant's log."""

    enabled: bool = True
    max_bytes: int = DEFAULT_MAX_BYTES
    weight: float = DEFAULT_WEIGHT
    log_path: str | None = ""


def default_log_path(graph_path: str | Path, tenant: str = "") -> Path:
    """The learn log beside a graph folder: GRAPH_DIR.learned[.TENANT].jsonl."""
    path = Path(graph_path).expanduser().absolute()
    middle = f".{tenant}" if tenant else ""
    return path.with_name(path.name + LOG_SUFFIX.replace(".jsonl", f"{middle}.jsonl"))


@dataclass(frozen=True)
class LearnOutcome:
    learned_tokens: int
    persisted: bool
    stats: LiveStats


@dataclass(eq=False)
class _Learned:
    """One (graph, tenant)'s layer and log."""

    layer: LiveLayer
    log: LearnLog | None
    log_failed: bool = False


class Learning:
    """The learned layers and learn logs of one draft service (see the module docstring)."""

    def __init__(self, config: LearningConfig | None = None, default_graph: str = "") -> None:
        """default_graph: the name whose default tenant's log is config.log_path when given."""
        self.config = config or LearningConfig()
        self.default_graph = default_graph
        self._lock = threading.Lock()
        self._learned: dict[tuple[str, str], _Learned] = {}

    def layer(self, name: str, tenant: str, graph: NGramGraph) -> LiveLayer:
        """(graph name, tenant)'s layer for `graph`, made (and its log replayed) on first use;
        counted again when the graph's max order changed since it was learned."""
        key = (name, tenant)
        with self._lock:
            learned = self._learned.get(key)
            if learned is None:
                learned = self._open(name, tenant, graph)
                self._learned[key] = learned
            elif learned.layer.max_order != graph.max_order:  # count the documents again
                documents = learned.layer.documents()
                learned.layer = self._new_layer(graph.max_order)
                for packed in documents:
                    learned.layer.learn(_unpack(packed))
            return learned.layer

    def tenants_on_disk(self, name: str, graph: NGramGraph) -> list[str]:
        """The tenants whose learn log of this graph exists (the default tenant as "")."""
        default = self.log_path(name, "", graph)
        if default is None:
            return []
        found = [""] if default.exists() else []
        pattern = self.log_path(name, "*", graph)  # "*": no name holds it
        assert pattern is not None
        prefix, suffix = pattern.name.split("*")
        for path in sorted(pattern.parent.glob(pattern.name)):
            tenant = path.name[len(prefix) : len(path.name) - len(suffix)]
            if NAME_PATTERN.fullmatch(tenant):
                found.append(tenant)
        return found

    def log_path(self, name: str, tenant: str, graph: NGramGraph) -> Path | None:
        """Where (graph name, tenant)'s learn log lives (None: learning in memory only)."""
        given = self.config.log_path
        if given is None:
            return None
        if given == "":
            return default_log_path(graph.path, tenant)
        path = Path(given)
        if name == self.default_graph and not tenant:
            return path
        parts = [path.stem, name, *([tenant] if tenant else [])]
        return path.with_name(".".join(parts) + path.suffix)

    def forget(self, name: str) -> None:
        """Drop the layers of a graph no longer served (their logs stay on disk)."""
        with self._lock:
            for key in [key for key in self._learned if key[0] == name]:
                del self._learned[key]

    def layers(self) -> list[tuple[str, str, LiveLayer, Path | None]]:
        """(graph name, tenant, layer, its log) of every layer held."""
        with self._lock:
            return [
                (name, tenant, learned.layer, learned.log.path if learned.log else None)
                for (name, tenant), learned in self._learned.items()
            ]

    def _new_layer(self, max_order: int) -> LiveLayer:
        return LiveLayer(max_order, max_bytes=self.config.max_bytes, weight=self.config.weight)

    def _open(self, name: str, tenant: str, graph: NGramGraph) -> _Learned:
        """A new layer for (name, tenant), its log replayed into it."""
        meta = graph.meta
        layer = self._new_layer(meta.max_order)
        path = self.log_path(name, tenant, graph)
        if path is None:
            return _Learned(layer, None)
        learn_log = LearnLog(
            path, tokenizer_fingerprint=meta.tokenizer_fingerprint, max_order=meta.max_order
        )
        try:
            generations, tokens = learn_log.replay(layer)
        except (LearnLogError, OSError) as exc:
            log.warning("learn log not replayed: %s", exc)
            return _Learned(layer, None)
        if generations:
            log.info(
                "replayed %d learned generations (%d tokens) of graph %s%s from %s; layer %.1f MiB",
                generations,
                tokens,
                name,
                f", tenant {tenant}" if tenant else "",
                learn_log.path,
                layer.estimated_bytes() / 2**20,
            )
        return _Learned(layer, learn_log)

    def learn(
        self,
        name: str,
        tenant: str,
        graph: NGramGraph,
        token_ids: Sequence[int],
        generation_id: str,
        persist: bool,
    ) -> LearnOutcome:
        """Validate a report (InvalidArgumentError naming the field), learn it into (name,
        tenant)'s layer, persist it into that layer's log."""
        check_report(token_ids, generation_id, graph.vocab_size)
        layer = self.layer(name, tenant, graph)
        learned = self._learned[(name, tenant)]
        kept = layer.learn(token_ids)
        persisted = False
        learn_log = learned.log
        if persist and learn_log is not None and kept:
            try:
                learn_log.append(generation_id, token_ids)
                persisted = True
            except OSError as exc:
                if not learned.log_failed:
                    learned.log_failed = True
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
