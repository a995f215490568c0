"""The in-process verifier: the embedded mode uses it directly, the gRPC servicer wraps it.

One session = one generation. ``prefill`` runs the prompt through the model and samples the first
token (the session's *pending* token); each ``verify`` runs ONE forward over
``[pending, d_1..d_k]``, accepts a prefix of the draft by exact rejection sampling
(:mod:`verifier_service.sampling`), emits the accepted drafts plus one corrected or bonus token,
and crops the KV cache so that it holds exactly the emitted tokens but the last (the new pending
token). Terms (p, q, accepted, bonus) are defined in :mod:`speculant.types`. Chain verifies of
concurrent sessions share one forward pass (:mod:`verifier_service.batching`, up to
``config.max_batch``). Every request is checked before any work on it (the checks at the end
of this module: each an INVALID_ARGUMENT naming the first bad field), and every forward and
sampling step runs alone on the model (:class:`ModelRunner`).

Session ids are chosen by the caller and must be non-empty here; the gRPC servicer picks a
``uuid4().hex`` when a Prefill request leaves it empty (:func:`new_session_id`). A live session
is never replaced, and unary-Prefill sessions are a kind of their own (below).

The sessions (:class:`SessionStore`): a thread-safe store, with an idle TTL and a cap on live
sessions.

A *session* is one generation in progress: its KV cache (``length`` positions, the prompt and
the tokens emitted so far except the last), the *pending* token (the last emitted token, not yet
in the cache: the next Verify's forward starts with it), how its target distribution is made
(temperature and sampling controls: a :class:`~verifier_service.sampling.TargetProcessor`,
with the cached tokens' counts when a penalty needs them), its RNG, whether it reports
logprobs, and the state of its constraint (speculant.grammar), if it has one.

Calls on one session are serialised by the session's lock (use :meth:`SessionStore.use`); idle
sessions are expired by a background sweeper thread (and lazily on every call), so a vanished
client never leaks memory even when no more calls arrive.

Sessions are of two *kinds*: those of Session streams and of the embedded mode (the stream owns
its session and ends it), and *unary* ones, made by a unary Prefill, addressed by id in later
unary calls and ended by Release or the TTL. Each kind has its own cap (max_sessions,
max_unary_sessions), so direct unary clients can never fill the sessions the gateway's streams
need; unary calls reach unary sessions only; and a live session is never replaced (a Prefill
naming a live id gets ALREADY_EXISTS).

Why so long: a verifier is its sessions, its forwards and its checks of a request; each is
short, and a reader follows one Verify through all three.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import torch

from speculant.config import GREEDY, SessionOptions, VerifierConfig, check_top_logprobs
from speculant.errors import (
    AlreadyExistsError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
)
from speculant.grammar import ConstraintMatcher, Grammars, grammars_for
from speculant.tokenizer import tokenizer_fingerprint
from speculant.types import (
    DraftProposal,
    ModelInfo,
    SparseDistribution,
    TokenLogprobs,
    VerifierStats,
    VerifyResult,
)
from verifier_service.batching import VerifyBatcher, VerifyJob, run_job, sample_constrained
from verifier_service.cost_probe import measure_cost_profile
from verifier_service.model import LoadedModel
from verifier_service.sampling import (
    RejectionOutput,
    TargetProcessor,
    count_tokens,
    sample_token,
    token_logprobs,
)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Session:
    """The state of one generation (see the module docstring)."""

    session_id: str
    cache: Any  # transformers DynamicCache
    length: int  # cached positions
    pending_token: int
    processor: TargetProcessor
    generator: torch.Generator
    counts: torch.Tensor | None = None  # [V] occurrences of each token in the cache (penalties)
    top_logprobs: int | None = None  # report logprobs with this many alternatives; None: none
    grammar: ConstraintMatcher | None = None  # the constraint's state after the pending token
    last_used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False  # released or expired: later calls get NOT_FOUND
    unary: bool = False  # made by a unary Prefill (see the module docstring)


class SessionStore:
    """Sessions by id. ttl_s: idle time before expiry; max_sessions / max_unary_sessions: caps
    on live sessions of each kind (see the module docstring)."""

    def __init__(
        self,
        ttl_s: float,
        max_sessions: int,
        *,
        max_unary_sessions: int = 16,
        clock: Callable[[], float] = time.monotonic,
        sweep_interval_s: float | None = None,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self.max_unary_sessions = max_unary_sessions
        self._clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.created = 0
        self.released = 0
        self.expired = 0
        self._stop = threading.Event()
        interval = sweep_interval_s or min(max(ttl_s / 4, 0.05), 5.0)
        self._sweeper = threading.Thread(
            target=self._sweep_loop, args=(interval,), name="session-sweeper", daemon=True
        )
        self._sweeper.start()

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the sweeper and drop every session."""
        self._stop.set()
        with self._lock:
            for session in self._sessions.values():
                session.closed = True
            self._sessions.clear()

    def _sweep_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.sweep()
            except Exception:  # never let the sweeper die
                log.exception("session sweep failed")

    def sweep(self) -> int:
        """Expire sessions idle for longer than the TTL (skipping ones in use); return how many."""
        now = self._clock()
        expired: list[Session] = []
        with self._lock:
            for sid, session in list(self._sessions.items()):
                if now - session.last_used <= self.ttl_s:
                    continue
                if not session.lock.acquire(blocking=False):
                    continue  # a call is running on it: not idle
                try:
                    session.closed = True
                    del self._sessions[sid]
                    expired.append(session)
                finally:
                    session.lock.release()
            self.expired += len(expired)
        for session in expired:
            log.info("session %s expired after %.1f s idle", session.session_id, self.ttl_s)
            session.cache = None  # free the KV cache now
        return len(expired)

    # -- access ------------------------------------------------------------------------------

    def live(self) -> int:
        with self._lock:
            return len(self._sessions)

    def add(self, session: Session) -> None:
        """Register a new session; ALREADY_EXISTS when its id is live, RESOURCE_EXHAUSTED when
        its kind is at its cap."""
        self.sweep()
        with self._lock:
            self._check_new(session.session_id, session.unary)
            session.last_used = self._clock()
            self._sessions[session.session_id] = session
            self.created += 1

    def check_capacity(self, session_id: str, unary: bool = False) -> None:
        """Raise ALREADY_EXISTS / RESOURCE_EXHAUSTED early (before a prefill forward)."""
        self.sweep()
        with self._lock:
            self._check_new(session_id, unary)

    def _check_new(self, session_id: str, unary: bool) -> None:
        """(under the lock) Whether a new session of this id and kind may be added."""
        if session_id in self._sessions:
            raise AlreadyExistsError(
                f"session {session_id!r} is live: a session is never replaced (release it "
                "first, or leave session_id empty to get a fresh one)"
            )
        cap = self.max_unary_sessions if unary else self.max_sessions
        if sum(1 for s in self._sessions.values() if s.unary == unary) >= cap:
            kind = "unary-Prefill" if unary else "live"
            raise ResourceExhaustedError(
                f"too many {kind} sessions ({cap}); release some or retry later"
            )

    @contextmanager
    def use(self, session_id: str, unary: bool | None = None) -> Iterator[Session]:
        """Hold the session's lock for one call; NOT_FOUND when unknown, released or expired,
        or not of the kind asked for (unary: only unary sessions; None: any)."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and unary is not None and session.unary != unary:
                session = None  # a unary caller never reaches a stream's session
        if session is None:
            raise NotFoundError(
                f"session {session_id!r} not found (never created, released or expired)"
            )
        with session.lock:
            if session.closed:
                raise NotFoundError(f"session {session_id!r} was released or expired")
            session.last_used = self._clock()
            try:
                yield session
            finally:
                session.last_used = self._clock()

    def release(self, session_id: str, unary: bool | None = None) -> bool:
        """Drop a session (of the kind asked for; None: any); False when unknown. Waits for a
        call in progress on it to finish."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or (unary is not None and session.unary != unary):
                return False
            del self._sessions[session_id]
            self.released += 1
        with session.lock:
            session.closed = True
            session.cache = None
        return True


