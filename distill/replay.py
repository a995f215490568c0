"""Replaying speculative decoding at temperature 0 without the model: drafts against a known
greedy continuation, for ``speculant tune`` (:mod:`distill.tune`) and ``speculant bench
distill``, and what both report alike of their replays.

At temperature 0 the verifier accepts a draft token exactly when it is the model's argmax, so
the output of speculative decoding is the model's greedy continuation whatever is drafted, and
the rounds it takes depend only on the drafts. Given a prompt's greedy continuation (computed
once, e.g. with Hugging Face ``generate``), :func:`simulate` replays the coordinator's rounds
(:mod:`gateway.rounds.coordinator`): each round drafts up to k tokens from the last ``window``
context
tokens, accepts the longest prefix that matches the continuation and emits one more token (the
correction or the bonus). A greedy draft *tree* is replayed the same way: from the root, the
child whose token is the continuation's next token is accepted (siblings are distinct, so at
most one matches) until none does, which is the path the verifier's sample-and-match accepts.
It gives the same rounds, drafted and accepted counts as a real run that verifies every drafted
token (``draft_size`` "fixed": tau under a flat cost profile, the figure that carries to a GPU;
``tests/test_tune.py`` checks it) at the cost of the drafting alone, so many draft settings can
be scored against one set of continuations (:func:`greedy_traces` computes them, for
``speculant tune`` and ``speculant bench distill`` alike). A request's ``draft_size`` "cost"
(verifying only the part of a draft that pays on the verifier's cost profile) is replayed too
when :func:`simulate` is given a :class:`gateway.rounds.draft_sizing.SizingModel`: its Verify calls
then cost what the model's cost profile says (``flat``: every forward the same) and its drafts
what the drafter really took; otherwise :func:`verify_all` gives the params replayed.

Terms: *tau* = generated tokens / verifier forwards (the prefill included); *acceptance* =
accepted / drafted; *wasted* = drafted - accepted. A prompt record's *kind* is its optional
``kind`` field (:mod:`speculant.prompt_records`); its *label* is the group it is counted in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from draft_service.drafting import Drafter
from gateway.rounds.draft_sizing import SizingModel
from speculant.config import DraftParams, SamplingControls
from speculant.errors import InvalidArgumentError
from speculant.prompt_records import PromptRecord, kinds_of
from speculant.types import DraftProposal, VerifyResult


@dataclass(frozen=True)
class GreedyTrace:
    """A prompt and the model's greedy continuation of it (at most max_tokens tokens, no EOS);
    ended_by_eos: the model emitted EOS right after the last token."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]
    ended_by_eos: bool


@dataclass
class SimResult:
    """Totals of replayed generations."""

    tokens: int = 0  # generated tokens (EOS not counted)
    forwards: int = 0  # verifier forward passes (prefill included)
    drafted: int = 0
    accepted: int = 0

    @property
    def tau(self) -> float:
        return self.tokens / self.forwards if self.forwards else 0.0

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def wasted(self) -> int:
        return self.drafted - self.accepted

    def add(self, other: SimResult) -> None:
        self.tokens += other.tokens
        self.forwards += other.forwards
        self.drafted += other.drafted
        self.accepted += other.accepted

    def as_dict(self) -> dict[str, float | int]:
        return {
            "tau": self.tau,
            "acceptance": self.acceptance,
            "tokens": self.tokens,
            "forwards": self.forwards,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "wasted": self.wasted,
        }


