"""Adaptive draft length: each round's k from the request's acceptance history.

Terms: a round asks the drafter for up to k tokens (the *current* length), the drafter returns
``drafted`` <= k of them (a draft ends early at a dead end), and the
verifier keeps the first ``accepted`` of them. Drafted tokens after the first rejection are
*wasted*: the verifier paid for them and threw them away. The rule (additive increase,
multiplicative decrease, in the spirit of TCP's congestion window):

- a rejection (accepted < drafted): shrink halfway toward accepted + 1, the length that round
  would have needed, ``k' = max(k_min, ceil((k + accepted + 1) / 2))``, never above k;
- every token accepted and the draft as long as asked (drafted >= k): grow, ``k' = min(k_max,
  k + GROW)``;
- every token accepted but the draft shorter than asked: keep k (the drafter, not k, was the
  limit).

What it buys, measured by replay (``bench.greedy_sim``: exact rounds at temperature
0) on 32 tinystories dev prompts, 128 tokens, stories260K, the default mixing: fixed k=8 takes
2.65 tokens per verifier forward (tau) and wastes 9,161 of 11,712 drafted tokens; this rule
with k_max 8 takes tau 2.31 and wastes 3,816 of 6,136 (grow 1 instead of 2: tau 2.21, 3,176
wasted). A fixed k=4 beat it (tau 2.41, 4,139 of 6,537 wasted), and the other rules tried
(shrink straight to accepted + 1; an EMA of the accepted count plus a margin) did no better:
on this data a request's acceptance history says little about its next round. It can only
pay where each extra draft token makes a verifier forward noticeably slower (not measured
here); where extra tokens are nearly free (a memory-bound GPU forward) a fixed k is better.
The length never changes the output: verification is exact for any draft.
With a draft tree (the default draft, DraftConfig.tree_nodes) the length is the tree's depth
while its node budget stays, so a shallower tree is a wider one and no fewer tokens are verified:
use it with chains (tree_nodes=0).
"""

from __future__ import annotations

GROW = 2  # tokens added after a fully accepted full-length draft


def next_draft_length(
    current: int, drafted: int, accepted: int, k_max: int, k_min: int = 1, grow: int = GROW
) -> int:
    """The next round's draft length after a round that asked for `current` tokens, got
    `drafted` from the drafter and had `accepted` of them accepted (see the module's rule).
    For a draft tree, `drafted` is the tree's depth (the positions it spans), not its size.

    Always in [k_min, k_max] (k_min is raised to 1 and capped at k_max).
    """
    k_min = min(max(1, k_min), k_max)
    if accepted < drafted:
        halfway = -(-(current + accepted + 1) // 2)  # ceil((current + accepted + 1) / 2)
        target = min(current, halfway)
    elif drafted >= current:
        target = current + grow
    else:
        target = current
    return max(k_min, min(k_max, target))
