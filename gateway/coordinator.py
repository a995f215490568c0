"""The round loop of speculative decoding, shared by the embedded mode and the gateway service.

One request:
1. *prefill*: the verifier runs the prompt and samples the first token (round 1);
2. each further round: the drafter proposes up to k draft tokens continuing the context, the
   verifier scores them all in ONE forward pass and returns the accepted drafts plus one
   corrected or bonus token (see speculant.types for the terms);
3. tokens are checked one by one against EOS, stop strings, max_tokens and the context length,
   and never emitted past them.

With ``draft.draft_size`` "cost" (the default) each round's draft is sized by the verifier's
cost profile and calibrated acceptance (:mod:`gateway.draft_sizing`): the drafter is asked for a
budget of nodes, and only the best-first part of its draft that pays is verified (possibly
nothing: then the round is a plain decoding step). With "fixed" every drafted token is
verified. With ``draft.adaptive_k`` the draft length of each round follows the request's
acceptance history (:mod:`gateway.adaptive_k`), between 1 and draft.k; otherwise it is draft.k.

Drafts are only an optimisation: if the drafter fails, the round goes on with an empty draft
(the verifier then emits exactly one token) and the output is unchanged.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from transformers import PreTrainedTokenizerBase

from gateway.adaptive_k import next_draft_length
from gateway.detokenizer import IncrementalDetokenizer
from gateway.draft_sizing import RequestSizer, SizingModel
from gateway.interfaces import (
    DraftCall,
    DraftSource,
    GenerationLearner,
    PreparingDraftSource,
    TargetVerifier,
)
from gateway.stats import GenerationStats
from gateway.stopping import FinishReason, find_stop_string, safe_text_length
from speculant.cost_profile import CostProfile, verify_cost_profile
from speculant.errors import InvalidArgumentError, OutOfRangeError
from speculant.types import (
    DraftParams,
    DraftProposal,
    NextRoundDraft,
    SamplingControls,
    TokenLogprobs,
    VerifyResult,
    check_top_logprobs,
)

log = logging.getLogger(__name__)

MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1000  # per stop string


@dataclass(frozen=True)
class GenerationRequest:
    """A tokenized request: what to generate and how to draft."""

    prompt_ids: list[int]
    max_tokens: int = 100
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    draft: DraftParams = field(default_factory=DraftParams)
    # top_k, top_p, min_p and the penalties (see SamplingControls; unset: the model's defaults)
    sampling: SamplingControls = field(default_factory=SamplingControls)
    top_logprobs: int | None = None  # report logprobs with this many alternatives; None: none

    def validate(self) -> GenerationRequest:
        """Raise InvalidArgumentError naming the first bad field."""
        if not self.prompt_ids:
            raise InvalidArgumentError("prompt", "must not be empty")
        if self.max_tokens < 0:
            raise InvalidArgumentError("max_tokens", f"must be >= 0, got {self.max_tokens}")
        if not (self.temperature >= 0 and self.temperature < float("inf")):
            raise InvalidArgumentError(
                "temperature", f"must be a finite number >= 0, got {self.temperature}"
            )
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise InvalidArgumentError("seed", f"must be in 0..2^64-1, got {self.seed}")
        if len(self.stop) > MAX_STOP_STRINGS or any(
            not 0 < len(s) <= MAX_STOP_CHARS for s in self.stop
        ):
            raise InvalidArgumentError(
                "stop",
                f"at most {MAX_STOP_STRINGS} stop strings, none of them empty or longer than "
                f"{MAX_STOP_CHARS} characters",
            )
        self.sampling.validate()
        check_top_logprobs(self.top_logprobs)
        try:
            self.draft.validate()
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"draft.{exc.field}", exc.problem) from exc
        return self


@dataclass
class StreamChunk:
    """Tokens accepted since the last chunk and their text (never a split character)."""

    token_ids: list[int]
    text_delta: str
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked


@dataclass
class GenerationResult:
    """The whole output of one request."""

    text: str
    token_ids: list[int]  # generated tokens only: no prompt, no final EOS
    finish_reason: FinishReason
    stats: GenerationStats
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per token, when asked

    @property
    def acceptance_rate(self) -> float:
        return self.stats.acceptance_rate


def _accepted_sources(proposal: DraftProposal, result: VerifyResult) -> list[str]:
    """The sources of the accepted drafts (a tree's accepted path, or a chain's prefix)."""
    if not proposal.sources:
        return []
    if proposal.parents:
        return [proposal.sources[i] for i in result.accepted_nodes]
    return proposal.sources[: result.accepted_count]


def _draft_seed(seed: int | None, round_index: int) -> int | None:
    """A distinct, reproducible drafter seed per round of a seeded request."""
    return None if seed is None else (seed * 1_000_003 + round_index) % 2**63


class _OutputBuffer:
    """Generated tokens and text, checked token by token against the stop conditions."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        request: GenerationRequest,
        eos_token_ids: set[int],
        max_context_length: int,
    ) -> None:
        self._request = request
        self._eos = eos_token_ids
        self._max_total = max_context_length
        self._detokenizer = IncrementalDetokenizer(tokenizer, request.prompt_ids)
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprobs] = []  # [i]: token i's, when the request asks
        self._text_end: list[int] = []  # [i] = length of the text once token i is decoded
        self.text = ""
        self.finish_reason: FinishReason | None = None
        self._tokens_streamed = 0
        self._text_streamed = 0
        if request.max_tokens == 0:
            self.finish_reason = FinishReason.MAX_TOKENS

    @property
    def remaining(self) -> int:
        """Tokens that may still be emitted."""
        by_context = self._max_total - len(self._request.prompt_ids) - len(self.token_ids)
        return max(0, min(self._request.max_tokens - len(self.token_ids), by_context))

    def add(self, new_tokens: list[int], logprobs: list[TokenLogprobs] | None = None) -> None:
        """Take the verifier's tokens in order (and their logprobs, one per token, when the
        request asks for them), stopping at the first stop condition."""
        stops = list(self._request.stop)
        for index, token in enumerate(new_tokens):
            if self.finish_reason is not None:
                return
            if token in self._eos:
                self.finish_reason = FinishReason.EOS
                return
            previous_length = len(self.text)
            self.token_ids.append(token)
            if logprobs:
                self.logprobs.append(logprobs[index])
            self._detokenizer.add([token])
            self.text = self._detokenizer.text
            self._text_end.append(len(self.text))
            match = find_stop_string(self.text, stops, previous_length)
            if match is not None:
                self._cut_at(match.position)
                self.finish_reason = FinishReason.STOP
            elif len(self.token_ids) >= self._request.max_tokens:
                self.finish_reason = FinishReason.MAX_TOKENS
            elif self.remaining == 0:
                self.finish_reason = FinishReason.CONTEXT_LENGTH

    def _cut_at(self, position: int) -> None:
        """Drop the stop string and everything after it (tokens that reach into it too)."""
        keep = sum(1 for end in self._text_end if end <= position)
        del self.token_ids[keep:]
        del self.logprobs[keep:]
        del self._text_end[keep:]
        self.text = self.text[:position]

    def finish(self) -> None:
        if self.finish_reason != FinishReason.STOP:
            self._detokenizer.flush()
            self.text = self._detokenizer.text

    def take_chunk(self) -> StreamChunk:
        """What can be streamed now: text that no stop string can still cut, and its tokens."""
        if self.finish_reason is None:
            safe = safe_text_length(self.text, list(self._request.stop))
            tokens_end = sum(1 for end in self._text_end if end <= safe)
        else:
            safe, tokens_end = len(self.text), len(self.token_ids)
        chunk = StreamChunk(
            self.token_ids[self._tokens_streamed : tokens_end],
            self.text[self._text_streamed : safe],
            self.logprobs[self._tokens_streamed : tokens_end],
        )
        self._tokens_streamed = max(self._tokens_streamed, tokens_end)
        self._text_streamed = max(self._text_streamed, safe)
        return chunk


