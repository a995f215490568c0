"""Unit tests of the pure rejection sampler (verifier_service.sampling) on tiny vocabularies."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from verifier_service import sampling
from verifier_service.sampling import rejection_sample, residual_distribution

NEG_INF = -math.inf


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def only(token: int, vocab: int = 6) -> list[float]:
    """Logits row that forces `token` (p = point mass)."""
    row = [NEG_INF] * vocab
    row[token] = 0.0
    return row


def logits_of(probs: list[float]) -> list[float]:
    return [math.log(x) if x > 0 else NEG_INF for x in probs]


def counts_to_freq(counter: Counter[int], vocab: int) -> list[int]:
    return [counter.get(t, 0) for t in range(vocab)]


def assert_matches(observed: list[int], expected_probs: list[float], min_p: float = 1e-3) -> None:
    """Chi-square goodness of fit on the support of expected_probs; nothing outside it."""
    total = sum(observed)
    support = [t for t, p in enumerate(expected_probs) if p > 0]
    outside = sum(o for t, o in enumerate(observed) if t not in support)
    assert outside == 0, f"tokens outside the support: {observed}"
    norm = sum(expected_probs[t] for t in support)
    expected = [total * expected_probs[t] / norm for t in support]
    result = chisquare([observed[t] for t in support], expected)
    assert result.pvalue > min_p, f"observed {observed} vs expected {expected}: {result}"


def test_forced_accept_then_forced_reject() -> None:
    # Rows 0 and 1 force the drafts; row 2 gives the draft probability 0 and forces token 5.
    logits = torch.tensor([only(3), only(1), only(5), only(0)])
    drafts = torch.tensor([3, 1, 1])
    for seed in range(20):
        out = rejection_sample(logits, drafts, None, 1.0, gen(seed))
        assert out.accepted_count == 2
        assert out.token_ids == [3, 1, 5]  # the corrected token: p without the rejected draft


def test_all_accepted_emits_bonus_from_last_row() -> None:
    logits = torch.tensor([only(2), only(4), only(0)])
    for seed in range(10):
        out = rejection_sample(logits, torch.tensor([2, 4]), None, 0.7, gen(seed))
        assert (out.accepted_count, out.token_ids) == (2, [2, 4, 0])


def test_forced_reject_at_first_position_ignores_later_rows() -> None:
    logits = torch.tensor([logits_of([0.5, 0, 0.5, 0, 0, 0]), only(3), only(3)])
    out = rejection_sample(logits, torch.tensor([1, 3]), None, 1.0, gen(0))
    assert out.accepted_count == 0
    assert out.token_ids[0] in (0, 2)
    assert len(out.token_ids) == 1


def test_no_drafts_samples_one_token_from_p() -> None:
    logits = torch.tensor([only(4)])
    out = rejection_sample(logits, torch.zeros(0, dtype=torch.long), None, 1.0, gen(0))
    assert (out.accepted_count, out.token_ids) == (0, [4])


def test_sampled_draft_forced_reject_and_accept() -> None:
    q = torch.tensor([[0.0, 0.5, 0.5, 0, 0, 0]])
    p_zero = torch.tensor([logits_of([0.4, 0, 0.6, 0, 0, 0]), only(0)])
    out = rejection_sample(p_zero, torch.tensor([1]), q, 1.0, gen(0))  # p(d)=0: reject
    assert out.accepted_count == 0  # max(0, p - q) = [0.4, 0, 0.1]
    assert out.token_ids[0] in (0, 2)
    # p(d) >= q(d): min(1, p/q) = 1, always accepted
    p_high = torch.tensor([logits_of([0, 0.6, 0.4, 0, 0, 0]), only(5)])
    for seed in range(10):
        out = rejection_sample(p_high, torch.tensor([1]), q, 1.0, gen(seed))
        assert (out.accepted_count, out.token_ids) == (1, [1, 5])


def test_residual_rule_distribution() -> None:
    """On rejection the corrected token follows normalise(max(0, p - q)) exactly."""
    p = [0.1, 0.2, 0.3, 0.4, 0.0]
    q = [0.5, 0.3, 0.1, 0.0, 0.1]  # draft token 0: p/q = 0.2
    logits = torch.tensor([logits_of(p), only(4, 5)])
    q_t = torch.tensor([q])
    g = gen(1)
    corrected: Counter[int] = Counter()
    n, rejected = 8000, 0
    for _ in range(n):
        out = rejection_sample(logits, torch.tensor([0]), q_t, 1.0, g)
        if out.accepted_count == 0:
            rejected += 1
            corrected[out.token_ids[0]] += 1
    # acceptance rate = min(1, p(d)/q(d)) = 0.2
    assert abs(rejected / n - 0.8) < 4 * math.sqrt(0.16 / n)
    residual = [max(0.0, a - b) for a, b in zip(p, q, strict=True)]  # [0, 0, 0.2, 0.4, 0]
    assert_matches(counts_to_freq(corrected, 5), residual)


def test_point_mass_residual_removes_the_draft() -> None:
    p = [0.25, 0.25, 0.5, 0.0]
    logits = torch.tensor([logits_of(p), only(3, 4)])
    g = gen(2)
    corrected: Counter[int] = Counter()
    for _ in range(6000):
        out = rejection_sample(logits, torch.tensor([2]), None, 1.0, g)
        if out.accepted_count == 0:
            corrected[out.token_ids[0]] += 1
    assert_matches(counts_to_freq(corrected, 4), [0.25, 0.25, 0.0, 0.0])


def test_all_zero_residual_falls_back_to_p_without_draft() -> None:
    p = torch.tensor([0.2, 0.3, 0.5])
    fallback = residual_distribution(p, p.clone(), 1)  # max(0, p - q) == 0 everywhere
    assert fallback.tolist() == pytest.approx([0.2, 0.0, 0.5])
    # Through the sampler: q >= p everywhere (an unnormalised q, only the pure function allows
    # it) makes the residual zero; rejections must then come from p without the draft.
    logits = torch.tensor([p.log().tolist(), [0.0, 0.0, 0.0]])
    q = (p * 2).unsqueeze(0)
    g = gen(3)
    corrected: Counter[int] = Counter()
    for _ in range(3000):
        out = rejection_sample(logits, torch.tensor([1]), q, 1.0, g)
        if out.accepted_count == 0:
            corrected[out.token_ids[0]] += 1
    assert sum(corrected.values()) > 1000
    assert_matches(counts_to_freq(corrected, 3), [0.2, 0.0, 0.5])


def test_temperature_zero_is_argmax_and_deterministic() -> None:
    logits = torch.tensor(
        [[0.0, 3.0, 1.0, 0.0], [2.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 5.0], [1.0, 0, 0, 0]]
    )
    q = torch.full((3, 4), 0.25)
    for draft_probs in (None, q):
        for seed in range(5):
            out = rejection_sample(logits, torch.tensor([1, 0, 2]), draft_probs, 0.0, gen(seed))
            assert (out.accepted_count, out.token_ids) == (2, [1, 0, 3])
            out = rejection_sample(logits, torch.tensor([2, 0, 2]), draft_probs, 0.0, gen(seed))
            assert (out.accepted_count, out.token_ids) == (0, [1])
            out = rejection_sample(logits, torch.tensor([1, 0, 3]), draft_probs, 0.0, gen(seed))
            assert (out.accepted_count, out.token_ids) == (3, [1, 0, 3, 0])


def test_temperature_scales_p() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])
    g = gen(4)
    # p(1) at T=1 is 0.75; at T=0.5 it is 9/10
    accepted = sum(
        rejection_sample(logits, torch.tensor([1]), None, 0.5, g).accepted_count
        for _ in range(4000)
    )
    assert abs(accepted / 4000 - 0.9) < 4 * math.sqrt(0.09 / 4000)


def test_seeded_determinism() -> None:
    torch.manual_seed(0)
    logits = torch.randn(9, 50)
    drafts = torch.randint(0, 50, (8,))
    q = torch.softmax(torch.randn(8, 50), -1)
    for draft_probs in (None, q):
        runs = []
        for _ in range(2):
            g = gen(1234)
            runs.append([rejection_sample(logits, drafts, draft_probs, 1.0, g) for _ in range(30)])
        assert runs[0] == runs[1]
        other = gen(99)
        assert [rejection_sample(logits, drafts, draft_probs, 1.0, other) for _ in range(30)] != (
            runs[0]
        )


def _first_token_counts(p: list[float], q: list[float], n: int, seed: int) -> tuple[list[int], int]:
    """Draw d ~ q, verify it against p; count the first emitted token (and acceptances)."""
    vocab = len(p)
    logits = torch.tensor([logits_of(p), [0.0] * vocab])
    q_t = torch.tensor([q])
    g = gen(seed)
    drafts = torch.multinomial(q_t[0], n, replacement=True, generator=gen(seed + 1))
    counts = [0] * vocab
    accepted = 0
    for d in drafts.tolist():
        out = rejection_sample(logits, torch.tensor([d]), q_t, 1.0, g)
        counts[out.token_ids[0]] += 1
        accepted += out.accepted_count
    return counts, accepted


P_TARGET = [0.5, 0.3, 0.15, 0.05, 0.0]
Q_DRAFT = [0.1, 0.2, 0.3, 0.2, 0.2]


def test_first_token_marginal_equals_p_for_sampled_q() -> None:
    counts, accepted = _first_token_counts(P_TARGET, Q_DRAFT, 6000, seed=5)
    assert_matches(counts, P_TARGET)
    # expected acceptance = sum_x min(p(x), q(x))
    expected = sum(min(a, b) for a, b in zip(P_TARGET, Q_DRAFT, strict=True))
    assert abs(accepted / 6000 - expected) < 4 * math.sqrt(expected * (1 - expected) / 6000)


def test_marginal_test_has_power_against_a_wrong_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: resampling from p (instead of the residual) after a rejection is biased
    towards the draft distribution's gaps, and the same chi-square test must catch it."""
    monkeypatch.setattr(sampling, "residual_distribution", lambda p, q, d: p)
    counts, _ = _first_token_counts(P_TARGET, Q_DRAFT, 6000, seed=5)
    with pytest.raises(AssertionError):
        assert_matches(counts, P_TARGET)


def test_sample_index_follows_weights_and_skips_zeros() -> None:
    weights = torch.tensor([0.0, 2.0, 0.0, 1.0, 1.0, 0.0])  # unnormalised, zeros at both ends
    g = gen(6)
    counts = [0] * 6
    for _ in range(4000):
        counts[sampling.sample_index(weights, g)] += 1
    assert_matches(counts, [0.0, 0.5, 0.0, 0.25, 0.25, 0.0])
