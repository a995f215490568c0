"""The checks of a verifier's requests, each an INVALID_ARGUMENT naming the first bad field,
made before any work on them: prompt and draft token ids within the vocabulary, sizes within
the limits, draft distributions (q, see :mod:`speculant.types`) that are probabilities, and a
draft tree's parents."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from speculant.errors import InvalidArgumentError
from speculant.sampling_controls import SessionOptions, check_top_logprobs
from speculant.types import SparseDistribution

PROB_SUM_TOLERANCE = 1e-3  # |sum(q) - 1| allowed for a draft distribution


def check_draft_size(draft_tokens: int, distributions: int, limit: int) -> None:
    """INVALID_ARGUMENT unless a Verify of this many draft tokens and distributions is within
    the limit (config.max_draft_tokens)."""
    for field, count in (
        ("draft_token_ids", draft_tokens),
        ("draft_distributions", distributions),
    ):
        if count > limit:
            raise InvalidArgumentError(
                field,
                f"has {count} entries; a Verify takes at most {limit} draft tokens "
                "(--max-draft-tokens)",
            )


def check_token_ids(ids: Sequence[int], field: str, vocab: int) -> None:
    """INVALID_ARGUMENT naming the first id outside the vocabulary [0, vocab)."""
    for i, token in enumerate(ids):
        if not 0 <= token < vocab:
            raise InvalidArgumentError(
                f"{field}[{i}]", f"token id {token} is outside the vocabulary [0, {vocab})"
            )


def checked_start(
    session_id: str,
    prompt_ids: Sequence[int],
    options: SessionOptions,
    *,
    vocab: int,
    max_context: int,
) -> list[int]:
    """The prompt as ints, once every argument of a session's start is valid for a model of
    this vocabulary and context (InvalidArgumentError naming the first that is not)."""
    if not session_id:
        raise InvalidArgumentError("session_id", "must not be empty")
    if not prompt_ids:
        raise InvalidArgumentError("prompt_token_ids", "must not be empty")
    if len(prompt_ids) >= max_context:  # before any work on them
        raise InvalidArgumentError(
            "prompt_token_ids",
            f"has {len(prompt_ids)} tokens; the model's context is {max_context} tokens"
            f" (at most {max_context - 1} prompt tokens, to leave room for one generated token)",
        )
    prompt = [int(t) for t in prompt_ids]
    check_token_ids(prompt, "prompt_token_ids", vocab)
    temperature, seed = options.temperature, options.seed
    if not (math.isfinite(temperature) and temperature >= 0):
        raise InvalidArgumentError("temperature", f"must be finite and >= 0, got {temperature}")
    if seed is not None and not 0 <= seed < 2**64:
        raise InvalidArgumentError("seed", f"must be in [0, 2^64), got {seed}")
    check_top_logprobs(options.top_logprobs)
    options.controls.validate()
    if options.constraint is not None:
        options.constraint.validate()
    return prompt


def dense_q(
    draft_ids: Sequence[int], dists: Sequence[SparseDistribution], vocab: int
) -> torch.Tensor:
    """Validate sparse q's (one per draft token) and scatter them into a dense [k, V] float32
    tensor on the CPU, each normalised to sum 1 (repeated ids add up)."""
    if len(dists) != len(draft_ids):
        raise InvalidArgumentError(
            "draft_distributions",
            f"has {len(dists)} entries for {len(draft_ids)} draft tokens"
            " (give one per draft token, or none for point-mass drafts)",
        )
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    for i, (draft, dist) in enumerate(zip(draft_ids, dists, strict=True)):
        ids, probs = _checked_distribution(f"draft_distributions[{i}]", draft, dist, vocab)
        rows.append(np.full(ids.size, i, dtype=np.int64))
        cols.append(ids)
        vals.append(probs / float(probs.sum()))
    q = torch.zeros(len(draft_ids), vocab, dtype=torch.float32)
    q.index_put_(
        (torch.from_numpy(np.concatenate(rows)), torch.from_numpy(np.concatenate(cols))),
        torch.from_numpy(np.concatenate(vals)).float(),
        accumulate=True,  # repeated ids add up
    )
    return q  # [k, V]


def _checked_distribution(
    field: str, draft: int, dist: SparseDistribution, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probs) of a draft token's q, once they are a distribution over the
    vocabulary that gives the draft token a probability > 0."""
    ids = np.asarray(dist.token_ids, dtype=np.int64)
    probs = np.asarray(dist.probs, dtype=np.float64)
    if ids.shape != probs.shape or ids.ndim != 1:
        raise InvalidArgumentError(
            field, f"token_ids ({ids.size}) and probs ({probs.size}) differ in length"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise InvalidArgumentError(f"{field}.token_ids", f"token ids must be in [0, {vocab})")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise InvalidArgumentError(f"{field}.probs", "must be finite and >= 0")
    total = float(probs.sum())
    if abs(total - 1.0) > PROB_SUM_TOLERANCE:
        raise InvalidArgumentError(f"{field}.probs", f"must sum to 1, got {total:.6g}")
    if float(probs[ids == draft].sum()) <= 0:
        raise InvalidArgumentError(
            field, f"gives the draft token {draft} probability 0 (q(d) must be > 0)"
        )
    return ids, probs


def check_parents(parents: Sequence[int], drafts: int) -> None:
    """INVALID_ARGUMENT unless a draft tree of `drafts` tokens has one parent per token, each
    -1 (the pending token) or an earlier index."""
    if len(parents) != drafts:
        raise InvalidArgumentError(
            "draft_parents", f"has {len(parents)} entries for {drafts} draft tokens"
        )
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise InvalidArgumentError(
                f"draft_parents[{i}]", f"must be -1 or an earlier index (< {i}), got {parent}"
            )
