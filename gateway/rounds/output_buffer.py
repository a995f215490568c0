"""A generation's output: tokens and text as the verifier emits them, checked token by token
against EOS, stop strings, max_tokens and the context length, and streamed in chunks that no
stop string can still cut."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from gateway.generation import GenerationRequest, StreamChunk
from gateway.rounds.detokenizer import IncrementalDetokenizer
from gateway.rounds.stopping import FinishReason, find_stop_string, safe_text_length
from speculant.types import TokenLogprobs


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
