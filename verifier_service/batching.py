"""The verify step of a session, for chains and trees, and the batching of concurrent ones.

Terms:

- *job*: one session's Verify step: its KV cache (``start`` cached positions), the new tokens
  ``[pending, d_1..d_n]``, the q of each draft (None = point-mass drafts), the session's
  target processor (temperature and sampling controls, :mod:`verifier_service.sampling`),
  token counts and generator, and for a draft tree the parent of each draft (None: a chain).
- *run alone* (:func:`run_job`): one forward over the job's tokens, then rejection sampling
  (:func:`~verifier_service.sampling.rejection_sample` for a chain, ``tree_sample`` for a
  tree) and the cache surgery that keeps the pending token and the accepted drafts.
- *batch*: jobs run together in ONE forward (:meth:`LoadedModel.forward_batch`), a tree's
  row masked as its lone forward would be (each token sees its ancestors); then each row is
  finished exactly as the job run alone, with the row's own generator and cache.

Scheduling is *continuous* and has no timer: a caller queues its job and waits while a batch
runs; when none runs, the first waiter whose job is still queued runs its job together with the
oldest queued ones (``max_batch`` jobs at most). A lone stream never waits for company, and
under concurrency the jobs that arrive while one batch runs form the next one.

Batched logits can differ from a lone forward's in the last float bits (the batch's matrix
products run other shapes: the rows packed one after another with the lean forward, padded
otherwise), as a lone chain forward's already differ from Hugging Face ``generate``'s one-token
steps; the tests check that greedy outputs stay token-identical to ``generate``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from speculant.grammar import ConstraintMatcher
from speculant.types import TokenLogprobs
from verifier_service.model import LoadedModel
from verifier_service.sampling import (
    ConstrainedRows,
    RejectionOutput,
    TargetProcessor,
    history_counts,
    rejection_sample,
    token_logprobs,
    tree_sample,
    walk_tree,
)


@dataclass(eq=False)
class VerifyJob:
    """One session's Verify step (see the module's terms); the batcher fills output or error."""

    cache: Any  # the session's transformers DynamicCache, `start` positions long
    start: int
    input_ids: list[int]  # [pending, d_1..d_n]
    q: torch.Tensor | None  # [n, V] dense draft distributions, None = point-mass drafts
    processor: TargetProcessor
    generator: torch.Generator
    parents: list[int] | None = None  # [n]: a draft tree (see DraftProposal.parents); None: chain
    counts: torch.Tensor | None = None  # [V] counts of the cached tokens (with a penalty)
    top_logprobs: int | None = None  # report logprobs with this many alternatives (None: none)
    grammar: ConstraintMatcher | None = None  # the session's constraint (at the pending token)
    output: RejectionOutput | None = None
    logprobs: list[TokenLogprobs] | None = None  # one per emitted token, with top_logprobs
    error: BaseException | None = None
    done: bool = False
    batch_rows: int = 1  # the jobs of the forward that ran it (1: alone)


def decide(job: VerifyJob, logits: torch.Tensor, input_ids: torch.Tensor) -> RejectionOutput:
    """The job's outcome from its logits [n+1, V] (input_ids [n+1]: job.input_ids on the model's
    device): the processed scores, rejection sampling of its chain or tree on them, and (with
    top_logprobs) the emitted tokens' logprobs."""
    processor = job.processor
    counts = None
    if processor.penalises:
        assert job.counts is not None
        counts = history_counts(job.counts, input_ids, job.parents)  # [n+1, V]
    if job.grammar is not None:
        out, job.logprobs = sample_constrained(
            job.grammar,
            logits,
            counts,
            processor,
            job.generator,
            job.input_ids[1:],
            job.parents,
            job.q,
            job.top_logprobs,
        )
        return out
    scores = processor.scores(logits, counts)  # [n+1, V]
    temperature = processor.sampling_temperature
    if job.parents is not None:
        drafts = job.input_ids[1:]
        out = tree_sample(scores, drafts, job.parents, temperature, job.generator, job.q)
        rows = [0, *(node + 1 for node in out.accepted_nodes)]  # the emitted tokens' rows
    else:
        out = rejection_sample(scores, input_ids[1:], job.q, temperature, job.generator)
        rows = list(range(out.accepted_count + 1))
    if job.top_logprobs is not None:
        log_p = processor.log_probs(scores[rows])  # [emitted, V]
        job.logprobs = token_logprobs(log_p, out.token_ids, job.top_logprobs)
    return out


def sample_constrained(
    grammar: ConstraintMatcher,
    logits: torch.Tensor,
    counts: torch.Tensor | None,
    processor: TargetProcessor,
    generator: torch.Generator,
    drafts: list[int] = (),  # type: ignore[assignment]
    parents: list[int] | None = None,
    q: torch.Tensor | None = None,
    top_logprobs: int | None = None,
) -> tuple[RejectionOutput, list[TokenLogprobs]]:
    """The outcome of a forward's logits [n+1, V] (counts [n+1, V] with a penalty) under a
    constraint: the draft walked as a tree (a chain is one), each row masked by the grammar at
    the state of its own path as the walk reaches it (sampling.ConstrainedRows), and the
    matcher moved past the emitted tokens; with top_logprobs, their logprobs. No drafts: the
    first token after a prefill."""
    drafts = list(drafts)
    temperature = processor.sampling_temperature
    argmax_only = temperature == 0 and top_logprobs is None
    rows = ConstrainedRows(grammar, logits, counts, processor, drafts, parents, argmax_only)
    tree = parents if parents is not None else list(range(-1, len(drafts) - 1))
    out = walk_tree(rows, drafts, tree, temperature, generator, q)
    rows.emitted(out.token_ids[-1])
    if top_logprobs is None:
        return out, []
    emitted_rows = [0, *(node + 1 for node in out.accepted_nodes)]
    log_p = processor.log_probs(torch.stack([rows.scores[r] for r in emitted_rows]))  # [e, V]
    return out, token_logprobs(log_p, out.token_ids, top_logprobs)


