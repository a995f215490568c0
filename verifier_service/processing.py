"""The target distribution p of a session: the model's logits processed by its sampling controls.

Terms:
- *history* of a position: the prompt and every token before the position (for the rows of a
  Verify forward: the session's cached tokens, the pending token and the drafts on the row's
  path, accepted or not yet decided).
- *counts*: how often each vocabulary token occurs in a history, ``[rows, V]``.
- *scores*: processed logits, ``[rows, V]`` float32, in Hugging Face ``generate``'s order (see
  :class:`speculant.sampling_controls.SamplingControls`): penalties over the history, then the
  temperature and the warpers, removed tokens at -inf. At temperature > 0, p = softmax(scores); at
  temperature 0 the scores are the penalised logits and the emitted token is their argmax.

Rejection sampling (:mod:`verifier_service.rejection`) then runs on the scores at
:attr:`TargetProcessor.sampling_temperature` (1, or 0 for greedy), so every rule it implements
(sample-and-match, the residual, recursive tree sampling) samples the processed p exactly.
Without controls the raw logits go through unchanged, at the session's temperature.
"""

from __future__ import annotations

import torch

from speculant.grammar import ConstraintMatcher
from speculant.sampling_controls import SamplingControls
from speculant.types import TokenLogprobs

_FLOAT32_TINY = torch.finfo(torch.float32).tiny
_REMOVED = float("-inf")


class TargetProcessor:
    """Turns a session's logits into scores (see the module's terms); one per session.

    controls: resolved (every field set, see SamplingControls.resolved); temperature >= 0.
    """

    def __init__(self, controls: SamplingControls, temperature: float) -> None:
        self.controls = controls
        self.temperature = temperature
        self.identity = controls.is_off  # p = softmax(logits / temperature): nothing to do
        self.penalises = controls.penalises

    @property
    def sampling_temperature(self) -> float:
        """The temperature rejection sampling applies to the scores: the session's own when
        the logits pass through unchanged, else 1 (already applied), or 0 for greedy."""
        if self.identity or self.temperature == 0:
            return self.temperature
        return 1.0

    def scores(self, logits: torch.Tensor, counts: torch.Tensor | None) -> torch.Tensor:
        """logits [rows, V] -> scores [rows, V]; counts [rows, V] of each row's history (needed
        only when a penalty is on)."""
        if self.identity:
            return logits
        c = self.controls
        z = logits.float()  # [rows, V]
        if self.penalises:
            assert counts is not None, "penalties need the history's counts"
            z = penalise(z, counts, c)
        if self.temperature == 0:
            return z  # greedy: the argmax of the penalised logits
        z = (z - z.max(dim=-1, keepdim=True).values) / max(self.temperature, _FLOAT32_TINY)
        if c.top_k:
            z = top_k_filter(z, int(c.top_k))
        if c.top_p is not None and c.top_p < 1.0:
            z = top_p_filter(z, c.top_p)
        if c.min_p:
            z = min_p_filter(z, c.min_p)
        return z

    def log_probs(self, scores: torch.Tensor) -> torch.Tensor:
        """log p [rows, V] of scores [rows, V] (temperature 0: the log-softmax of the penalised
        logits, the temperature-1 distribution greedy decoding takes the argmax of)."""
        if self.identity and self.temperature > 0:
            z = scores.float()
            z = z - z.max(dim=-1, keepdim=True).values
            return torch.log_softmax(z / max(self.temperature, _FLOAT32_TINY), dim=-1)
        return torch.log_softmax(scores.float(), dim=-1)


def penalise(z: torch.Tensor, counts: torch.Tensor, controls: SamplingControls) -> torch.Tensor:
    """Hugging Face's repetition penalty, then OpenAI's presence and frequency penalties.
    z, counts: [rows, V] -> [rows, V]."""
    seen = counts > 0  # [rows, V]
    penalty = controls.repetition_penalty
    if penalty is not None and penalty != 1.0:
        z = torch.where(seen, torch.where(z < 0, z * penalty, z / penalty), z)
    if controls.presence_penalty:
        z = z - controls.presence_penalty * seen.float()
    if controls.frequency_penalty:
        z = z - controls.frequency_penalty * counts.float()
    return z


