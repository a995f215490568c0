"""A generation's output: tokens and text as the verifier emits them, checked token by token
against EOS, stop strings, max_tokens and the context length, and streamed in chunks that no
stop string can still cut.

Three parts, in the order a token meets them:

- :class:`IncrementalDetokenizer`: text deltas for streamed tokens, never splitting a character.
  Decoding each new token on its own loses context (SentencePiece drops a leading space; a
  multi-byte UTF-8 character can span several byte tokens). As in Hugging Face TGI, a short
  window of recent tokens is decoded twice, with and without the new ones, and the difference
  is emitted, held back while it ends in an incomplete character (U+FFFD).
- stop strings (:func:`find_stop_string`, :func:`safe_text_length`): where one matched, and how
  much text no stop string can still cut.
- :class:`OutputBuffer`: the generation's tokens, text and finish reason, and its chunks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from gateway.generation import FinishReason, GenerationRequest, StreamChunk
from speculant.types import TokenLogprobs

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text, one delta at a time (no full re-decoding)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, prompt_ids: list[int]) -> None:
        self._decode = decoder(tokenizer)
        # Seed the window with the prompt's tail so the first token decodes in context.
        self._tokens: list[int] = list(prompt_ids[-4:])
        self._prefix_offset = 0  # start of the decoding window
        self._read_offset = len(self._tokens)  # tokens before this are already emitted as text
        self.text = ""  # all generated text emitted so far

    def add(self, token_ids: list[int]) -> str:
        """Append generated tokens; return the newly complete text (possibly empty)."""
        self._tokens.extend(token_ids)
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._tokens[self._prefix_offset :])
        if len(full_text) > len(prefix_text) and not full_text.endswith(REPLACEMENT_CHAR):
            delta = full_text[len(prefix_text) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._tokens)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """At the end of generation: emit whatever is held back (even an incomplete character)."""
        prefix_text = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._tokens[self._prefix_offset :])
        delta = full_text[len(prefix_text) :] if full_text.startswith(prefix_text) else ""
        self._prefix_offset = self._read_offset = len(self._tokens)
        self.text += delta
        return delta


def decoder(tokenizer: PreTrainedTokenizerBase) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=True)``, straight through the Rust tokenizer
    where that is all Hugging Face's decode does (a fast tokenizer that does not clean up
    spaces, the usual case): the same text in about 40% of the time, twice a token."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    plain = (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and type(tokenizer)._decode is PreTrainedTokenizerFast._decode
        and not tokenizer.clean_up_tokenization_spaces
        and backend is not None
    )
    if plain:
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


@dataclass
class StopStringMatch:
    """A stop string found in the generated text at character `position`."""

    position: int
    stop: str


def find_stop_string(text: str, stops: list[str], search_from: int = 0) -> StopStringMatch | None:
    """The earliest occurrence of any stop string in text[search_from - longest + 1:], if any."""
    if not stops:
        return None
    longest = max(len(s) for s in stops)
    start = max(0, search_from - longest + 1)
    best: StopStringMatch | None = None
    for stop in stops:
        position = text.find(stop, start)
        if position != -1 and (best is None or position < best.position):
            best = StopStringMatch(position, stop)
    return best


def safe_text_length(text: str, stops: list[str]) -> int:
    """How much of text can be streamed without risking a later stop-string match.

    The tail that is a proper prefix of some stop string is held back until more text arrives.
    """
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                hold = max(hold, n)
                break
    return len(text) - hold


class OutputBuffer:
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
