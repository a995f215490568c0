"""A thread-safe store of verifier sessions, with an idle TTL and a cap on live sessions.

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
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from speculant.errors import AlreadyExistsError, NotFoundError, ResourceExhaustedError
from speculant.grammar import ConstraintMatcher
from verifier_service.sampling import TargetProcessor

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
