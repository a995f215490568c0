"""The generations of one HTTP answer, run in worker threads and read from the event loop, and
the server-sent events that stream them.

GenerationEngine.generate is blocking (gRPC calls to the backends, round after round), so each
*choice* of an answer (OpenAI's ``n``, and a completion's several prompts) runs it in a thread
of its own, and its items reach the event loop through an asyncio queue. Setting
:attr:`ChoiceRuns.cancel` (the client went away, or another choice failed) ends every choice
between two rounds: its generation is closed, which frees its verifier session and its slot of
the gateway's ``--max-concurrent``. A stream (:func:`answer_events`, sent by
:class:`EventStream`) is server-sent events ending with ``data: [DONE]``; a client that
disconnects is noticed (:func:`on_disconnect`) and cancels the choices.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Receive, Scope, Send

from gateway.api.answers import LogprobEntry, ResponseWriter, TokenTexts, http_error
from gateway.api.requests import ApiRequest
from gateway.engine import GenerationEngine
from gateway.generation import GenerationResult, PromptRequest, StreamChunk

_DONE = object()  # a choice's thread has ended


@dataclass(frozen=True)
class ChoiceItem:
    """An item of choice `index`'s generation, with the texts of its reported logprobs (a
    stream's chunks; a unary answer's result)."""

    index: int
    item: StreamChunk | GenerationResult
    entries: list[LogprobEntry] = field(default_factory=list)


class ChoiceRuns:
    """One generation per request in `requests` (choice i runs requests[i]), all at once.

    stream: report the log-probabilities of the stream's chunks (else of the final results);
    logprobs: whether the requests ask for them. Made on the event loop's thread.
    """

    def __init__(
        self,
        engine: GenerationEngine,
        requests: Sequence[PromptRequest],
        *,
        stream: bool,
        logprobs: bool,
    ) -> None:
        self.cancel = threading.Event()
        self.count = len(requests)
        self._engine = engine
        self._stream = stream
        self._logprobs = logprobs
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()
        self._running = self.count
        self._buffer: list[ChoiceItem] = []
        for index, request in enumerate(requests):
            context = contextvars.copy_context()  # the request id, for the logs and backends
            threading.Thread(
                target=context.run,
                args=(self._work, index, request),
                name=f"http-choice-{index}",
                daemon=True,
            ).start()

    def _put(self, message: tuple[int, object]) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, message)
        except RuntimeError:  # the event loop is closed: the server stopped
            self.cancel.set()

    def _work(self, index: int, request: PromptRequest) -> None:
        texts: TokenTexts | None = None
        try:
            generation = self._engine.generate(request, cancelled=self.cancel.is_set)
            with contextlib.closing(generation) as items:
                for item in items:
                    entries: list[LogprobEntry] = []
                    if self._logprobs and isinstance(item, StreamChunk) == self._stream:
                        if texts is None:
                            texts = TokenTexts(self._engine.coordinator().tokenizer)
                        entries = texts.entries(item.logprobs)
                    self._put((index, ChoiceItem(index, item, entries)))
                    if self.cancel.is_set():
                        break
        except Exception as exc:
            self._put((index, exc))
        finally:
            self._put((index, _DONE))

    async def _next(self) -> tuple[int, object]:
        index, message = await self._queue.get()
        if message is _DONE:
            self._running -= 1
        return index, message

    async def start(self) -> None:
        """Wait until every choice has brought its first item (its request is validated and
        tokenized, its prompt prefilled); on the first error, cancel the others and raise it."""
        started: set[int] = set()
        while len(started) < self.count and self._running:
            index, message = await self._next()
            if isinstance(message, BaseException):
                self.cancel.set()
                raise message
            if isinstance(message, ChoiceItem):
                self._buffer.append(message)
            started.add(index)

    async def items(self) -> AsyncIterator[ChoiceItem]:
        """Every choice's items, interleaved as they come (after start()); a choice's error
        is raised. Leaving early cancels the choices still running."""
        try:
            buffered, self._buffer = self._buffer, []
            for item in buffered:
                yield item
            while self._running:
                _index, message = await self._next()
                if isinstance(message, BaseException):
                    raise message
                if isinstance(message, ChoiceItem):
                    yield message
        finally:
            self.cancel.set()  # a no-op once every choice has ended

    async def results(self) -> tuple[list[GenerationResult], list[list[LogprobEntry]]] | None:
        """Every choice's result and its logprob entries (unary answers), in choice order;
        None if a choice ended without one (cancelled)."""
        results: list[GenerationResult | None] = [None] * self.count
        entries: list[list[LogprobEntry]] = [[] for _ in range(self.count)]
        async for choice in self.items():
            if isinstance(choice.item, GenerationResult):
                results[choice.index] = choice.item
                entries[choice.index] = choice.entries
        if any(r is None for r in results):
            return None
        return [r for r in results if r is not None], entries


async def answer_events(
    runs: ChoiceRuns, writer: ResponseWriter, request: ApiRequest
) -> AsyncIterator[bytes]:
    """Server-sent events: per choice (indexed), chunks as tokens are accepted and the finish;
    the usage if asked for; [DONE]. The status is sent first, so an error during the rounds is
    sent as an event ``{"error": ...}``."""
    results: list[GenerationResult | None] = [None] * runs.count
    try:
        for chunk in writer.opening_chunks(runs.count):
            yield event(chunk)
        async for choice in runs.items():
            item = choice.item
            if isinstance(item, GenerationResult):
                results[choice.index] = item
                for chunk in writer.final_chunks(choice.index, item):
                    yield event(chunk)
            elif item.text_delta or choice.entries:
                for chunk in writer.text_chunks(choice.index, item.text_delta, choice.entries):
                    yield event(chunk)
        finished = [r for r in results if r is not None]
        if request.include_usage and len(finished) == runs.count:
            yield event(writer.usage_chunk(finished))
    except Exception as exc:
        yield event(http_error(exc, request).body())
    yield event("[DONE]")


def event(body: dict[str, Any] | str) -> bytes:
    """One server-sent event (a JSON object, or the final "[DONE]")."""
    data = body if isinstance(body, str) else json.dumps(body)
    return f"data: {data}\n\n".encode()


@contextlib.asynccontextmanager
async def on_disconnect(receive: Receive, gone: Callable[[], None]) -> AsyncIterator[None]:
    """Call gone() if the client disconnects while the block runs (the body is read)."""

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone()

    watcher = asyncio.ensure_future(watch())
    try:
        yield
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


class EventStream:
    """An ASGI response: the server-sent events of `events`, sent as they come; when the client
    disconnects, `gone` is called (which must make `events` end soon)."""

    def __init__(self, events: AsyncIterator[bytes], gone: Callable[[], None]) -> None:
        self.events = events
        self.gone = gone

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        async with contextlib.aclosing(self.events) as events:
            try:
                async with on_disconnect(receive, self.gone):
                    await send({"type": "http.response.start", "status": 200, "headers": headers})
                    async for data in events:  # once gone, they end after the current round
                        await send({"type": "http.response.body", "body": data, "more_body": True})
                    await send({"type": "http.response.body", "body": b""})
            except OSError:  # the client went away mid-send
                self.gone()