def simulate(
    drafter: Drafter,
    params: DraftParams,
    trace: GreedyTrace,
    max_tokens: int,
    window: int,
    max_context_length: int | None = None,
    sizing: SizingModel | None = None,
) -> SimResult:
    """The rounds the coordinator takes for trace at temperature 0 with these greedy drafts,
    chains or trees; window: the context tokens the drafter sees
    (the graph's max order; the whole context with an overlay). sizing: replay draft_size
    "cost" with this model's cost profile (see the module docstring); None: every drafted token
    is verified."""
    if params.strategy != "greedy":
        raise InvalidArgumentError("draft", "the replay covers greedy drafts only")
    sizer = (
        sizing.for_request(params) if sizing is not None and params.draft_size == "cost" else None
    )
    emitted = list(trace.tokens[:max_tokens])
    ends_with_eos = trace.ended_by_eos and len(emitted) == len(trace.tokens)
    total = len(emitted) + (1 if ends_with_eos else 0)  # tokens the verifier emits, EOS too
    limit = max_tokens
    if max_context_length is not None:
        limit = min(limit, max_context_length - len(trace.prompt_ids))
    if max_tokens == 0:
        return SimResult()
    result = SimResult(forwards=1)  # the prefill emits the first token
    if total == 0:
        return result  # the first token was EOS
    done = 1
    context = list(trace.prompt_ids) + emitted[:1]
    while done < total and done < limit:
        k = min(params.k, limit - done - 1)
        ask = params
        if sizer is not None:  # this round's budget (None: no draft)
            planned = sizer.plan(params, k)
            ask, k = (params, 0) if planned is None else (planned, planned.k)
        drafted = _draft(drafter, ask, k, context, window)
        proposal = drafted if sizer is None else sizer.cut(drafted, drafted.seconds)
        path = accepted_nodes(proposal, emitted[done:])
        accepted = len(path)
        result.forwards += 1
        result.drafted += len(proposal.token_ids)
        result.accepted += accepted
        start = len(context)
        context.extend(emitted[done : done + accepted + 1])
        done += accepted + 1
        if sizer is not None:
            assert sizing is not None
            _observe(sizer, sizing.profile, drafted, k, proposal, path, start, context)
    if sizer is not None:
        sizer.finish()
    result.tokens = min(done, len(emitted))
    return result


def _draft(
    drafter: Drafter, params: DraftParams, k: int, context: list[int], window: int
) -> DraftProposal:
    """A round's drafts of k tokens (none for k <= 0) from what the drafter sees of the context:
    its last `window` tokens, or all of it with an overlay."""
    if k <= 0:
        return DraftProposal()
    ask = params if k == params.k else replace(params, k=k)
    tail = context if ask.overlay_weight > 0 else context[-window:]
    return drafter.propose(tail, ask)


def _observe(
    sizer: Any,
    profile: Any,
    drafted: DraftProposal,
    k: int,
    proposal: DraftProposal,
    path: list[int],
    start: int,
    context: list[int],
) -> None:
    """Tell a request's sizer what a replayed round cost: the drafter's seconds for `drafted`
    (asked for k tokens; 0: none drafted) and the Verify of `proposal` (its cut) that the cost
    profile prices; path: the accepted draft nodes."""
    verify_s = profile.cost(len(proposal.token_ids) + 1)
    outcome = VerifyResult(len(path), [], path if proposal.parents else [], [])
    timings = (drafted.seconds, verify_s, drafted.seconds + verify_s)
    sizer.observe(drafted if k > 0 else None, proposal, outcome, start, context, timings)


def accepted_nodes(proposal: DraftProposal, continuation: Sequence[int]) -> list[int]:
    """The indices of the draft tokens the verifier accepts at temperature 0 when the model's
    greedy continuation is `continuation`: the longest chain prefix, or the longest root path
    of a tree, that matches it."""
    tokens = proposal.token_ids
    if not proposal.parents:
        accepted = 0
        limit = min(len(tokens), len(continuation))
        while accepted < limit and tokens[accepted] == continuation[accepted]:
            accepted += 1
        return list(range(accepted))
    path: list[int] = []
    node = -1  # the root (the context)
    while len(path) < len(continuation):
        wanted = continuation[len(path)]
        node = next(
            (
                i
                for i, (token, parent) in enumerate(zip(tokens, proposal.parents, strict=True))
                if parent == node and token == wanted
            ),
            -2,
        )
        if node == -2:
            break
        path.append(node)
    return path


def simulate_all(
    drafter: Drafter,
    params: DraftParams,
    traces: Sequence[GreedyTrace],
    max_tokens: int,
    window: int,
    max_context_length: int | None = None,
    sizing: SizingModel | None = None,
) -> SimResult:
    """The totals of :func:`simulate` over traces (one sizing model for them all, as one
    coordinator serves many requests)."""
    total = SimResult()
    for trace in traces:
        total.add(simulate(drafter, params, trace, max_tokens, window, max_context_length, sizing))
    return total


def verify_all(params: DraftParams) -> DraftParams:
    """params with every drafted token verified (draft_size "fixed"): the rounds
    :func:`simulate` replays."""
    return replace(params, draft_size="fixed")