def top_k_filter(z: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest scores of each row (ties with the k-th kept), as HF TopKLogitsWarper."""
    k = min(k, z.shape[-1])
    kth = torch.topk(z, k, dim=-1).values[..., -1:]  # [rows, 1]
    return z.masked_fill(z < kth, _REMOVED)


def top_p_filter(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely set whose mass reaches top_p (at least one token), as HF
    TopPLogitsWarper: sorted ascending, drop while the cumulative mass is <= 1 - top_p."""
    ascending, order = torch.sort(z, dim=-1)  # [rows, V]
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    drop_sorted = cumulative <= (1 - top_p)
    drop_sorted[..., -1:] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return z.masked_fill(drop, _REMOVED)


def min_p_filter(z: torch.Tensor, min_p: float) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the largest (keeping the most likely
    one), as HF MinPLogitsWarper."""
    probs = torch.softmax(z, dim=-1)  # [rows, V]
    drop = probs < min_p * probs.amax(dim=-1, keepdim=True)  # never the most likely token
    return z.masked_fill(drop, _REMOVED)


def count_tokens(counts: torch.Tensor, token_ids: list[int]) -> None:
    """Add one occurrence of each of token_ids to counts [V], in place."""
    if token_ids:
        index = torch.tensor(token_ids, dtype=torch.long, device=counts.device)
        counts.index_add_(0, index, torch.ones(len(token_ids), device=counts.device))


def history_counts(
    base: torch.Tensor, input_ids: torch.Tensor, parents: list[int] | None
) -> torch.Tensor:
    """Counts [n+1, V] of each row's history for a Verify forward over input_ids [n+1] =
    [pending, d_1..d_n]: row 0's history is the cache plus the pending token; row i + 1's adds
    draft i and its ancestors (a chain: d_1..d_{i+1}). base: [V] counts of the cached tokens."""
    rows = input_ids.shape[0]
    one_hot = torch.zeros(rows, base.shape[0], dtype=base.dtype, device=base.device)
    one_hot[torch.arange(rows, device=base.device), input_ids] = 1
    if parents is None:
        return base + torch.cumsum(one_hot, dim=0)  # [n+1, V]
    counts = torch.empty_like(one_hot)
    counts[0] = base + one_hot[0]
    for i, parent in enumerate(parents):  # parents[i] < i: each row's parent row is done
        counts[i + 1] = counts[parent + 1] + one_hot[i + 1]
    return counts


def token_logprobs(log_p: torch.Tensor, token_ids: list[int], top: int) -> list[TokenLogprobs]:
    """TokenLogprobs of token_ids[i] under row i of log_p [len(token_ids), V], with the top
    most likely alternatives of each row (tokens of probability 0 are no alternatives)."""
    rows = torch.arange(len(token_ids), device=log_p.device)
    chosen = log_p[rows, torch.tensor(token_ids, device=log_p.device)].tolist()
    out: list[TokenLogprobs] = []
    if top > 0:
        values, indices = torch.topk(log_p, min(top, log_p.shape[-1]), dim=-1)  # [rows, top]
        for token, logprob, ids, vals in zip(
            token_ids, chosen, indices.tolist(), values.tolist(), strict=True
        ):
            kept = [(i, v) for i, v in zip(ids, vals, strict=True) if v > _REMOVED]
            out.append(
                TokenLogprobs(token, logprob, tuple(i for i, _ in kept), tuple(v for _, v in kept))
            )
        return out
    return [TokenLogprobs(token, logprob) for token, logprob in zip(token_ids, chosen, strict=True)]


class ConstrainedRows:
    """The scores of a forward's rows under a constraint, made as a tree walk reaches them
    (rejection.walk_tree): row 0 at the grammar state after the pending token, row i + 1 once
    the walk has accepted draft i (the matcher consumes it then). Each row's logits are masked
    by the grammar (forbidden tokens at -inf, see speculant.grammar), then processed.

    At temperature 0, when no logprobs are reported (``argmax_only``), a row gives its argmax
    token: the processed argmax when the grammar allows it (then it is the masked argmax too),
    else the masked one, so most rows need no mask. logits: [n+1, V]; counts: [n+1, V] of each
    row's history (with a penalty); drafts, parents: the draft (parents None: a chain).
    """

    def __init__(
        self,
        matcher: ConstraintMatcher,
        logits: torch.Tensor,
        counts: torch.Tensor | None,
        processor: TargetProcessor,
        drafts: list[int],
        parents: list[int] | None,
        argmax_only: bool,
    ) -> None:
        self.matcher = matcher
        self._logits, self._counts, self._processor = logits, counts, processor
        self._drafts = drafts
        self._parents = parents if parents is not None else list(range(-1, len(drafts) - 1))
        self._argmax_only = argmax_only
        self._node = -1  # the draft the matcher has consumed last (-1: none this round)
        self.scores: dict[int, torch.Tensor] = {}  # [V] processed scores of the rows made

    def __call__(self, row: int) -> torch.Tensor | int:
        node = row - 1
        if node != self._node:  # the walk accepted draft `node`, a child of the last node
            assert self._parents[node] == self._node, "rows are asked for along one path"
            self.matcher.consume([self._drafts[node]])
            self._node = node
        logits = self._logits[row : row + 1]  # [1, V]
        counts = None if self._counts is None else self._counts[row : row + 1]
        if self._argmax_only:
            best = int(torch.argmax(self._processor.scores(logits, counts)))
            if self.matcher.allows(best):
                return best
        scores = self._processor.scores(self.matcher.mask(logits), counts)[0]  # [V]
        self.scores[row] = scores
        return int(torch.argmax(scores)) if self._argmax_only else scores

    def emitted(self, token_id: int) -> None:
        """The walk's last emitted token (corrected or bonus): the matcher consumes it."""
        self.matcher.consume([token_id])
