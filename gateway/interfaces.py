"""The two small interfaces the coordinator drives: a drafter and a verifier.

Each has an in-process implementation (embedded mode: draft_service.drafting.Drafter and
verifier_service.verifier.LocalVerifier) and a gRPC one (gateway.clients), so the same round
logic runs in one process or across services.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from speculant.types import DraftParams, DraftProposal, ModelInfo, SparseDistribution, VerifyResult


class DraftSource(Protocol):
    """Proposes up to params.k draft tokens continuing a context, with the q of each."""

    def propose(
        self, context_ids: Sequence[int], params: DraftParams, seed: int | None = None
    ) -> DraftProposal: ...


class TargetVerifier(Protocol):
    """Runs the target model for one session at a time (see speculant.types for the terms)."""

    @property
    def info(self) -> ModelInfo: ...

    def prefill(
        self,
        session_id: str,
        prompt_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> int:
        """Build the session's KV cache from the prompt; return the first generated token."""
        ...

    def verify(
        self,
        session_id: str,
        draft_ids: Sequence[int],
        draft_distributions: Sequence[SparseDistribution] | None = None,
    ) -> VerifyResult:
        """Score the drafts in one forward pass; None distributions = point-mass (greedy) drafts."""
        ...

    def release(self, session_id: str) -> bool: ...
