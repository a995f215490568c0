"""The round loop of speculative decoding, shared by the embedded mode and the gateway service.

One request:
1. *prefill*: the verifier runs the prompt and samples the first token (round 1);
2. each further round: the drafter proposes up to k draft tokens continuing the context, the
   verifier scores them all in ONE forward pass and returns the accepted drafts plus one
   corrected or bonus token (see speculant.types for the terms);
3. tokens are checked one by one against EOS, stop strings, max_tokens and the context length,
   and never emitted past them.

With ``draft.draft_size`` "cost" (the default) each round's draft is sized by the verifier's
cost profile and calibrated acceptance (:mod:`gateway.rounds.draft_sizing`): the drafter is asked
for a budget of nodes, and only the best-first part of its draft that pays is verified (possibly
nothing: then the round is a plain decoding step). With "fixed" every drafted token is
verified. A constrained request's drafts know its grammar
(:mod:`gateway.rounds.constrained`). Drafts are only an optimisation: if the drafter fails, the
round goes on with an empty draft and the output is unchanged.

Each Verify round is timed by a :class:`RoundClock`, its parts kept in the generation's stats
(:class:`gateway.generation.RoundTimes`, which names the parts).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from transformers import PreTrainedTokenizerBase

from gateway.generation import (
    GenerationRequest,
    GenerationResult,
    GenerationStats,
    StreamChunk,
)
from gateway.interfaces import DraftSource, TargetVerifier
from gateway.rounds.constrained import ConstrainedDrafts
from gateway.rounds.draft_sizing import RequestSizer, SizingModel
from gateway.rounds.output import OutputBuffer
from speculant.config import DraftParams
from speculant.cost_profile import CostProfile, verify_cost_profile
from speculant.errors import OutOfRangeError
from speculant.grammar import grammars_for
from speculant.types import DraftProposal, VerifyResult

log = logging.getLogger(__name__)

# Learning from a finished generation: called with its tokens, the prompt's then the output's.
Learn = Callable[[Sequence[int]], object]

T = TypeVar("T")


def _draft_seed(seed: int | None, round_index: int) -> int | None:
    """A distinct, reproducible drafter seed per round of a seeded request."""
    return None if seed is None else (seed * 1_000_003 + round_index) % 2**63


class RoundClock:
    """Times one round: the calls charged to the draft call, the sizer or the verify call, and
    the work the backends report doing inside them."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.draft_call = 0.0  # waiting for draft calls (the drafter's work included)
        self.sizer = 0.0
        self.verify_call = 0.0  # the Verify call (the forward included)
        self.draft = 0.0  # the drafter's own seconds, as it reports them
        self.forward = 0.0  # the verifier's own seconds, as it reports them

    def timed(self, part: str, work: Callable[..., T], *args: object) -> T:
        """work(*args), its wall seconds added to `part` (draft_call, sizer or verify_call)."""
        t0 = time.perf_counter()
        try:
            return work(*args)
        finally:
            setattr(self, part, getattr(self, part) + time.perf_counter() - t0)

    def parts(self) -> tuple[float, ...]:
        """The round now: its wall seconds, then each part's (in gateway.generation.FIELDS'
        order). A backend's own seconds count at most its call's, so no part is negative and
        they add up to the round."""
        wall = time.perf_counter() - self.started
        draft = min(self.draft, self.draft_call)
        forward = min(self.forward, self.verify_call)
        gateway = max(0.0, wall - self.draft_call - self.sizer - self.verify_call)
        return (
            wall,
            draft,
            self.draft_call - draft,
            self.sizer,
            forward,
            self.verify_call - forward,
            gateway,
        )


@dataclass
class _Run:
    """One generation's state across its rounds."""

    request: GenerationRequest
    session_id: str
    stats: GenerationStats
    output: OutputBuffer
    sizer: RequestSizer | None
    constrained: ConstrainedDrafts | None  # with a constraint: its drafting
    drafter: DraftSource  # this request's (bound to its graph and tenant by the engine)
    learn: Learn | None  # gets the finished generation's tokens
    prefilled: bool = False  # the verifier holds a session to release
    context: list[int] = field(default_factory=list)  # prompt and output so far


