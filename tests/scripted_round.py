"""A round loop with scripted parts, for tests of the coordinator's bookkeeping: a verifier
that emits a fixed token sequence (the "model's" output) and accepts exactly the draft tokens
that match it, as greedy verification does, and drafters that know that sequence (or fail)."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.generation import GenerationRequest, GenerationResult, StreamChunk
from gateway.rounds.coordinator import Coordinator
from speculant.config import DraftParams
from speculant.types import DraftProposal, ModelInfo, VerifyResult

EOS = 2
STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside."


class ScriptedVerifier:
    """Emits `script` token by token; accepts the longest matching draft prefix."""

    def __init__(self, script: list[int], max_context_length: int = 512) -> None:
        self.script = script
        self.position = 0  # tokens of the script emitted so far
        self.released: list[str] = []
        self.verify_calls: list[int] = []  # draft length of each Verify
        self.info = ModelInfo("scripted", "t", "fp", 512, [EOS], max_context_length, "cpu", "f32")

    def start(self, session_id, prompt_ids, options) -> VerifyResult:
        self.position = 1
        return VerifyResult(0, [self.script[0]])

    def verify(
        self, session_id, draft_ids, draft_distributions=None, draft_parents=None
    ) -> VerifyResult:
        self.verify_calls.append(len(draft_ids))
        start = self.position
        accepted = 0
        while accepted < len(draft_ids) and draft_ids[accepted] == self.script[start + accepted]:
            accepted += 1
        self.position = start + accepted + 1
        return VerifyResult(accepted, self.script[start : self.position])

    def release(self, session_id) -> bool:
        self.released.append(session_id)
        return True


class OracleDrafter:
    """Drafts the script's next tokens; with wrong_at=i, draft position i is always wrong."""

    def __init__(self, verifier: ScriptedVerifier, wrong_at: int | None = None) -> None:
        self.verifier, self.wrong_at = verifier, wrong_at
        self.contexts: list[list[int]] = []

    def propose(self, context_ids: Sequence[int], params: DraftParams, seed=None):
        self.contexts.append(list(context_ids))
        start = self.verifier.position
        drafts = list(self.verifier.script[start : start + params.k])
        if self.wrong_at is not None and len(drafts) > self.wrong_at:
            drafts[self.wrong_at] = (drafts[self.wrong_at] + 1) % 512
        return DraftProposal(token_ids=drafts, distributions=[], matched_orders=[1] * len(drafts))


class FailingDrafter:
    def propose(self, context_ids, params, seed=None):
        raise ConnectionError("draft service down")


def setup(tokenizer, *, wrong_at=None, failing=False, max_context_length=512, text=STORY):
    prompt = tokenizer("Hello").input_ids
    script = [*tokenizer(text, add_special_tokens=False).input_ids, EOS]
    verifier = ScriptedVerifier(script, max_context_length)
    drafter = FailingDrafter() if failing else OracleDrafter(verifier, wrong_at)
    coordinator = Coordinator(drafter, verifier, tokenizer, draft_context_window=5)
    return coordinator, verifier, drafter, prompt, script


def run(coordinator, prompt, **kwargs) -> tuple[list[StreamChunk], GenerationResult]:
    items = list(coordinator.stream(GenerationRequest(prompt_ids=prompt, **kwargs)))
    assert isinstance(items[-1], GenerationResult)
    assert all(isinstance(i, StreamChunk) for i in items[:-1])
    return items[:-1], items[-1]