class _ImmediateDraftCall:
    """A DraftCall on a plain DraftSource: drafts when asked, prepares nothing."""

    def __init__(
        self, drafter: DraftSource, context: list[int], params: DraftParams, seed: int | None
    ) -> None:
        self._propose = lambda: drafter.propose(context, params, seed)

    def proposal(self) -> DraftProposal:
        return self._propose()

    def next_round(self) -> list[NextRoundDraft]:
        return []

    def discard(self) -> None:
        pass


class Coordinator:
    """Runs speculative decoding rounds between a drafter and a verifier."""

    def __init__(
        self,
        drafter: DraftSource,
        verifier: TargetVerifier,
        tokenizer: PreTrainedTokenizerBase,
        *,
        draft_context_window: int = 16,
        next_round_drafts: int = 0,
        learner: GenerationLearner | None = None,
        verify_cost: CostProfile | None = None,
    ) -> None:
        """draft_context_window: how many trailing tokens the drafter sees (>= its max order);
        with a request's draft.overlay_weight > 0 it sees the whole context instead.

        verify_cost: the cost profile cost-aware draft sizes use (gateway.draft_sizing; the
        coordinator adds what its Verify calls cost beyond it, as it measures them); None: the
        verifier's profile as its info reports it (flat when it reports none).

        next_round_drafts: with a drafter that can prepare them
        (gateway.draft_client.GrpcDraftClient), ask it each round to prepare drafts for this
        many likely outcomes of the verification while the verifier runs; when the outcome is
        one of them, the next round starts without waiting for a draft call. The output is the
        same either way (0 = off).

        learner: gets each finished generation's tokens (prompt and output), so that the
        drafter learns from what it served (gateway.interfaces.GenerationLearner; None: off).
        """
        self.drafter = drafter
        # decided once: a draft service prepares next-round drafts; an in-process drafter not
        self._preparing = drafter if isinstance(drafter, PreparingDraftSource) else None
        self.learner = learner
        self.next_round_drafts = next_round_drafts
        self.verifier = verifier
        self.tokenizer = tokenizer
        self.draft_context_window = draft_context_window
        info = verifier.info
        self.eos_token_ids = set(info.eos_token_ids)
        self.max_context_length = info.max_context_length
        self.vocab_size = info.vocab_size
        self.sizing = SizingModel(verify_cost or verify_cost_profile("measured", info))

    def generate(self, request: GenerationRequest, **kwargs: object) -> GenerationResult:
        """Run the request to completion and return the result."""
        for item in self.stream(request, **kwargs):  # type: ignore[arg-type]
            if isinstance(item, GenerationResult):
                return item
        raise AssertionError("stream ended without a result")

    def stream(
        self,
        request: GenerationRequest,
        *,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[StreamChunk | GenerationResult]:
        """Yield StreamChunks as tokens are accepted, then one GenerationResult.

        cancelled: polled between rounds; when it returns True the rounds stop and the
        verifier session is released.
        """
        request.validate()
        if len(request.prompt_ids) >= self.max_context_length:
            raise OutOfRangeError(
                f"prompt: {len(request.prompt_ids)} tokens do not fit the model's context of "
                f"{self.max_context_length} tokens (leave room for at least one new token)"
            )
        started = time.perf_counter()
        stats = GenerationStats(prompt_tokens=len(request.prompt_ids))
        output = _OutputBuffer(self.tokenizer, request, self.eos_token_ids, self.max_context_length)
        session_id = uuid.uuid4().hex
        prefilled = False
        try:
            if output.finish_reason is None:
                t0 = time.perf_counter()
                first = self.verifier.start(
                    session_id,
                    request.prompt_ids,
                    temperature=request.temperature,
                    controls=request.sampling,
                    seed=request.seed,
                    top_logprobs=request.top_logprobs,
                )
                prefilled = True
                stats.verify_seconds += time.perf_counter() - t0
                stats.rounds += 1
                output.add(first.token_ids, first.logprobs)
                yield output.take_chunk()
            context = list(request.prompt_ids) + output.token_ids
            prepared: dict[tuple[int, int], DraftProposal] = {}  # by (accepted, next token)
            outcome = (-1, -1)  # (accepted drafts, last emitted token) of the last round
            draft_length = request.draft.k  # with draft.adaptive_k: set round by round
            sizer = self._sizer(request.draft)
            while output.finish_reason is None:
                if cancelled is not None and cancelled():
                    log.info("generation cancelled after %d tokens", len(output.token_ids))
                    return
                round_started = time.perf_counter()
                k = min(draft_length, output.remaining - 1)
                params = request.draft
                if sizer is not None:  # this round's budget (None: no draft)
                    planned = sizer.plan(params, k)
                    params, k = (params, 0) if planned is None else (planned, planned.k)
                ready = prepared.get(outcome) if k > 0 else None  # prepared last round?
                call = self._start_draft(context, params, k, request.seed, stats, ready)
                if ready is not None:
                    drafted = ready.truncated(k)  # no waiting for a draft call this round
                    stats.prepared_drafts_used += 1
                else:
                    drafted = self._await_draft(call, stats)  # no call (k = 0): no draft
                draft_s = time.perf_counter() - round_started
                proposal = drafted if sizer is None else sizer.cut(drafted, draft_s)
                stats.unverified_draft_tokens += len(drafted.token_ids) - len(proposal.token_ids)
                stats.rounds_without_draft += not proposal.token_ids
                t0 = time.perf_counter()
                sampled = request.draft.strategy == "sampling"
                try:
                    dists = proposal.distributions if sampled and proposal.token_ids else None
                    result = self.verifier.verify(
                        session_id, proposal.token_ids, dists, proposal.parents or None
                    )
                except BaseException:
                    if call is not None:
                        call.discard()
                    raise
                verify_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                prepared = {
                    (d.accepted_count, d.next_token): d.proposal
                    for d in (call.next_round() if call is not None else ())
                }
                draft_s += time.perf_counter() - t0
                stats.draft_seconds += draft_s
                stats.verify_seconds += verify_s
                outcome = (result.accepted_count, result.token_ids[-1])
                # a chain's length, a tree's depth
                positions = max(proposal.depths(), default=-1) + 1
                stats.record_round(
                    len(proposal.token_ids),
                    result.accepted_count,
                    _accepted_sources(proposal, result),
                    positions,
                )
                if request.draft.adaptive_k and k > 0:
                    draft_length = next_draft_length(
                        k, positions, result.accepted_count, request.draft.k
                    )
                before, start = len(output.token_ids), len(context)
                output.add(result.token_ids, result.logprobs)
                context.extend(output.token_ids[before:])
                if sizer is not None:
                    round_s = time.perf_counter() - round_started
                    timings = (draft_s, verify_s, round_s)
                    sizer.observe(
                        drafted if k > 0 else None, proposal, result, start, context, timings
                    )
                yield output.take_chunk()
            if sizer is not None:
                sizer.finish()
            output.finish()
            if prefilled:
                prefilled = False
                self._release(session_id)
            stats.generated_tokens = len(output.token_ids)
            stats.total_seconds = time.perf_counter() - started
            final_chunk = output.take_chunk()
            if final_chunk.token_ids or final_chunk.text_delta:
                yield final_chunk
            self._learn(request.prompt_ids, output.token_ids)
            yield GenerationResult(
                output.text, output.token_ids, output.finish_reason, stats, output.logprobs
            )
        finally:
            if prefilled:
                self._release(session_id)

    def _sizer(self, params: DraftParams) -> RequestSizer | None:
        """The request's cost-aware sizing: None with draft_size "fixed", and for sampled drafts
        (their output for a seed depends on the draft, so its size must not depend on timings:
        seeded requests repeat exactly)."""
        if params.draft_size != "cost" or params.strategy == "sampling":
            return None
        return self.sizing.for_request(params)

    def _start_draft(
        self,
        context: list[int],
        params: DraftParams,
        k: int,
        request_seed: int | None,
        stats: GenerationStats,
        ready: DraftProposal | None,
    ) -> DraftCall | None:
        """Send this round's draft request (params, k deep); None when k is 0 or sending failed
        (an empty draft).

        With a drafter that prepares drafts (a draft service) and next_round_drafts > 0, the
        request also asks for the next round's drafts, prepared while the verifier runs
        (ready: this round's draft, prepared last round; then only those are asked for).
        """
        if k <= 0:
            return None
        params = params if k == params.k else replace(params, k=k)
        # the overlay reads the whole context; otherwise the graph's orders need only a tail
        window = context if params.overlay_weight > 0 else context[-self.draft_context_window :]
        seed = _draft_seed(request_seed, stats.rounds)
        draft_known = ready is not None
        try:
            # next-round drafts are prepared for a chain's outcomes: not with trees
            prepares = self.next_round_drafts > 0 and not params.drafts_tree
            if prepares and self._preparing is not None:
                next_seed = _draft_seed(request_seed, stats.rounds + 1)
                return self._preparing.start(
                    window, params, seed, self.next_round_drafts, next_seed, draft_known
                )
            if draft_known:
                return None
            return _ImmediateDraftCall(self.drafter, window, params, seed)
        except Exception as exc:  # drafts are an optimisation: go on without one
            stats.draft_failures += 1
            log.warning("draft failed, continuing with an empty draft: %s", exc)
            return None

    @staticmethod
    def _await_draft(call: DraftCall | None, stats: GenerationStats) -> DraftProposal:
        """The call's draft; a failure gives an empty draft, never an error."""
        if call is None:
            return DraftProposal()
        try:
            return call.proposal()
        except Exception as exc:  # drafts are an optimisation: go on without one
            stats.draft_failures += 1
            log.warning("draft failed, continuing with an empty draft: %s", exc)
            return DraftProposal()

    def _learn(self, prompt_ids: list[int], output_ids: list[int]) -> None:
        """Hand a finished generation to the learner; a failure is logged, never raised."""
        if self.learner is None or not output_ids:
            return
        try:
            self.learner.learn(prompt_ids + output_ids)
        except Exception as exc:  # learning is an optimisation, like drafting
            log.warning("could not learn from the generation: %s", exc)

    def _release(self, session_id: str) -> None:
        try:
            self.verifier.release(session_id)
        except Exception as exc:  # the session expires on the verifier's TTL anyway
            log.warning("could not release verifier session %s: %s", session_id, exc)
