"""Measuring the verifier's cost profile at start-up (speculant.cost_profile).

The probe times chain forwards of n new tokens appended to a scratch KV cache of CACHE_TOKENS
random tokens, through the verifier's own forward path (``LoadedModel.forward``, as Verify runs
it; the cache is cropped back after each). A first pass takes n ascending on PROBE_GRID, one
untimed warm-up forward and one timed forward each, until the next size would take more than
FIRST_PASS_SHARE of the budget left (the sizes up to SMALL_SIZES, where a CPU's BLAS switches
kernels and chat drafts are verified, while they fit in twice the budget). Then passes over the
sizes measured, in alternating order, while the budget lasts, up to REPEATS timed forwards a
size; the fastest counts (the least disturbed by other load). Passes spread a burst of other
load over every size, where measuring a size's repeats in a row would put it on that one size,
which the profile (not forced to grow with n) would then price too high. Last the largest size,
once, if that fits in twice the budget (the profile then interpolates up to it rather than
extrapolates: on a CPU a forward over 2 new tokens can cost as much as one over 8, so a slope
read off the small sizes would say nothing of the large). The verifier refreshes the profile
from real Verify timings later. On a GPU the device is synchronised around each forward.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from speculant.cost_profile import MAX_FORWARD_TOKENS, CostProfile
from verifier_service.model import LoadedModel

PROBE_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, MAX_FORWARD_TOKENS)
CACHE_TOKENS = 128
REPEATS = 3  # timed forwards of a size at most
SMALL_SIZES = 8  # the sizes up to this one are measured while they fit in twice the budget
FIRST_PASS_SHARE = 0.25  # the first pass stops where the next size would take more of what is left
DEFAULT_BUDGET_S = 2.0  # what the probe may take at start-up, at most about


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_forward(model: LoadedModel, cache: Any, ids: torch.Tensor, start: int, n: int) -> float:
    """Seconds of one forward over ids[start : start + n] appended to a cache of `start`
    tokens (as Verify runs it), the device synchronised around it; the cache is cropped back
    to `start` after it (not timed)."""
    _synchronize(model.device)
    begun = time.perf_counter()
    model.forward(cache, ids[start : start + n], start, n)
    _synchronize(model.device)
    elapsed = time.perf_counter() - begun
    model.crop(cache, start)
    return elapsed


def measure_cost_profile(model: LoadedModel, budget_s: float = DEFAULT_BUDGET_S) -> CostProfile:
    """The model's cost profile, measured within about budget_s seconds (cost(1) and cost(2) are
    measured whatever the budget; the small sizes and the largest may take it to twice that);
    refreshed by later observations."""
    cache_tokens = min(CACHE_TOKENS, max(1, model.max_context - MAX_FORWARD_TOKENS - 1))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(
        3, model.vocab_size, (cache_tokens + MAX_FORWARD_TOKENS,), generator=generator
    )
    ids = ids.to(model.device)
    cache = model.new_cache()
    model.forward(cache, ids[:cache_tokens], 0, logits_to_keep=1)
    room = model.max_context - cache_tokens
    grid = [n for n in PROBE_GRID if n <= room]
    samples: dict[int, list[float]] = {}
    started = time.perf_counter()

    def left() -> float:
        return budget_s - (time.perf_counter() - started)

    def timed(n: int) -> float:
        return timed_forward(model, cache, ids, cache_tokens, n)

    for index, n in enumerate(grid):  # the first pass: a warm-up and one timed forward each
        timed(n)  # warms up this shape
        samples[n] = [timed(n)]
        following = grid[index + 1] if index + 1 < len(grid) else None
        if following is None or len(samples) < 2:
            continue
        # the next size costs a warm-up and a timed forward, each ~ cost(n) * following / n (at
        # most: on a CPU a forward over 8 can cost what one over 2 does); the small sizes,
        # where a CPU's BLAS switches kernels, while they fit in twice the budget
        spare = left() + budget_s if following <= SMALL_SIZES else FIRST_PASS_SHARE * left()
        if 2 * samples[n][0] * following / n > spare:
            break
    measured = list(samples)
    for repeat in range(1, REPEATS):  # passes over the sizes measured while the budget lasts
        if sum(min(samples[n]) for n in measured) > left():
            break
        for n in reversed(measured) if repeat % 2 else measured:
            samples[n].append(timed(n))
    top, last = grid[-1], measured[-1]  # the largest size: once if it fits, else extrapolated
    if top not in samples and 2 * min(samples[last]) * top / last <= max(left(), 0) + budget_s:
        timed(top)
        samples[top] = [timed(top)]
    points = {n: min(times) for n, times in samples.items()}
    return CostProfile.from_points(points, "measured", refresh=True)
