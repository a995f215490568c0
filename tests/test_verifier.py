"""The in-process verifier (LocalVerifier) on the real stories260K model.

Greedy exactness against Hugging Face ``generate(do_sample=False)``, sessions (TTL, cap,
release), context limits, validation, seeded determinism, and model-loading errors.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
import torch

from speculant.config import VerifierConfig
from speculant.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
)
from speculant.tokenizer import load_tokenizer, tokenizer_fingerprint
from speculant.types import SparseDistribution
from tests.assets import STORIES_MODEL, load_dev_prompts
from tests.fixtures.models import first_token, hf_greedy
from verifier_service.model import LoadedModel
from verifier_service.model_loading import ModelLoadError
from verifier_service.verifier import LocalVerifier

N_PROMPTS = 4
N_TOKENS = 64


@pytest.fixture
def verifier(loaded: LoadedModel):
    v = LocalVerifier(VerifierConfig(model_name=str(STORIES_MODEL)), model=loaded)
    yield v
    v.close()


@pytest.fixture(scope="module")
def references(loaded: LoadedModel) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, HF greedy continuation of N_TOKENS) for a few dev prompts."""
    refs = []
    for text in load_dev_prompts(N_PROMPTS):
        ids = loaded.tokenizer(text).input_ids
        refs.append((ids, hf_greedy(loaded, ids, N_TOKENS)))
    return refs


def speculative_greedy(
    verifier: LocalVerifier,
    session_id: str,
    prompt: list[int],
    reference: list[int],
    n: int,
    rng: random.Random,
) -> list[int]:
    """Greedy decoding with arbitrary drafts: correct prefixes of random length + junk."""
    out = [first_token(verifier, session_id, prompt, temperature=0.0)]
    while len(out) < n:
        good = reference[len(out) : len(out) + rng.randint(0, 6)]
        junk = [rng.randrange(verifier.info.vocab_size) for _ in range(rng.randint(0, 3))]
        result = verifier.verify(session_id, good + junk)
        assert (
            result.accepted_count >= len(good)
            or good[result.accepted_count] != (result.token_ids[-1])
        )
        assert len(result.token_ids) == result.accepted_count + 1
        out += result.token_ids
    return out[:n]


def test_greedy_true_continuation_is_fully_accepted(verifier, references) -> None:
    for i, (prompt, ref) in enumerate(references):
        assert first_token(verifier, f"s{i}", prompt, temperature=0) == ref[0]
        result = verifier.verify(f"s{i}", ref[1:9])
        assert result.accepted_count == 8
        assert result.token_ids == ref[1:10]  # 8 accepted + the bonus token
        result = verifier.verify(f"s{i}", ref[10:14])
        assert result.token_ids == ref[10:15]


def test_greedy_wrong_draft_emits_hf_next_token(verifier, references) -> None:
    for i, (prompt, ref) in enumerate(references):
        first_token(verifier, f"w{i}", prompt, temperature=0)
        wrong = (ref[1] + 1) % verifier.info.vocab_size
        result = verifier.verify(f"w{i}", [wrong, ref[2], ref[3]])
        assert result.accepted_count == 0
        assert result.token_ids == [ref[1]]
        # the cache was rolled back: continuing with correct drafts still matches HF
        result = verifier.verify(f"w{i}", ref[2:6])
        assert result.token_ids == ref[2:7]


def test_greedy_loop_with_arbitrary_drafts_matches_hf(verifier, references) -> None:
    rng = random.Random(0)
    for i, (prompt, ref) in enumerate(references):
        out = speculative_greedy(verifier, f"g{i}", prompt, ref, N_TOKENS, rng)
        assert out == ref, f"prompt {i}"
    stats = verifier.stats()
    assert stats.forward_passes < N_PROMPTS * N_TOKENS  # parallel verification
    assert stats.accepted_tokens > 0