log = logging.getLogger(__name__)


def new_session_id() -> str:
    return uuid.uuid4().hex


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


T = TypeVar("T")


class ModelRunner:
    """Runs functions (forward + sampling) alone on the model.

    thread: run every one on one dedicated thread. Servers with more than one torch thread want
    this: torch's OpenMP pool is per calling thread, so forwards from many RPC worker threads
    would each start a pool of spinning threads and starve the CPU. With one torch thread (no
    pool) or one in-process caller, a lock does and saves a thread hand-off per call.
    """

    def __init__(self, thread: bool = False) -> None:
        self._lock = threading.Lock()  # one forward at a time on the shared model
        self._thread = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="model") if thread else None
        )

    def run(self, fn: Callable[[], T]) -> T:
        """fn's result, run alone on the model: on the model thread, or under the lock."""
        if self._thread is not None:
            return self._thread.submit(fn).result()
        with self._lock:
            return fn()

    def close(self) -> None:
        """Stop the model thread (if any), without waiting for it."""
        if self._thread is not None:
            self._thread.shutdown(wait=False)


class LocalVerifier:
    """Target model + sessions. Thread-safe; calls on one session are serialised."""

    def __init__(
        self,
        config: VerifierConfig,
        *,
        model: LoadedModel | None = None,
        model_thread: bool = False,
        sweep_interval_s: float | None = None,
    ) -> None:
        """Load config.model_name (ModelLoadError if impossible), or use an already-loaded model.

        model_thread: run every forward and sampling step on one dedicated thread (see
        ModelRunner), else under a lock.
        """
        self.config = config
        self.model = model if model is not None else LoadedModel.load(config)
        self.sessions = SessionStore(
            config.session_ttl_s,
            config.max_sessions,
            max_unary_sessions=config.max_unary_sessions,
            sweep_interval_s=sweep_interval_s,
        )
        self._model_runner = ModelRunner(thread=model_thread)
        self._on_model = self._model_runner.run  # forward + sampling, alone on the model
        # The capability probes run once, here, on the model (thread): forwards run nowhere else.
        can_batch, _ = self._on_model(
            lambda: (self.model.supports_batching, self.model.supports_trees)
        )
        self._batcher = (
            VerifyBatcher(self.model, config.max_batch, self._on_model)
            if config.max_batch > 1 and can_batch
            else None
        )
        # What a forward over n new tokens costs here, measured now and refreshed by every
        # Verify (speculant.cost_profile; reported in GetModelInfo, metrics and the log).
        self.cost_profile = self._on_model(
            lambda: measure_cost_profile(self.model, config.cost_probe_s)
        )
        log.info("%s: %s", self.model.name, self.cost_profile.summary())
        self._stats_lock = threading.Lock()
        self._forward_passes = 0
        self._draft_tokens = 0
        self._accepted_tokens = 0
        self._info = ModelInfo(
            model_name=self.model.name,
            # loaded here: the model's name (a local folder's resolved path)
            tokenizer_name=(config.model_name if model is not None else "") or self.model.name,
            tokenizer_fingerprint=tokenizer_fingerprint(self.model.tokenizer),
            vocab_size=self.model.vocab_size,
            eos_token_ids=list(self.model.eos_token_ids),
            max_context_length=self.model.max_context,
            device=str(self.model.device),
            dtype=_dtype_name(self.model.dtype),
        )

    @property
    def info(self) -> ModelInfo:
        """The model's description, with the cost profile as it stands now."""
        return replace(self._info, verify_cost_seconds=self.cost_profile.copy().seconds)

    @property
    def grammars(self) -> Grammars:
        """The model's compiled constraints (speculant.grammar; made on first use)."""
        return grammars_for(self.model.tokenizer, self.model.vocab_size, self.model.eos_token_ids)

    @property
    def batcher(self) -> VerifyBatcher | None:
        """The batcher of concurrent Verify calls; None when config.max_batch is 1 or the model
        cannot batch (see LoadedModel.supports_batching)."""
        return self._batcher

    def close(self) -> None:
        """Drop all sessions and stop the expiry (and model) threads."""
        if self._batcher is not None and self._batcher.forwards:
            log.info(
                "verify batching: %d forward passes served %d Verify calls (%.2f per pass)",
                self._batcher.forwards,
                self._batcher.jobs,
                self._batcher.jobs / self._batcher.forwards,
            )
        self.sessions.close()
        self._model_runner.close()

    def check_draft_size(self, draft_tokens: int, distributions: int) -> None:
        """INVALID_ARGUMENT unless a Verify of this many draft tokens and distributions is within
        config.max_draft_tokens (checked before any work on them)."""
        check_draft_size(draft_tokens, distributions, self.config.max_draft_tokens)

    # -- API ---------------------------------------------------------------------------------

    def start(
        self,
        session_id: str,
        prompt_ids: Sequence[int],
        options: SessionOptions,
        unary: bool = False,
    ) -> VerifyResult:
        """Create the session from the prompt; return its first generated token (ALREADY_EXISTS
        when session_id is live; unary: a unary-Prefill session, see SessionStore).

        The first token is sampled from p after the prompt with the session's generator (seeded
        with ``options.seed``; random when None), or is the argmax at temperature 0. p: the
        logits processed by ``options.controls`` (unset fields: the model's generation_config,
        else off; see SamplingControls), for every token of the session. options.top_logprobs:
        every result of the session reports its tokens' logprobs with this many alternatives
        (None: none).
        """
        prompt = checked_start(
            session_id,
            prompt_ids,
            options,
            vocab=self.model.vocab_size,
            max_context=self.model.max_context,
        )
        resolved = options.controls.resolved(self.model.sampling_defaults)
        processor = TargetProcessor(resolved, float(options.temperature))
        grammar = None
        if options.constraint is not None:  # compiled (or a cached copy) before any forward
            grammar = self.grammars.matcher(options.constraint)
        self.sessions.check_capacity(session_id, unary)

        session = Session(
            session_id=session_id,
            cache=self.model.new_cache(),
            length=len(prompt),
            pending_token=-1,  # the first token: sampled by the prefill
            processor=processor,
            generator=self._generator(options.seed),
            counts=self._counts(prompt) if processor.penalises else None,
            top_logprobs=options.top_logprobs,
            grammar=grammar,
            unary=unary,
        )
        logprobs = self._on_model(lambda: self._prefill(session, prompt))
        self._count(forward=1)
        self.sessions.add(session)
        return VerifyResult(accepted_count=0, token_ids=[session.pending_token], logprobs=logprobs)

    def _counts(self, tokens: list[int]) -> torch.Tensor:
        """[V] occurrences of each of the tokens (what penalties see, see processing)."""
        counts = torch.zeros(self.model.vocab_size, dtype=torch.float32, device=self.model.device)
        count_tokens(counts, tokens)
        return counts

    def _prefill(self, session: Session, prompt: list[int]) -> list[TokenLogprobs]:
        """The prompt's forward into the new session's empty cache, and its first token (the
        pending one) sampled from p after it; the token's logprobs when the session reports
        them. Run on the model."""
        processor, counts = session.processor, session.counts
        counts = None if counts is None else counts[None]  # [1, V]
        input_ids = torch.tensor(prompt, dtype=torch.long, device=self.model.device)  # [n]
        logits = self.model.forward(session.cache, input_ids, 0, logits_to_keep=1)  # [1, V]
        if session.grammar is not None:  # the first token, masked by the constraint
            gen, top = session.generator, session.top_logprobs
            out, logprobs = sample_constrained(
                session.grammar, logits, counts, processor, gen, top_logprobs=top
            )
            session.pending_token = out.token_ids[0]
            return logprobs
        scores = processor.scores(logits, counts)  # [1, V]
        token = sample_token(scores[0], processor.sampling_temperature, session.generator)
        session.pending_token = token
        if session.top_logprobs is None:
            return []
        return token_logprobs(processor.log_probs(scores), [token], session.top_logprobs)

    def _generator(self, seed: int | None) -> torch.Generator:
        """A session's random generator on the model's device: seeded, or random when None."""
        generator = torch.Generator(device=self.model.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        return generator

    def verify(
        self,
        session_id: str,
        draft_ids: Sequence[int],
        draft_distributions: Sequence[SparseDistribution] | None = None,
        draft_parents: Sequence[int] | None = None,
        unary: bool | None = None,
    ) -> VerifyResult:
        """Score the drafts in ONE forward; return accepted drafts + a corrected/bonus token.

        draft_parents: a draft tree (see speculant.types.DraftProposal); None/empty: a chain.
        unary: True for a unary caller, who reaches unary-Prefill sessions only (None: any).

        draft_distributions: the q of each draft token, or None/empty for point-mass (greedy)
        drafts. Drafts that would overflow the model's context are dropped from the end; when
        the context is already full, OUT_OF_RANGE.
        """
        self.check_draft_size(len(draft_ids), len(draft_distributions or ()))
        drafts = [int(t) for t in draft_ids]
        vocab = self.model.vocab_size
        check_token_ids(drafts, "draft_token_ids", vocab)
        q = None
        if draft_distributions:
            q = dense_q(drafts, draft_distributions, vocab).to(self.model.device, non_blocking=True)
        if draft_parents:
            parents = [int(p) for p in draft_parents]
            return self._verify_tree(session_id, drafts, parents, q, unary)
        with self.sessions.use(session_id, unary) as session:
            room = self._room(session_id, session.length)  # drafts that still fit
            if session.grammar is not None and q is None:  # no forward on a forbidden draft
                room = min(room, session.grammar.valid_prefix(drafts))
            if len(drafts) > room:
                drafts = drafts[:room]
                q = None if q is None else q[:room]
            out, logprobs, seconds, rows = self._run(session, drafts, q)
        self._count(forward=1, drafts=len(drafts), accepted=out.accepted_count)
        return VerifyResult(
            out.accepted_count, out.token_ids, [], logprobs, seconds=seconds, batch_rows=rows
        )

    def _run(
        self,
        session: Session,
        drafts: list[int],
        q: torch.Tensor | None,
        parents: list[int] | None = None,
    ) -> tuple[RejectionOutput, list[TokenLogprobs], float, int]:
        """The session's verify step (batching.VerifyJob): in a batch when the verifier
        batches, else alone on the model; the session then moves past the accepted drafts.
        Returns the outcome, the emitted tokens' logprobs when the session reports them, the
        step's seconds on the model (its wait for the model and its batch included) and the
        rows of the forward that ran it (1: alone)."""
        job = VerifyJob(
            cache=session.cache,
            start=session.length,
            input_ids=[session.pending_token, *drafts],
            q=q,
            processor=session.processor,
            generator=session.generator,
            parents=parents,
            counts=session.counts,
            top_logprobs=session.top_logprobs,
            grammar=session.grammar,
        )
        started = time.perf_counter()
        if self._batcher is not None:
            out = self._batcher.run(job)
        else:
            out = self._on_model(lambda: run_job(self.model, job))
        seconds = time.perf_counter() - started
        if job.batch_rows == 1:  # a batch's seconds are not what its rows cost alone
            self.cost_profile.observe(len(job.input_ids), seconds)
        if session.counts is not None:  # the pending token and the accepted drafts are cached
            count_tokens(session.counts, [session.pending_token, *out.token_ids[:-1]])
        session.length += 1 + out.accepted_count
        session.pending_token = out.token_ids[-1]
        return out, job.logprobs or [], seconds, job.batch_rows

    def _room(self, session_id: str, length: int) -> int:
        """Draft positions that still fit after a session of `length` cached tokens and its
        pending token; OUT_OF_RANGE when the context is already full."""
        room = self.model.max_context - length - 1
        if room < 0:
            raise OutOfRangeError(
                f"session {session_id!r} is at the model's context limit"
                f" ({self.model.max_context} tokens)"
            )
        return room

    def _verify_tree(
        self,
        session_id: str,
        drafts: list[int],
        parents: list[int],
        q: torch.Tensor | None,
        unary: bool | None = None,
    ) -> VerifyResult:
        """verify() for a draft tree: one forward over all branches, then the tree walk.
        q: [n, V] dense q of sampled drafts, or None for point masses."""
        check_parents(parents, len(drafts))
        with self.sessions.use(session_id, unary) as session:
            room = self._room(session_id, session.length)  # tree depth that still fits
            tree = DraftProposal(drafts, parents=parents)
            kept = [i for i, depth in enumerate(tree.depths()) if depth < room]  # what fits
            if not self.model.supports_trees:  # probed above: a cached answer
                kept = _first_branch(parents, kept)
            kept_tree = tree.select(kept)
            if session.grammar is not None and q is None:  # no forward on a forbidden draft
                valid = session.grammar.valid_nodes(kept_tree.token_ids, kept_tree.parents)
                kept, kept_tree = [kept[i] for i in valid], kept_tree.select(valid)
            drafts, parents = kept_tree.token_ids, kept_tree.parents
            if q is not None:
                q = q[torch.tensor(kept, dtype=torch.long, device=q.device)]  # [kept, V]
            out, logprobs, seconds, rows = self._run(session, drafts, q, parents)
        self._count(forward=1, drafts=len(drafts), accepted=out.accepted_count)
        accepted = [kept[i] for i in out.accepted_nodes]  # indices into the request's tree
        return VerifyResult(out.accepted_count, out.token_ids, accepted, logprobs, seconds, rows)

    def warm_up(self) -> None:
        """Run one short session through prefill and verify, so the first real request does not
        pay for lazy initialisation (kernels, thread pools, allocator)."""
        session_id = f"warm-up-{new_session_id()}"
        token = self.start(session_id, [0, 1, 2, 3], GREEDY).token_ids[0]
        self.verify(session_id, [token] * 4)
        self.release(session_id)

    def release(self, session_id: str, unary: bool | None = None) -> bool:
        """Free the session; False when it was unknown (already released or expired, or not a
        unary-Prefill session for a unary caller)."""
        return self.sessions.release(session_id, unary)

    def stats(self) -> VerifierStats:
        with self._stats_lock:
            return VerifierStats(
                live_sessions=self.sessions.live(),
                sessions_created=self.sessions.created,
                sessions_released=self.sessions.released,
                sessions_expired=self.sessions.expired,
                forward_passes=self._forward_passes,
                draft_tokens=self._draft_tokens,
                accepted_tokens=self._accepted_tokens,
            )

    def _count(self, forward: int = 0, drafts: int = 0, accepted: int = 0) -> None:
        with self._stats_lock:
            self._forward_passes += forward
            self._draft_tokens += drafts
            self._accepted_tokens += accepted


def _first_branch(parents: list[int], kept: list[int]) -> list[int]:
    """Of the kept tree nodes, the first branch: from the pending token, always the first child
    (what a verifier that cannot check trees checks instead, as a chain)."""
    first_child: dict[int, int] = {}
    for index in kept:
        first_child.setdefault(parents[index], index)
    path, node = [], -1
    while node in first_child:
        node = first_child[node]
        path.append(node)
    return path


# -- The checks of a request, made before any work on it --------------------------------------

PROB_SUM_TOLERANCE = 1e-3  # |sum(q) - 1| allowed for a draft distribution


def check_draft_size(draft_tokens: int, distributions: int, limit: int) -> None:
    """INVALID_ARGUMENT unless a Verify of this many draft tokens and distributions is within
    the limit (config.max_draft_tokens)."""
    for name, count in (
        ("draft_token_ids", draft_tokens),
        ("draft_distributions", distributions),
    ):
        if count > limit:
            raise InvalidArgumentError(
                name,
                f"has {count} entries; a Verify takes at most {limit} draft tokens "
                "(--max-draft-tokens)",
            )


def check_token_ids(ids: Sequence[int], field: str, vocab: int) -> None:
    """INVALID_ARGUMENT naming the first id outside the vocabulary [0, vocab)."""
    for i, token in enumerate(ids):
        if not 0 <= token < vocab:
            raise InvalidArgumentError(
                f"{field}[{i}]", f"token id {token} is outside the vocabulary [0, {vocab})"
            )


def checked_start(
    session_id: str,
    prompt_ids: Sequence[int],
    options: SessionOptions,
    *,
    vocab: int,
    max_context: int,
) -> list[int]:
    """The prompt as ints, once every argument of a session's start is valid for a model of
    this vocabulary and context (InvalidArgumentError naming the first that is not)."""
    if not session_id:
        raise InvalidArgumentError("session_id", "must not be empty")
    if not prompt_ids:
        raise InvalidArgumentError("prompt_token_ids", "must not be empty")
    if len(prompt_ids) >= max_context:  # before any work on them
        raise InvalidArgumentError(
            "prompt_token_ids",
            f"has {len(prompt_ids)} tokens; the model's context is {max_context} tokens"
            f" (at most {max_context - 1} prompt tokens, to leave room for one generated token)",
        )
    prompt = [int(t) for t in prompt_ids]
    check_token_ids(prompt, "prompt_token_ids", vocab)
    temperature, seed = options.temperature, options.seed
    if not (math.isfinite(temperature) and temperature >= 0):
        raise InvalidArgumentError("temperature", f"must be finite and >= 0, got {temperature}")
    if seed is not None and not 0 <= seed < 2**64:
        raise InvalidArgumentError("seed", f"must be in [0, 2^64), got {seed}")
    check_top_logprobs(options.top_logprobs)
    options.controls.validate()
    if options.constraint is not None:
        options.constraint.validate()
    return prompt


def dense_q(
    draft_ids: Sequence[int], dists: Sequence[SparseDistribution], vocab: int
) -> torch.Tensor:
    """Validate sparse q's (one per draft token) and scatter them into a dense [k, V] float32
    tensor on the CPU, each normalised to sum 1 (repeated ids add up)."""
    if len(dists) != len(draft_ids):
        raise InvalidArgumentError(
            "draft_distributions",
            f"has {len(dists)} entries for {len(draft_ids)} draft tokens"
            " (give one per draft token, or none for point-mass drafts)",
        )
    rows: list[np.ndarray] = []
    cols: list[np.ndarray] = []
    vals: list[np.ndarray] = []
    for i, (draft, dist) in enumerate(zip(draft_ids, dists, strict=True)):
        ids, probs = _checked_distribution(f"draft_distributions[{i}]", draft, dist, vocab)
        rows.append(np.full(ids.size, i, dtype=np.int64))
        cols.append(ids)
        vals.append(probs / float(probs.sum()))
    q = torch.zeros(len(draft_ids), vocab, dtype=torch.float32)
    q.index_put_(
        (torch.from_numpy(np.concatenate(rows)), torch.from_numpy(np.concatenate(cols))),
        torch.from_numpy(np.concatenate(vals)).float(),
        accumulate=True,  # repeated ids add up
    )
    return q  # [k, V]


def _checked_distribution(
    field: str, draft: int, dist: SparseDistribution, vocab: int
) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, probs) of a draft token's q, once they are a distribution over the
    vocabulary that gives the draft token a probability > 0."""
    ids = np.asarray(dist.token_ids, dtype=np.int64)
    probs = np.asarray(dist.probs, dtype=np.float64)
    if ids.shape != probs.shape or ids.ndim != 1:
        raise InvalidArgumentError(
            field, f"token_ids ({ids.size}) and probs ({probs.size}) differ in length"
        )
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise InvalidArgumentError(f"{field}.token_ids", f"token ids must be in [0, {vocab})")
    if not np.all(np.isfinite(probs)) or np.any(probs < 0):
        raise InvalidArgumentError(f"{field}.probs", "must be finite and >= 0")
    total = float(probs.sum())
    if abs(total - 1.0) > PROB_SUM_TOLERANCE:
        raise InvalidArgumentError(f"{field}.probs", f"must sum to 1, got {total:.6g}")
    if float(probs[ids == draft].sum()) <= 0:
        raise InvalidArgumentError(
            field, f"gives the draft token {draft} probability 0 (q(d) must be > 0)"
        )
    return ids, probs


def check_parents(parents: Sequence[int], drafts: int) -> None:
    """INVALID_ARGUMENT unless a draft tree of `drafts` tokens has one parent per token, each
    -1 (the pending token) or an earlier index."""
    if len(parents) != drafts:
        raise InvalidArgumentError(
            "draft_parents", f"has {len(parents)} entries for {drafts} draft tokens"
        )
    for i, parent in enumerate(parents):
        if not -1 <= parent < i:
            raise InvalidArgumentError(
                f"draft_parents[{i}]", f"must be -1 or an earlier index (< {i}), got {parent}"
            )
