"""Checks of greedy exactness shared by the exactness tests: plain greedy references (Hugging
Face generate), generation of every prompt embedded and over a gateway, and the bounds that show
verification is parallel (fewer verifier forwards, "rounds", than generated tokens)."""

from __future__ import annotations

from gateway.launch.baseline import PlainDecoder
from speculant.config import DraftConfig, GenerationConfig
from speculant.v1 import common_pb2, gateway_pb2
from tests.assets import STORIES_MODEL

MAX_TOKENS = 128  # tokens generated per prompt by generate_embedded and generate_over_gateway


def plain_greedy_outputs(decoder, prompts: list[str], max_tokens: int) -> list[list[int]]:
    """Plain greedy decoding with Hugging Face generate of the decoder's model, per prompt."""
    plain = PlainDecoder.load(str(STORIES_MODEL), decoder.verifier.info.eos_token_ids)
    return [plain.generate(decoder.tokenizer(p).input_ids, max_tokens).token_ids for p in prompts]


# Verification is parallel: clearly fewer verifier forwards than generated tokens. Sampled drafts
# are accepted less often by a greedy (temperature 0) target than argmax drafts, hence two bounds.
# The bounds hold for drafts of a fixed size (draft_size "fixed", or sampled drafts, which are
# never sized): what is drafted and verified then depends on the graph and the prompts alone.
MAX_ROUNDS_PER_TOKEN = {"greedy": 0.6, "sampling": 0.9}


def assert_drafts_served(stats: list) -> None:
    """Drafting worked over the services: at most 1% of rounds went on without a draft. (A round
    whose draft call passes the gateway's 0.25 s timeout goes on with an empty draft, with the
    same output; on a loaded CI machine a rare stall of the in-process servers can cause one.)"""
    failures = sum(s.draft_failures for s in stats)
    rounds = sum(s.rounds for s in stats)
    assert failures <= max(1, rounds // 100), f"{failures} draft failures in {rounds} rounds"


def assert_parallel(rounds: int, tokens: int, strategy: str) -> None:
    """Fewer verifier forwards than tokens, for drafts of a fixed size (see above)."""
    bound = MAX_ROUNDS_PER_TOKEN[strategy]
    assert rounds < bound * tokens, f"{rounds} verifier forwards for {tokens} tokens"


def assert_drafted(stats: list) -> None:
    """Cost-aware sizes (draft_size "cost", the default) drafted: how much of it was verified
    follows measured timings, which a busy test machine inflates until a plain step often pays
    best (its bound on forwards is a benchmark's figure, not a test's), but the rounds drafted
    and probed the drafts."""
    drafted = sum(s.draft_tokens + s.unverified_draft_tokens for s in stats)
    assert drafted > 0, "no round drafted"


def generate_embedded(decoder, prompts, references, draft: DraftConfig) -> tuple[list[int], list]:
    """Greedy (temperature 0) generation of every prompt in process: (indices of the prompts whose
    tokens differ from their reference, the stats of each generation)."""
    generation = GenerationConfig(max_tokens=MAX_TOKENS, temperature=0.0, seed=0)
    mismatches, stats = [], []
    for i, (prompt, expected) in enumerate(zip(prompts, references, strict=True)):
        result = decoder.generate(prompt=prompt, generation_config=generation, draft_config=draft)
        if result.token_ids != expected:
            mismatches.append(i)
        stats.append(result.stats)
    return mismatches, stats


def generate_over_gateway(
    stub, prompts, references, draft: common_pb2.DraftOptions
) -> tuple[list[int], list]:
    """The same through a gateway's Generate: (mismatching prompt indices, stats messages)."""
    mismatches, stats = [], []
    for i, (prompt, expected) in enumerate(zip(prompts, references, strict=True)):
        request = gateway_pb2.GenerateRequest(
            prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0, seed=0, draft=draft
        )
        response = stub.Generate(request, timeout=60)
        if list(response.token_ids) != expected:
            mismatches.append(i)
        stats.append(response.stats)
    return mismatches, stats


def totals(stats: list) -> tuple[int, int]:
    """(verifier forwards, generated tokens) over all generations."""
    return sum(s.rounds for s in stats), sum(s.generated_tokens for s in stats)