def test_greedy_sessions_in_parallel_threads(verifier, references) -> None:
    results: dict[int, list[int]] = {}

    def run(i: int) -> None:
        prompt, ref = references[i]
        results[i] = speculative_greedy(verifier, f"t{i}", prompt, ref, 40, random.Random(i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(references))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (_, ref) in enumerate(references):
        assert results[i] == ref[:40]


def test_greedy_with_sampled_q_matches_hf(verifier, references) -> None:
    """At temperature 0, drafts with a q are accepted iff they are the argmax."""
    prompt, ref = references[0]
    first_token(verifier, "q", prompt, temperature=0)
    q = [SparseDistribution.point_mass(t) for t in ref[1:4]]
    q[1] = SparseDistribution(torch.tensor([ref[2], 7]).numpy(), torch.tensor([0.5, 0.5]).numpy())
    result = verifier.verify("q", ref[1:4], q)
    assert result.token_ids == ref[1:5]


@pytest.mark.slow
def test_greedy_all_dev_prompts_128_tokens(verifier, loaded) -> None:
    rng = random.Random(1)
    for i, text in enumerate(load_dev_prompts()):
        ids = loaded.tokenizer(text).input_ids
        ref = hf_greedy(loaded, ids, 128)
        assert speculative_greedy(verifier, f"all{i}", ids, ref, 128, rng) == ref, text
        verifier.release(f"all{i}")


def test_model_info(verifier) -> None:
    info = verifier.info
    assert info.model_name == str(STORIES_MODEL)
    assert info.tokenizer_name == str(STORIES_MODEL)
    expected = tokenizer_fingerprint(load_tokenizer(str(STORIES_MODEL)))
    assert info.tokenizer_fingerprint == expected
    assert (info.vocab_size, info.eos_token_ids, info.max_context_length) == (512, [2], 512)
    assert (info.device, info.dtype) == ("cpu", "float32")


def test_seeded_determinism(verifier, references) -> None:
    prompt, ref = references[1]
    drafts = [ref[1:5], ref[3:9], [5, 6, 7]]

    def run(seed: int, sid: str) -> list[list[int]]:
        out = [[first_token(verifier, sid, prompt, temperature=1.0, seed=seed)]]
        out += [verifier.verify(sid, d).token_ids for d in drafts * 3]
        verifier.release(sid)
        return out

    assert run(7, "a") == run(7, "b")
    assert run(7, "a") != run(8, "b")


def test_context_limit_truncates_drafts(verifier, loaded) -> None:
    max_ctx = verifier.info.max_context_length
    prompt = [1] + [300] * (max_ctx - 3)  # length max_ctx - 2
    first = first_token(verifier, "c", prompt, temperature=0)
    ref = hf_greedy(loaded, prompt, 2)
    assert first == ref[0]
    before = verifier.stats().draft_tokens
    result = verifier.verify("c", [ref[1], 5, 6, 7])  # only 1 draft fits
    assert verifier.stats().draft_tokens - before == 1
    assert result.accepted_count == 1
    assert len(result.token_ids) == 2
    with pytest.raises(OutOfRangeError):
        verifier.verify("c", [1])


def test_prompt_validation(verifier) -> None:
    max_ctx = verifier.info.max_context_length
    cases = [
        ([], "prompt_token_ids"),
        ([1, -1], "prompt_token_ids[1]"),
        ([1, 512], "prompt_token_ids[1]"),
        ([1] * max_ctx, "prompt_token_ids"),
    ]
    for prompt, field in cases:
        with pytest.raises(InvalidArgumentError) as err:
            first_token(verifier, "v", prompt)
        assert err.value.field == field
    for temperature in (-1.0, float("nan"), float("inf")):
        with pytest.raises(InvalidArgumentError, match="temperature"):
            first_token(verifier, "v", [1, 2], temperature=temperature)
    with pytest.raises(InvalidArgumentError, match="session_id"):
        first_token(verifier, "", [1, 2])
    assert verifier.stats().live_sessions == 0


def test_verify_validation(verifier) -> None:
    first_token(verifier, "v", [1, 400, 300], temperature=1.0, seed=0)

    def q(ids: list[int], probs: list[float]) -> SparseDistribution:
        return SparseDistribution(torch.tensor(ids).numpy(), torch.tensor(probs).numpy())

    cases = [
        (([-3], None), "draft_token_ids[0]"),
        (([5, 512], None), "draft_token_ids[1]"),
        (([5, 6], [q([5], [1.0])]), "draft_distributions"),
        (([5], [q([5, 6], [1.0])]), "draft_distributions[0]"),
        (([5], [q([5, 600], [0.5, 0.5])]), "draft_distributions[0].token_ids"),
        (([5], [q([5, 6], [0.5, 0.4])]), "draft_distributions[0].probs"),
        (([5], [q([5, 6], [1.5, -0.5])]), "draft_distributions[0].probs"),
        (([5], [q([5, 6], [float("nan"), 1.0])]), "draft_distributions[0].probs"),
        (([5], [q([6, 7], [0.5, 0.5])]), "draft_distributions[0]"),  # q(d) = 0
    ]
    for (drafts, dists), field in cases:
        with pytest.raises(InvalidArgumentError) as err:
            verifier.verify("v", drafts, dists)
        assert err.value.field == field, (drafts, dists)
    # the session is intact after bad requests
    result = verifier.verify("v", [5, 6], [q([5, 6], [0.5, 0.5]), q([6], [1.0])])
    assert len(result.token_ids) == result.accepted_count + 1
    with pytest.raises(NotFoundError):
        verifier.verify("nope", [1])


def test_release_and_stats(verifier) -> None:
    first_token(verifier, "r1", [1, 400], seed=1)
    first_token(verifier, "r2", [1, 400], seed=1)
    verifier.verify("r1", [5, 6])
    stats = verifier.stats()
    assert (stats.live_sessions, stats.sessions_created, stats.forward_passes) == (2, 2, 3)
    assert stats.draft_tokens == 2
    assert verifier.release("r1") is True
    assert verifier.release("r1") is False
    with pytest.raises(NotFoundError):
        verifier.verify("r1", [])
    stats = verifier.stats()
    assert (stats.live_sessions, stats.sessions_released) == (1, 1)


def test_max_sessions_cap(loaded) -> None:
    config = VerifierConfig(model_name=str(STORIES_MODEL), max_sessions=2)
    v = LocalVerifier(config, model=loaded)
    try:
        first_token(v, "a", [1, 2])
        first_token(v, "b", [1, 2])
        with pytest.raises(ResourceExhaustedError):
            first_token(v, "c", [1, 2])
        with pytest.raises(AlreadyExistsError):  # a live session is never replaced
            first_token(v, "a", [1, 3])
        v.release("a")
        first_token(v, "c", [1, 2])
        assert v.stats().live_sessions == 2
    finally:
        v.close()


def test_idle_sessions_expire_without_further_calls(loaded) -> None:
    config = VerifierConfig(model_name=str(STORIES_MODEL), session_ttl_s=0.3)
    v = LocalVerifier(config, model=loaded, sweep_interval_s=0.05)
    try:
        first_token(v, "old", [1, 2, 3])
        first_token(v, "busy", [1, 2, 3])
        with v.sessions.use("old") as session:  # the session object, to see its cache freed
            pass
        for _ in range(6):  # keep "busy" in use while "old" idles
            time.sleep(0.1)
            v.verify("busy", [4])
        deadline = time.monotonic() + 5
        while v.sessions.live() > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session.cache is None  # the KV cache was freed by the sweeper
        assert v.stats().sessions_expired == 1
        assert v.stats().live_sessions == 1
        with pytest.raises(NotFoundError):
            v.verify("old", [4])
        v.verify("busy", [4])
    finally:
        v.close()


def test_missing_model_folder() -> None:
    with pytest.raises(ModelLoadError, match="does not exist"):
        LoadedModel.load(VerifierConfig(model_name="/nonexistent/speculant-model"))


def test_hub_name_offline_gives_clear_error(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelLoadError) as err:
        LoadedModel.load(
            VerifierConfig(model_name="speculant-test/no-such-model", download_mode="offline")
        )
    message = str(err.value)
    assert "speculant-test/no-such-model" in message
    assert "offline" in message
    assert "\n" not in message


@pytest.mark.slow
def test_sampling_joint_of_first_two_tokens_matches_model(verifier, loaded) -> None:
    """Prefill samples t1 from p1; Verify of a draft d ~ q emits t2 ~ p2(. | t1), exactly.

    Checked by chi-square on (t1, t2) pairs against probabilities computed from the model
    (cells with small expected counts pooled), at temperature 0.7 with a mismatched q.
    """
    from collections import Counter

    from scipy.stats import chisquare

    temperature, runs = 0.7, 3000
    prompt = loaded.tokenizer("Once upon a time, there was a").input_ids
    with torch.inference_mode():
        logits1 = loaded.model(torch.tensor([prompt])).logits[0, -1]
    p1 = torch.softmax(logits1 / temperature, -1)
    # q: a flattened guess of the second token after the likeliest first one (top 5)
    with torch.inference_mode():
        top = int(p1.argmax())
        guess = torch.softmax(loaded.model(torch.tensor([[*prompt, top]])).logits[0, -1] / 2, -1)
    q_probs, q_ids = guess.topk(5)
    q = SparseDistribution(q_ids.numpy(), (q_probs / q_probs.sum()).double().numpy())
    draw = torch.Generator().manual_seed(123)
    pairs: Counter[tuple[int, int]] = Counter()
    for seed in range(runs):
        t1 = first_token(verifier, "s", prompt, temperature=temperature, seed=seed)
        d = int(q_ids[torch.multinomial(torch.from_numpy(q.probs), 1, generator=draw)])
        pairs[(t1, verifier.verify("s", [d], [q]).token_ids[0])] += 1
    expected: dict[tuple[int, int], float] = {}
    for t1 in {a for a, _ in pairs} | {int(t) for t in p1.topk(3).indices}:
        with torch.inference_mode():
            logits2 = loaded.model(torch.tensor([[*prompt, t1]])).logits[0, -1]
        p2 = torch.softmax(logits2 / temperature, -1)
        for t2 in range(p2.shape[0]):
            expected[(t1, t2)] = float(p1[t1] * p2[t2]) * runs
    big = [cell for cell, e in expected.items() if e >= 5]
    observed = [pairs.get(cell, 0) for cell in big]
    exp = [expected[cell] for cell in big]
    observed.append(runs - sum(observed))
    exp.append(runs - sum(exp))
    assert len(big) >= 5
    result = chisquare(observed, exp)
    assert result.pvalue > 1e-3, result
