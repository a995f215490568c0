"""Sampling the target: from a forward's logits to the tokens a Verify emits.

Two steps, one job: the logits become the target distribution p (the session's sampling
controls), then the drafts are accepted or corrected against p by exact rejection sampling.

**The target distribution p** of a session: the model's logits processed by its sampling
controls.

Terms:
- *history* of a position: the prompt and every token before the position (for the rows of a
  Verify forward: the session's cached tokens, the pending token and the drafts on the row's
  path, accepted or not yet decided).
- *counts*: how often each vocabulary token occurs in a history, ``[rows, V]``.
- *scores*: processed logits, ``[rows, V]`` float32, in Hugging Face ``generate``'s order (see
  :class:`speculant.config.SamplingControls`): penalties over the history, then the
  temperature and the warpers, removed tokens at -inf. At temperature > 0, p = softmax(scores); at
  temperature 0 the scores are the penalised logits and the emitted token is their argmax.

Rejection sampling (below) then runs on the scores at
:attr:`TargetProcessor.sampling_temperature` (1, or 0 for greedy), so every rule it implements
(sample-and-match, the residual, recursive tree sampling) samples the processed p exactly.
Without controls the raw logits go through unchanged, at the session's temperature.

**Exact speculative rejection sampling**: pure, vectorised torch functions.

Terms (see also :mod:`speculant.types`):
- *p* at a position: the target model's distribution, ``softmax(logits / temperature)``;
  temperature 0 means the argmax, deterministically. With sampling controls (top_k, top_p,
  min_p, penalties) the verifier passes the processed scores
  (above) as ``logits`` at temperature 1 (0 for greedy): every rule
  below is exact for any target distribution.
- *q* of a draft token d_i: the distribution the drafter drew d_i from. ``None`` means every
  draft is a point mass at d_i (greedy drafting), so q(d_i) = 1.
- *accepted*: the longest prefix of the draft that survives; draft i is accepted with
  probability ``min(1, p_i(d_i) / q_i(d_i))``, independently given the uniform draws.
- *corrected* token: drawn at the first rejected position a from the residual
  ``normalise(max(0, p_a - q_a))`` (point-mass q: p_a with d_a removed); if that residual is
  all zero (possible only through rounding), from p_a with d_a removed.
- *bonus* token: drawn from p at position k (after d_k) when all k drafts are accepted.

Every call emits ``accepted + 1`` tokens, and the emitted sequence is distributed exactly as
tokens sampled one at a time from the target model.

Point-mass drafts (chains and trees) are verified by *sample-and-match*: at each position a
token x is drawn from p with one uniform of the session's generator; the draft is accepted while
x equals it, and the first x that differs (or the one after the last draft) is the corrected or
bonus token. That is the point-mass rule above (accept with probability p(d), else a draw from p
without d), and it spends exactly one draw per emitted token, so a seeded request's tokens do
not depend on its drafts: with greedy drafting, learning, k and the draft shape change speed,
never the output, at any temperature.

*Draft tree* of point-mass drafts (:func:`tree_sample`): from the pending token, sample x from p
at the current node; if a child of the node is x, it is accepted and the walk goes on from it,
else x is emitted and the walk ends (x is then the corrected token, or the bonus token at a
leaf). Each emitted token is a plain draw from p given the tokens before it, so this is exact
too; with a chain it is the point-mass rule above (accept d with probability p(d), else draw
from p without d).

*Draft tree* of sampled drafts (:func:`tree_sample` with q; recursive rejection sampling): the
children x_1..x_m of a node were drawn from the node's q *without replacement*, child i from q_i
= q with x_1..x_{i-1} removed and renormalised (the q each child reports). At the node, with r
= p: for i = 1..m, accept x_i with probability min(1, r(x_i) / q_i(x_i)) and go on from it; else
r = normalise(max(0, r - q_i)). When every child is rejected (or at a leaf) the emitted token is
drawn from r. Exact by induction over i: the standard rule above, with target r and proposal
q_i, emits a draw from r whatever x_i was rejected, and the later children are draws from q_i
without x_i, where the new r has no mass either (Jeon et al. 2024, "Recursive Speculative
Decoding"). With point masses it reduces to sample-and-match.

Layout: ``logits[i]`` is the target's prediction for the token after
``[..., pending, d_1, ..., d_i]``, i.e. row i scores d_{i+1} (rows 0..k-1) and row k gives the
bonus distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from speculant.config import SamplingControls
from speculant.grammar import ConstraintMatcher
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


@dataclass(frozen=True)
class RejectionOutput:
    """accepted_count drafts kept, then one corrected or bonus token: token_ids has accepted+1."""

    accepted_count: int
    token_ids: list[int]
    accepted_nodes: tuple[int, ...] = ()  # tree_sample: the accepted draft indices, in order


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """p = softmax(logits / temperature) in float32. logits: [..., V] -> [..., V].

    The max logit is subtracted before dividing (softmax is shift-invariant), so a tiny
    temperature (say 1e-40, where logits / temperature overflows to +-inf and softmax gives NaN)
    yields the point mass at the argmax that it tends to, not NaN; a temperature below float32's
    smallest normal number (which would round to 0) is raised to it, with the same result.
    """
    z = logits.float()
    z = z - z.max(dim=-1, keepdim=True).values
    return torch.softmax(z / max(temperature, _FLOAT32_TINY), dim=-1)


def sample_index(weights: torch.Tensor, generator: torch.Generator | None) -> int:
    """One index drawn with probability proportional to weights [V] (>= 0, not all zero).

    Inverse CDF with one uniform: as exact as torch.multinomial, and on CPU 20x faster for a
    32k vocabulary. The CDF is accumulated in float64, so tiny probabilities keep their mass.
    """
    cdf = torch.cumsum(weights, 0, dtype=torch.float64)  # [V]
    u = torch.rand(1, dtype=torch.float64, device=weights.device, generator=generator)
    index = int(torch.searchsorted(cdf, u * cdf[-1], right=True))  # first i with cdf[i] > u*total
    if index >= weights.shape[0]:  # u * total rounded up to total (probability ~2^-53)
        index = int(torch.nonzero(weights).max())
    return index


def sample_token(
    logits: torch.Tensor, temperature: float, generator: torch.Generator | None
) -> int:
    """One token from p = softmax(logits / temperature); argmax at temperature 0. logits: [V]."""
    if temperature == 0:
        return int(torch.argmax(logits))
    return sample_index(target_probs(logits, temperature), generator)


def residual_distribution(p: torch.Tensor, q: torch.Tensor | None, draft_id: int) -> torch.Tensor:
    """Unnormalised distribution of the corrected token after rejecting ``draft_id``.

    p, q: [V] (q None = point mass at draft_id). Returns max(0, p - q) [V], or, when that is all
    zero, p with draft_id removed; multinomial sampling normalises it.
    """
    if q is None:
        residual = p.clone()
        residual[draft_id] = 0.0
        return residual
    residual = torch.clamp_min(p - q, 0.0)
    if not bool(residual.sum() > 0):
        residual = p.clone()
        residual[draft_id] = 0.0
    return residual


def rejection_sample(
    logits: torch.Tensor,
    draft_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: float,
    generator: torch.Generator | None = None,
) -> RejectionOutput:
    """Accept a prefix of the draft and emit one corrected or bonus token.

    logits: [k+1, V] target logits (row i predicts the token after d_i; row 0 after the pending
    token). draft_ids: [k] int64. draft_probs: [k, V] dense q (rows sum to 1) or None for
    point-mass drafts. temperature >= 0. generator: the session's RNG (same device as logits).
    """
    k = draft_ids.shape[0]
    if temperature == 0:
        # Deterministic: p is a point mass at the argmax, so accept iff d_i == argmax_i, and the
        # corrected / bonus token is the argmax. Identical for any q.
        best = torch.argmax(logits, dim=-1)  # [k+1]
        matches = (best[:k] == draft_ids).int()  # [k]
        accepted = int(torch.cumprod(matches, 0).sum()) if k else 0
        # The accepted drafts equal the argmaxes, so the emitted tokens are argmaxes 0..accepted.
        return RejectionOutput(accepted, best[: accepted + 1].tolist())

    draft_list: list[int] = draft_ids.tolist()
    if draft_probs is None:
        # Point masses: sample-and-match (a draw from p at each position, accepted while it
        # equals the draft), one draw per emitted token: the tokens a seed gives do not depend
        # on the draft (nor on learning, k or the draft shape).
        out = tree_sample(logits, draft_list, list(range(-1, k - 1)), temperature, generator)
        return RejectionOutput(out.accepted_count, out.token_ids)
    p = target_probs(logits, temperature)  # [k+1, V]
    if k:
        rows = torch.arange(k, device=p.device)
        p_draft = p[rows, draft_ids]  # [k] p_i(d_i)
        q_draft = draft_probs[rows, draft_ids]  # [k] q_i(d_i) > 0
        accept_prob = torch.clamp_max(p_draft / q_draft, 1.0)
        uniforms = torch.rand(k, device=p.device, generator=generator)  # [k], one per position
        accepted_mask = (uniforms < accept_prob).int()  # [k]
        accepted = int(torch.cumprod(accepted_mask, 0).sum())  # leading accepts
    else:
        accepted = 0

    if accepted == k:
        final_dist = p[k]  # bonus: p after the last draft
    else:
        final_dist = residual_distribution(p[accepted], draft_probs[accepted], draft_list[accepted])
    final_token = sample_index(final_dist, generator)
    return RejectionOutput(accepted, [*draft_list[:accepted], final_token])


Rows = Callable[[int], torch.Tensor]  # row index -> that row's logits [V]


def tree_sample(
    logits: torch.Tensor,
    draft_ids: list[int],
    parents: list[int],
    temperature: float,
    generator: torch.Generator | None = None,
    draft_probs: torch.Tensor | None = None,
) -> RejectionOutput:
    """Walk a draft tree from the pending token (see the module's terms).

    logits: [n+1, V]: row 0 predicts the token after the pending token, row i + 1 the token
    after draft i (given its ancestors). draft_ids, parents: [n] each, parents[i] < i or -1 (a
    child of the pending token). draft_probs: [n, V] dense q_i of sampled drafts (siblings in
    the order they were drawn), or None for point masses. Returns the accepted path
    (accepted_nodes) and its tokens plus one corrected or bonus token.
    """
    if draft_probs is None and temperature == 0:
        best = torch.argmax(logits, dim=-1).tolist()  # [n+1], all rows at once
        return walk_tree(lambda row: best[row], draft_ids, parents, 0.0, generator)
    return walk_tree(logits.__getitem__, draft_ids, parents, temperature, generator, draft_probs)


def walk_tree(
    rows: Rows | Callable[[int], int],
    draft_ids: list[int],
    parents: list[int],
    temperature: float,
    generator: torch.Generator | None = None,
    draft_probs: torch.Tensor | None = None,
) -> RejectionOutput:
    """tree_sample with each row's logits asked for when the walk reaches it: row 0 first, row
    i + 1 only once draft i is accepted, so a row's logits may depend on the path to it (a
    grammar's mask). At temperature 0 with point masses, rows may give the row's argmax token
    instead of its logits."""
    if draft_probs is not None and temperature > 0:
        return _recursive_walk(rows, draft_ids, parents, temperature, generator, draft_probs)
    children: dict[int, dict[int, int]] = {}  # node (-1 = pending) -> {token: draft index}
    for index, (token, parent) in enumerate(zip(draft_ids, parents, strict=True)):
        children.setdefault(parent, {}).setdefault(token, index)
    node, path, tokens = -1, [], []
    while True:
        scores = rows(node + 1)
        if isinstance(scores, int):
            token = scores
        elif temperature == 0:
            token = int(torch.argmax(scores))
        else:
            token = sample_token(scores, temperature, generator)
        child = children.get(node, {}).get(token)
        tokens.append(token)
        if child is None:
            return RejectionOutput(len(path), tokens, tuple(path))
        path.append(child)
        node = child


def _recursive_walk(
    rows: Rows,
    draft_ids: list[int],
    parents: list[int],
    temperature: float,
    generator: torch.Generator | None,
    draft_probs: torch.Tensor,
) -> RejectionOutput:
    """walk_tree for sampled drafts: recursive rejection sampling over each node's children."""
    children: dict[int, list[int]] = {}  # node (-1 = pending) -> its children, in drawn order
    for index, parent in enumerate(parents):
        children.setdefault(parent, []).append(index)
    node, path, tokens = -1, [], []
    while True:
        residual = target_probs(rows(node + 1), temperature)  # [V] r: what is left of p here
        for child in children.get(node, ()):
            token = draft_ids[child]
            q = draft_probs[child]  # [V] q_i
            accept = torch.clamp_max(residual[token] / q[token], 1.0)
            if bool(torch.rand(1, device=q.device, generator=generator) < accept):
                path.append(child)
                tokens.append(token)
                node = child
                break
            leftover = torch.clamp_min(residual - q, 0.0)
            if bool(leftover.sum() > 0):
                residual = leftover / leftover.sum()
            else:  # r == q up to rounding: a rejection had probability ~0; keep r without x_i
                residual = residual.clone()
                residual[token] = 0.0
        else:
            tokens.append(sample_index(residual, generator))
            return RejectionOutput(len(path), tokens, tuple(path))
