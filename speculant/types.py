"""Plain data passed between the drafter, the verifier and the coordinator (no gRPC inside):
drafts, verification results and the services' reports. The request's parameters (drafting,
and the sampling controls that make p) live in :mod:`speculant.config`.

Terms used across the project:
- *draft tokens*: the tokens the drafter proposes for the next positions, d_1..d_k.
- *q*: the (sparse) distribution a draft token was drawn from by the drafter.
- *p*: the target model's distribution at a position: its logits processed by the request's
  sampling controls (penalties, temperature, top_k / top_p / min_p: :class:`SamplingControls`
  in :mod:`speculant.config`), then softmax; plain softmax(logits / temperature) when
  no control is set.
- *accepted* tokens: the prefix of the draft that rejection sampling keeps.
- *rejected*: the first draft token that is not kept; everything after it is discarded.
- *corrected* token: sampled from the residual distribution in place of the rejected token.
- *bonus* token: sampled from p after the last draft token when every draft token is accepted.
Each verification therefore emits accepted + 1 tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class TokenLogprobs:
    """The target's log-probability of one emitted token under p (temperature 0: the log-softmax
    of the penalised logits), and the most likely alternatives, most likely first."""

    token_id: int
    logprob: float
    top_token_ids: tuple[int, ...] = ()
    top_logprobs: tuple[float, ...] = ()


@dataclass
class SparseDistribution:
    """A distribution over a few token ids: probs[i] = P(token_ids[i]); others have P = 0."""

    token_ids: np.ndarray  # [n] int64
    probs: np.ndarray  # [n] float64, sums to 1

    @classmethod
    def point_mass(cls, token_id: int) -> SparseDistribution:
        return cls(np.array([token_id], dtype=np.int64), np.array([1.0]))


@functools.lru_cache(maxsize=1 << 16)
def point_mass(token: int) -> SparseDistribution:
    """The point mass at token (a greedy draft's q), shared between drafts: read-only arrays
    (:meth:`SparseDistribution.point_mass` makes a fresh one)."""
    dist = SparseDistribution.point_mass(token)
    dist.token_ids.flags.writeable = False
    dist.probs.flags.writeable = False
    return dist


@dataclass
class DraftProposal:
    """Up to k draft tokens; distributions[i] is the q that token_ids[i] was drawn from.

    distributions may be empty for greedy drafts (the gRPC client does not decode them): each q
    is then the point mass at its token, which is what the verifier assumes without them.
    """

    token_ids: list[int] = field(default_factory=list)
    distributions: list[SparseDistribution] = field(default_factory=list)
    matched_orders: list[int] = field(default_factory=list)  # highest matching order per token
    # per token: "graph", "overlay" or "both" (see draft_service.drafting); may be empty
    sources: list[str] = field(default_factory=list)
    # A draft tree: parents[i] is the index of token i's parent (< i), or -1 when token i follows
    # the context directly. Empty: a chain (token i follows token i - 1).
    parents: list[int] = field(default_factory=list)
    # The drafter's confidence: path_probs[i] = q(t_1) * ... * q(t_i) along token i's path (the
    # mixed q of each token before a greedy draft reports its point mass), so token i's own
    # q given its parent is path_probs[i] / path_probs[parent]. May be empty (older servers).
    path_probs: list[float] = field(default_factory=list)
    # Seconds the drafter spent making the draft (its own work, no RPC); 0 when unknown.
    seconds: float = 0.0
    # The build of the graph it came from (a draft service's ProposeResponse.graph_id; "" when
    # unknown), which the request's later rounds pin (DraftTarget.graph_id).
    graph_id: str = ""

    def depths(self) -> list[int]:
        """The draft position (0-based) of each token: its depth in the tree."""
        if not self.parents:
            return list(range(len(self.token_ids)))
        depths: list[int] = []
        for parent in self.parents:
            depths.append(0 if parent < 0 else depths[parent] + 1)
        return depths

    def accepted_sources(self, result: VerifyResult) -> list[str]:
        """The sources of the drafts a verification accepted (a tree's path, a chain's
        prefix)."""
        if not self.sources:
            return []
        if self.parents:
            return [self.sources[i] for i in result.accepted_nodes]
        return self.sources[: result.accepted_count]

    def truncated(self, k: int) -> DraftProposal:
        """Only the draft tokens at positions < k (a shorter chain with the same seed drafts the
        same prefix; a shallower tree keeps its top levels)."""
        keep = [i for i, depth in enumerate(self.depths()) if depth < k]
        return self if len(keep) == len(self.token_ids) else self.select(keep)

    def select(self, keep: list[int]) -> DraftProposal:
        """The draft tokens at indices keep (ascending, every kept token's parent kept too),
        with the tree's parent indices renumbered."""
        new_index = {old: new for new, old in enumerate(keep)}

        def pick(values: list) -> list:
            return [values[i] for i in keep] if values else []

        return DraftProposal(
            pick(self.token_ids),
            pick(self.distributions),
            pick(self.matched_orders),
            pick(self.sources),
            [new_index.get(self.parents[i], -1) for i in keep] if self.parents else [],
            pick(self.path_probs),
            self.seconds,
        )


@dataclass
class VerifyResult:
    """Outcome of one verification: accepted_count drafts kept, then one corrected/bonus token."""

    accepted_count: int
    token_ids: list[int]  # accepted drafts + the corrected or bonus token
    # indices of the accepted drafts in the draft (a tree's path); empty for a chain (0, 1, ...)
    accepted_nodes: list[int] = field(default_factory=list)
    # one per token of token_ids when the session reports logprobs, else empty
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    # Seconds the verifier spent on the model for it (the forward pass and sampling, no RPC);
    # 0 when unknown.
    seconds: float = 0.0
    # Rows of the forward that verified it: 1 alone, more when batched with other sessions'
    # steps (then seconds is the batch's forward)
    batch_rows: int = 1


@dataclass
class ModelInfo:
    """What the verifier reports about its model (GetModelInfo)."""

    model_name: str
    tokenizer_name: str
    tokenizer_fingerprint: str
    vocab_size: int
    eos_token_ids: list[int]
    max_context_length: int
    device: str
    dtype: str
    # [n - 1]: seconds of one forward over n new tokens (speculant.cost_profile); [] = unknown
    verify_cost_seconds: list[float] = field(default_factory=list)


@dataclass
class VerifierStats:
    """Counters of a verifier (GetStats)."""

    live_sessions: int = 0
    sessions_created: int = 0
    sessions_released: int = 0
    sessions_expired: int = 0
    forward_passes: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(frozen=True)
class LiveStats:
    """What the layer holds now, and what it has learned and forgotten since it started."""

    documents: int
    tokens: int
    contexts: int
    pairs: int
    estimated_bytes: int
    max_bytes: int
    learned_documents: int
    forgotten_documents: int


@dataclass(frozen=True)
class DraftTarget:
    """What a request drafts from, and for whom (see :mod:`speculant.graph_catalog`): the
    graph's name ("" = the default graph, "none" = no graph), the tenant ("" = the default one)
    and the build of the graph it began on (ProposeResponse.graph_id; "" = the one served now)."""

    graph: str = ""
    tenant: str = ""
    graph_id: str = ""


@dataclass(frozen=True)
class GraphStatus:
    """One graph of a draft tier's catalog, as AdminService.ListGraphs reports it: its name and
    folder, whether requests naming no graph use it, corpus tokens, bytes on disk, bytes of it
    in the host's page cache now (shared by every process mapping it), version, build id, max
    order and tokenizer."""

    name: str
    path: str
    is_default: bool
    tokens: int
    bytes: int
    resident_bytes: int
    graph_version: int
    graph_id: str
    max_order: int
    tokenizer_name: str
