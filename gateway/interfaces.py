"""The interfaces (Protocols) the coordinator and the gateway drive.

Two carry a round: a drafter (DraftSource) and a verifier (TargetVerifier). Each has an
in-process implementation (embedded mode: draft_service.drafting.Drafter and
verifier_service.verifier.LocalVerifier) and a gRPC one (gateway.backends), so the same round
logic runs in one process or across services.
The engine (gateway.engine) drives them as a draft tier and a verifier it can check
(RemoteDraftTier, RemoteVerifier: the gRPC clients, or the in-process ones wrapped by
gateway.embedded); a draft tier binds each request's graph and tenant (RequestDrafter), and
a TierLearner learns from finished generations (the coordinator gets its learn, bound to
the request's target).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from speculant.config import DraftParams, SessionOptions
from speculant.types import (
    DraftProposal,
    DraftTarget,
    ModelInfo,
    SparseDistribution,
    VerifyResult,
)


class DraftSource(Protocol):
    """Proposes up to params.k draft tokens continuing a context, with the q of each."""

    def propose(
        self, context_ids: Sequence[int], params: DraftParams, seed: int | None = None
    ) -> DraftProposal: ...


class TargetVerifier(Protocol):
    """Runs the target model for one session at a time (see speculant.types for the terms)."""

    @property
    def info(self) -> ModelInfo: ...

    def start(
        self, session_id: str, prompt_ids: Sequence[int], options: SessionOptions
    ) -> VerifyResult:
        """Build the session's KV cache from the prompt; return the first generated token (and
        its logprobs when options ask for them). The options hold for the whole session."""
        ...

    def verify(
        self,
        session_id: str,
        draft_ids: Sequence[int],
        draft_distributions: Sequence[SparseDistribution] | None = None,
        draft_parents: Sequence[int] | None = None,
    ) -> VerifyResult:
        """Score the drafts in one forward pass; None distributions = point-mass (greedy) drafts;
        draft_parents: a draft tree (see DraftProposal.parents), None = a chain."""
        ...

    def release(self, session_id: str) -> bool: ...


class DraftTierGraph(Protocol):
    """What the engine reads of a draft tier's graph (a GetGraphInfoResponse has it all)."""

    name: str  # its name in the tier's catalog ("" from an older draft service)
    graph_names: Sequence[str]  # every graph the tier serves, default first
    graph_path: str
    graph_version: int
    max_order: int
    context_window: int  # the context tokens drafting reads (0 from an older draft service)
    tokenizer_name: str
    tokenizer_fingerprint: str


class RequestDrafter(DraftSource, Protocol):
    """A draft tier bound to one request's graph and tenant (DraftTarget) for its rounds;
    closed when the request ends."""

    def close(self) -> None: ...


class RemoteDraftTier(DraftSource, Protocol):
    """A draft tier as the engine drives it: the draft services (gateway.backends)
    or the graph catalog in this process (gateway.embedded). Its own propose drafts from the
    default graph for the default tenant."""

    def graph_info(self, timeout_s: float = 5.0, graph: str = "") -> DraftTierGraph:
        """A graph's meta (empty: the default graph) from the first replica that answers
        (UnavailableError if none; NotFoundError for a graph it does not serve)."""
        ...

    def bind(self, target: DraftTarget) -> RequestDrafter:
        """The drafter of one request: target's graph, for target's tenant."""
        ...

    def close(self) -> None: ...


class RemoteVerifier(TargetVerifier, Protocol):
    """A verifier as the engine drives it: the verifier service (gateway.backends)
    or the model in this process (gateway.embedded)."""

    address: str

    def health(self, timeout_s: float) -> str:
        """Its health status name (SERVING, NOT_SERVING) or why it did not answer."""
        ...

    def forget_info(self) -> None:
        """Drop the cached model info (asked again on next use, e.g. after a restart)."""
        ...


class TierLearner(Protocol):
    """What a draft tier learns from the generations it drafted for (the engine's): into the
    learned layer of the generation's graph and tenant. The catalog in one process
    (gateway.embedded), a reporter to the draft services over gRPC
    (gateway.backends.LearnReporter)."""

    def learn(self, token_ids: Sequence[int], target: DraftTarget | None = None) -> object:
        """Take one finished generation's tokens (the prompt's, then the output's), drafted
        from target's graph for its tenant (None: the default graph and tenant)."""
        ...