def _finish(
    model: LoadedModel, job: VerifyJob, logits: torch.Tensor, input_ids: torch.Tensor
) -> RejectionOutput:
    """The job's outcome from its logits [n+1, V]; its cache then keeps the pending token and
    the accepted drafts (the last emitted token is pending): a chain's cropped, a tree's kept
    to the accepted path."""
    out = decide(job, logits, input_ids)
    if job.parents is not None:
        model.keep_path(job.cache, job.start, out.accepted_nodes)
    elif out.accepted_count < len(job.input_ids) - 1:
        model.crop(job.cache, job.start + 1 + out.accepted_count)
    return out


def run_job(model: LoadedModel, job: VerifyJob) -> RejectionOutput:
    """One job alone: its own forward over [pending, d_1..d_n], then rejection sampling and
    the cache kept to the accepted path (a tree's accepted_nodes name the path's drafts)."""
    input_ids = torch.tensor(job.input_ids, dtype=torch.long, device=model.device)  # [n+1]
    if job.parents is not None:
        logits = model.forward_tree(job.cache, input_ids, job.start, job.parents)  # [n+1, V]
    else:
        logits = model.forward(job.cache, input_ids, job.start, logits_to_keep=len(input_ids))
    return _finish(model, job, logits, input_ids)


def run_batch(model: LoadedModel, jobs: list[VerifyJob]) -> None:
    """Run the jobs in one forward (one job: :func:`run_job`); set each job's output or error.

    A failed forward fails every job of the batch; a batch of two or more leaves their caches
    as they were (LoadedModel.forward_batch drops whatever a failed forward appended).
    """
    try:
        if len(jobs) == 1:
            jobs[0].output = run_job(model, jobs[0])
            return
        logits = model.forward_batch(
            [job.cache for job in jobs],
            [job.input_ids for job in jobs],
            [job.start for job in jobs],
            [job.parents for job in jobs],
        )
    except Exception as exc:
        for job in jobs:
            job.error = exc
        return
    for job, rows in zip(jobs, logits, strict=True):
        try:
            input_ids = torch.tensor(job.input_ids, dtype=torch.long, device=model.device)
            job.output = _finish(model, job, rows, input_ids)
        except Exception as exc:
            job.error = exc


class VerifyBatcher:
    """Runs the jobs of concurrent callers in batches of up to max_batch (see the module).

    on_model runs a function alone on the model (the verifier's model thread or forward lock),
    so batches and the verifier's other forwards (prefills, tree verifies) never overlap.
    forwards, jobs and largest count the batches run, the jobs they served and the largest.
    """

    def __init__(
        self,
        model: LoadedModel,
        max_batch: int,
        on_model: Callable[[Callable[[], None]], None],
    ) -> None:
        if max_batch < 2:
            raise ValueError(f"max_batch must be at least 2 to batch, got {max_batch}")
        self.model = model
        self.max_batch = max_batch
        self.on_model = on_model
        self._queue: deque[VerifyJob] = deque()
        self._changed = threading.Condition()  # guards the queue, _running and job.done
        self._running = False
        self.forwards = 0  # batches run (each one forward pass)
        self.jobs = 0  # jobs they served
        self.largest = 0  # the most jobs one batch served

    @property
    def queued(self) -> int:
        """Jobs waiting for the next batch."""
        with self._changed:
            return len(self._queue)

    def run(self, job: VerifyJob) -> RejectionOutput:
        """Verify the job, in a batch with whatever other jobs are queued; raise its error."""
        batch: list[VerifyJob] = []  # stays empty unless this caller runs the batch
        with self._changed:
            self._queue.append(job)
            while self._running and not job.done:
                self._changed.wait()
            if not job.done:  # no batch runs and the job is still queued: run one
                self._running = True
                batch = self._take(job)
                for member in batch:
                    member.batch_rows = len(batch)
        if batch:
            try:
                self.on_model(lambda: run_batch(self.model, batch))
            except BaseException as exc:  # e.g. the model thread was shut down
                for other in batch:
                    other.error = other.error or exc
            finally:
                with self._changed:
                    self._running = False
                    for other in batch:
                        other.done = True
                    self.forwards += 1
                    self.jobs += len(batch)
                    self.largest = max(self.largest, len(batch))
                    self._changed.notify_all()
        if job.error is not None:
            raise job.error
        assert job.output is not None
        return job.output

    def _take(self, job: VerifyJob) -> list[VerifyJob]:
        """The job and the oldest other queued jobs, max_batch in all, out of the queue."""
        self._queue.remove(job)
        batch = [job]
        while self._queue and len(batch) < self.max_batch:
            batch.append(self._queue.popleft())
        return batch
