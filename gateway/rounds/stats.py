"""Per-request statistics of speculative decoding.

A *round* is one verifier forward pass: the prefill, then one Verify per draft. tau (tokens per
round) = generated tokens / rounds is the figure peers report as tokens per target forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    """Counters and timings of one generation (mirrors speculant.v1.GenerationStats)."""

    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    total_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    draft_failures: int = 0
    accepted_from_graph: int = 0  # accepted drafts by source (DraftProposal.sources)
    accepted_from_overlay: int = 0
    accepted_from_both: int = 0
    prepared_drafts_used: int = 0  # rounds whose draft was prepared during the last verify
    unverified_draft_tokens: int = 0  # drafted, then cut by the sizer (gateway.rounds.draft_sizing)
    rounds_without_draft: int = 0  # Verify rounds with no draft token (plain decoding steps)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def wasted_draft_tokens(self) -> int:
        """Draft tokens the verifier checked and rejected (drafted - accepted)."""
        return self.draft_tokens - self.accepted_tokens

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.generated_tokens / self.rounds if self.rounds else 0.0

    @property
    def other_seconds(self) -> float:
        return max(0.0, self.total_seconds - self.draft_seconds - self.verify_seconds)

    def record_round(
        self,
        drafted: int,
        accepted: int,
        sources: list[str] | tuple[str, ...] = (),
        positions: int | None = None,
    ) -> None:
        """Count one Verify round: `drafted` draft tokens spanning `positions` draft positions
        (default: drafted, a chain; a tree's depth), of which `accepted` were kept (a prefix or
        a path); sources: those of the accepted drafts, in order (possibly empty)."""
        for source in sources[:accepted]:
            if source == "overlay":
                self.accepted_from_overlay += 1
            elif source == "both":
                self.accepted_from_both += 1
            else:
                self.accepted_from_graph += 1
        self.rounds += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        positions = drafted if positions is None else positions
        grow = positions - len(self.drafted_by_position)
        if grow > 0:
            self.drafted_by_position.extend([0] * grow)
            self.accepted_by_position.extend([0] * grow)
        for position in range(positions):
            self.drafted_by_position[position] += 1
        for position in range(accepted):
            self.accepted_by_position[position] += 1

    def as_dict(self) -> dict[str, object]:
        """All figures, derived ones included (for --json output and the bench)."""
        return {
            "rounds": self.rounds,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "accepted_by_position": list(self.accepted_by_position),
            "drafted_by_position": list(self.drafted_by_position),
            "tokens_per_second": self.tokens_per_second,
            "tokens_per_round": self.tokens_per_round,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "total_seconds": self.total_seconds,
            "draft_seconds": self.draft_seconds,
            "verify_seconds": self.verify_seconds,
            "other_seconds": self.other_seconds,
            "draft_failures": self.draft_failures,
            "accepted_from_graph": self.accepted_from_graph,
            "accepted_from_overlay": self.accepted_from_overlay,
            "accepted_from_both": self.accepted_from_both,
            "prepared_drafts_used": self.prepared_drafts_used,
            "wasted_draft_tokens": self.wasted_draft_tokens,
            "unverified_draft_tokens": self.unverified_draft_tokens,
            "rounds_without_draft": self.rounds_without_draft,
        }