class Coordinator:
    """Runs speculative decoding rounds between a drafter and a verifier."""

    def __init__(
        self,
        drafter: DraftSource,
        verifier: TargetVerifier,
        tokenizer: PreTrainedTokenizerBase,
        *,
        draft_context_window: int = 16,
        learn: Learn | None = None,
        verify_cost: CostProfile | None = None,
        constrained_drafts: bool = True,
    ) -> None:
        """draft_context_window: how many trailing tokens the drafter sees (>= its max order);
        with a request's draft.overlay_weight > 0 it sees the whole context instead.

        verify_cost: the cost profile cost-aware draft sizes use (gateway.rounds.draft_sizing; the
        coordinator adds what its Verify calls cost beyond it, as it measures them); None: the
        verifier's profile as its info reports it (flat when it reports none).

        learn: called with each finished generation's tokens (prompt and output), so that the
        drafter learns from what it served (best effort and quick: it must not wait for the
        network; None: off).

        constrained_drafts: drafts know a request's constraint (gateway.rounds.constrained);
        False: it only masks what the verifier emits (with no drafter: plain constrained
        decoding, one token per forward).
        """
        self.drafter = drafter
        self.learn = learn
        self.verifier = verifier
        self.tokenizer = tokenizer
        self.draft_context_window = draft_context_window
        self.constrained_drafts = constrained_drafts
        info = verifier.info
        self.eos_token_ids = set(info.eos_token_ids)
        self.max_context_length = info.max_context_length
        self.vocab_size = info.vocab_size
        self._profile = verify_cost or verify_cost_profile("measured", info)
        # what sizing learns, per graph (its acceptance and drafting costs are the graph's)
        self._sizing: dict[str, SizingModel] = {"": SizingModel(self._profile)}

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
        drafter: DraftSource | None = None,
        learn: Learn | None = None,
        graph: str = "",
    ) -> Iterator[StreamChunk | GenerationResult]:
        """Yield StreamChunks as tokens are accepted, then one GenerationResult.

        cancelled: polled between rounds; when it returns True the rounds stop and the
        verifier session is released. drafter, learn: this request's (None: the
        coordinator's), e.g. a draft tier bound to the request's graph and tenant. graph: the
        graph it drafts from, whose requests size drafts together ("": the default).
        """
        request.validate()
        if len(request.prompt_ids) >= self.max_context_length:
            raise OutOfRangeError(
                f"prompt: {len(request.prompt_ids)} tokens do not fit the model's context of "
                f"{self.max_context_length} tokens (leave room for at least one new token)"
            )
        started = time.perf_counter()
        run = _Run(
            request=request,
            session_id=uuid.uuid4().hex,
            stats=GenerationStats(prompt_tokens=len(request.prompt_ids)),
            output=OutputBuffer(
                self.tokenizer, request, self.eos_token_ids, self.max_context_length
            ),
            sizer=self._sizer(request.draft, graph),
            constrained=self._constrained(request),  # compiled before any verifier work
            drafter=drafter or self.drafter,
            learn=learn or self.learn,
        )
        try:
            if run.output.finish_reason is None:
                self._prefill(run)
                yield run.output.take_chunk()
            run.context = list(request.prompt_ids) + run.output.token_ids
            while run.output.finish_reason is None:
                clock = RoundClock()  # the poll, the round and its chunk
                if cancelled is not None and cancelled():
                    log.info("generation cancelled after %d tokens", len(run.output.token_ids))
                    return
                self._round(run, clock)
                chunk = run.output.take_chunk()
                run.stats.round_times.add(clock.parts())
                yield chunk
            yield from self._finish(run, started)
        finally:
            if run.prefilled:
                self._release(run.session_id)

    def _prefill(self, run: _Run) -> None:
        """Round 1: the verifier runs the prompt and samples the first token."""
        request = run.request
        t0 = time.perf_counter()
        first = self.verifier.start(run.session_id, request.prompt_ids, request.session_options)
        run.prefilled = True
        run.stats.verify_seconds += time.perf_counter() - t0
        run.stats.rounds += 1
        run.output.add(first.token_ids, first.logprobs)
        if run.constrained is not None:
            run.constrained.advance(first.token_ids)

    def _round(self, run: _Run, clock: RoundClock) -> None:
        """One draft-and-verify round: plan, draft, cut, verify, then take the tokens (its
        calls timed on the clock)."""
        request, stats, sizer = run.request, run.stats, run.sizer
        round_started = time.perf_counter()
        depth = run.output.remaining - 1  # draft positions that can still be emitted
        forced = run.constrained.forced(depth) if run.constrained is not None else ([], [])
        certain = forced[0]  # tokens the target emits for certain: the drafter goes on after them
        k = min(request.draft.k, depth - len(certain))
        params = request.draft
        if sizer is not None:  # this round's budget (None: no draft)
            planned = clock.timed("sizer", sizer.plan, params, k)
            params, k = (params, 0) if planned is None else (planned, planned.k)
        context = run.context + certain if certain else run.context
        drafted = self._draft(run, context, params, k, clock)  # k = 0: no draft
        if run.constrained is not None:

            def extend(tokens: list[int]) -> DraftProposal:  # the drafter after context + tokens
                return self._draft(run, run.context + tokens, params, k, clock)

            limits = depth, max(request.draft.tree_nodes, request.draft.k)  # the request's
            sampled = params.strategy == "sampling"
            drafted = run.constrained.assemble(
                forced, drafted, limits, sampled, extend if k else None
            )
        draft_s = time.perf_counter() - round_started
        proposal = drafted if sizer is None else clock.timed("sizer", sizer.cut, drafted, draft_s)
        stats.unverified_draft_tokens += len(drafted.token_ids) - len(proposal.token_ids)
        stats.rounds_without_draft += not proposal.token_ids
        result, verify_s = self._verify(run, proposal)
        clock.verify_call, clock.forward = verify_s, result.seconds
        stats.draft_seconds += draft_s
        stats.verify_seconds += verify_s
        start = self._take(run, proposal, result)
        if sizer is not None:
            timings = (draft_s, verify_s, time.perf_counter() - round_started)
            observed = drafted if k > 0 else None  # None: the drafter was not asked
            clock.timed(
                "sizer", sizer.observe, observed, proposal, result, start, run.context, timings
            )

    def _verify(self, run: _Run, proposal: DraftProposal) -> tuple[VerifyResult, float]:
        """The verifier's result for the proposal, and its seconds."""
        t0 = time.perf_counter()
        sampled = run.request.draft.strategy == "sampling"
        dists = proposal.distributions if sampled and proposal.token_ids else None
        result = self.verifier.verify(
            run.session_id, proposal.token_ids, dists, proposal.parents or None
        )
        return result, time.perf_counter() - t0

    def _take(self, run: _Run, proposal: DraftProposal, result: VerifyResult) -> int:
        """Count the round and take its tokens into the output and context; returns the
        context length the draft continued."""
        stats = run.stats
        positions = max(proposal.depths(), default=-1) + 1  # a chain's length, a tree's depth
        stats.record_round(
            len(proposal.token_ids),
            result.accepted_count,
            proposal.accepted_sources(result),
            positions,
        )
        before, start = len(run.output.token_ids), len(run.context)
        run.output.add(result.token_ids, result.logprobs)
        run.context.extend(run.output.token_ids[before:])
        if run.constrained is not None and run.output.finish_reason is None:
            run.constrained.advance(result.token_ids)
        return start

    def _finish(self, run: _Run, started: float) -> Iterator[StreamChunk | GenerationResult]:
        """The end of a generation: release the session, the last chunk, learning, the
        result."""
        if run.sizer is not None:
            run.sizer.finish()
        output, stats = run.output, run.stats
        output.finish()
        if run.prefilled:
            run.prefilled = False
            self._release(run.session_id)
        stats.generated_tokens = len(output.token_ids)
        stats.total_seconds = time.perf_counter() - started
        final_chunk = output.take_chunk()
        if final_chunk.token_ids or final_chunk.text_delta:
            yield final_chunk
        self._learn(run.learn, run.request.prompt_ids, output.token_ids)
        yield GenerationResult(
            output.text, output.token_ids, output.finish_reason, stats, output.logprobs
        )

    def _constrained(self, request: GenerationRequest) -> ConstrainedDrafts | None:
        """A constrained request's drafting (InvalidArgumentError naming the constraint's field
        when it does not compile)."""
        if request.constraint is None or not self.constrained_drafts:
            return None
        grammars = grammars_for(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return ConstrainedDrafts(grammars.matcher(request.constraint), request.prompt_ids)

    def _sizer(self, params: DraftParams, graph: str = "") -> RequestSizer | None:
        """The request's cost-aware sizing, learned with the other requests of its graph: None
        with draft_size "fixed", and for sampled drafts (their output for a seed depends on the
        draft, so its size must not depend on timings: seeded requests repeat exactly)."""
        if params.draft_size != "cost" or params.strategy == "sampling":
            return None
        sizing = self._sizing.get(graph)
        if sizing is None:
            sizing = self._sizing.setdefault(graph, SizingModel(self._profile))
        return sizing.for_request(params)

    def _draft(
        self, run: _Run, context: list[int], params: DraftParams, k: int, clock: RoundClock
    ) -> DraftProposal:
        """This round's draft (params, k deep) and its wait and drafter's seconds on the round's
        clock; empty when k is 0 or the drafter failed (a failure is never an error)."""
        if k <= 0:
            return DraftProposal()
        stats = run.stats
        params = params if k == params.k else replace(params, k=k)
        # the overlay reads the whole context; otherwise the graph's orders need only a tail
        window = context if params.overlay_weight > 0 else context[-self.draft_context_window :]
        seed = _draft_seed(run.request.seed, stats.rounds)
        try:
            proposal = clock.timed("draft_call", run.drafter.propose, window, params, seed)
        except Exception as exc:  # drafts are an optimisation: go on without one
            stats.draft_failures += 1
            log.warning("draft failed, continuing with an empty draft: %s", exc)
            return DraftProposal()
        clock.draft += proposal.seconds
        return proposal

    @staticmethod
    def _learn(learn: Learn | None, prompt_ids: list[int], output_ids: list[int]) -> None:
        """Hand a finished generation to learn; a failure is logged, never raised."""
        if learn is None or not output_ids:
            return
        try:
            learn(prompt_ids + output_ids)
        except Exception as exc:  # learning is an optimisation, like drafting
            log.warning("could not learn from the generation: %s", exc)

    def _release(self, session_id: str) -> None:
        try:
            self.verifier.release(session_id)
        except Exception as exc:  # the session expires on the verifier's TTL anyway
            log.warning("could not release verifier session %s: %s", session_id, exc)