def greedy_traces(
    model: Any,
    eos_token_ids: Sequence[int],
    prompts: Sequence[Sequence[int]],
    max_tokens: int,
    max_context: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[GreedyTrace]:
    """Each prompt's (token ids) greedy continuation by the model: what speculative decoding
    at temperature 0 outputs, whatever the drafts. One prompt at a time (Hugging Face
    ``generate``, unpadded, as :class:`gateway.launch.baseline.PlainDecoder` decodes), at most
    max_tokens tokens and no further than max_context positions; progress(done, total) after
    each prompt.

    InvalidArgumentError for a prompt that leaves no room for a new token in max_context.
    """
    import torch

    from gateway.launch.baseline import generate_kwargs
    from verifier_service.model_loading import sampling_defaults_of

    # argmax, with the penalties the model's generation_config sets (a repetition_penalty),
    # which the verifier applies to a request that leaves them unset, at temperature 0 too
    greedy = generate_kwargs(SamplingControls(**sampling_defaults_of(model)), 0.0)
    device = next(model.parameters()).device
    eos = [int(t) for t in eos_token_ids]
    traces: list[GreedyTrace] = []
    for i, ids in enumerate(prompts):
        room = max_tokens
        if max_context is not None:
            room = min(room, max_context - len(ids))
            if room < 1:
                raise InvalidArgumentError(
                    f"prompt {i + 1}",
                    f"{len(ids)} tokens leave no room for a new token in the model's context "
                    f"of {max_context}",
                )
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)  # [1, prompt]
        with torch.inference_mode():
            output = model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=room,
                min_new_tokens=0,
                eos_token_id=eos or None,
                pad_token_id=eos[0] if eos else 0,
                **greedy,
            )  # [1, prompt + new]
        new = output[0, len(ids) :].tolist()
        ended = False
        for j, token in enumerate(new):
            if token in eos:
                new, ended = new[:j], True
                break
        traces.append(GreedyTrace(tuple(ids), tuple(new), ended))
        if progress is not None:
            progress(i + 1, len(prompts))
    return traces


def prompt_traces(
    loaded: Any,
    prompts: Sequence[PromptRecord],
    max_tokens: int,
    progress: Callable[[int, int], None] | None = None,
) -> list[GreedyTrace]:
    """:func:`greedy_traces` of prompt records with a loaded model
    (verifier_service.model.LoadedModel): text prompts tokenized as a server does, chat
    messages rendered with the model's chat template and a generation prompt.

    InvalidArgumentError naming the prompt (1-based) that the model cannot take: chat messages
    without a chat template, or no room for a new token in the model's context.
    """
    ids = []
    for i, prompt in enumerate(prompts):
        try:
            ids.append(prompt.token_ids(loaded.tokenizer))
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"prompt {i + 1}", str(exc)) from exc
    return greedy_traces(
        loaded.model, loaded.eos_token_ids, ids, max_tokens, loaded.max_context, progress
    )


NO_KIND = "(none)"  # the group of records without a kind, when others have one


def kind_labels(prompts: Sequence[PromptRecord]) -> list[str]:
    """Each prompt's group for the per-kind figures: "" for all when no record has a kind,
    else its kind (NO_KIND for a record without one)."""
    if not kinds_of(prompts):
        return ["" for _ in prompts]
    return [prompt.kind or NO_KIND for prompt in prompts]


def kinds_in(labels: Sequence[str]) -> list[str]:
    """The groups among labels, in the order first seen (none when no record has a kind)."""
    return list(dict.fromkeys(label for label in labels if label))


def replayed_drafts(params: DraftParams) -> dict[str, Any]:
    """The drafts of replays with every drafted token verified, as reports record them."""
    return {
        "k": params.k,
        "tree_nodes": params.tree_nodes,
        "overlay_weight": params.overlay_weight,
        "verified": "every drafted token (a flat cost profile)",
    }


def every_8(say: Callable[[str], None], what: str) -> Callable[[int, int], None]:
    """A progress(done, total) for :func:`greedy_traces` that says
    "what: done/total" after every 8th prompt and the last."""

    def report(done: int, total: int) -> None:
        if done % 8 == 0 or done == total:
            say(f"{what}: {done}/{total}")

    return report
