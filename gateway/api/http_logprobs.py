"""Texts of reported tokens, for OpenAI's ``logprobs``: each generated token and each of its
alternatives as the text it adds after the tokens generated before it.

A token decoded alone can lose its context (SentencePiece drops the leading space of a text's
first word), so, as gateway.rounds.output does for the streamed text, a short window of the
previous tokens is decoded with and without the token and the difference taken. The window
starts with an *anchor* token (the encoding of "a"), so the first generated token keeps its
leading space too. A byte token (``<0xE2>``) of a character split over several tokens has no
text of its own (U+FFFD); its ``bytes`` are the byte itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from transformers import PreTrainedTokenizerBase

if TYPE_CHECKING:
    from speculant.types import TokenLogprobs

WINDOW = 4  # previous tokens decoded with each token
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# A log-probability of 0 probability (an alternative a warper removed) has no JSON number:
# reported as this, as vLLM does.
MIN_LOGPROB = -9999.0


@dataclass(frozen=True)
class TokenText:
    """A token as OpenAI reports it: its text and its UTF-8 bytes."""

    text: str
    bytes: list[int]


@dataclass(frozen=True)
class LogprobEntry:
    """One generated token: its text, log-probability and most likely alternatives."""

    token: TokenText
    logprob: float
    top: tuple[tuple[TokenText, float], ...]  # most likely first


def finite_logprob(value: float) -> float:
    """value, or MIN_LOGPROB for -inf / NaN (JSON has no such numbers)."""
    return value if math.isfinite(value) else MIN_LOGPROB


class TokenTexts:
    """The texts of one choice's generated tokens, in order (it remembers the previous ones)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._anchor: list[int] = tokenizer.encode("a", add_special_tokens=False)[-1:]
        self._previous: list[int] = []

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)

    def _text(self, context: list[int], base: str, token_id: int) -> TokenText:
        full = self._decode([*context, token_id])
        text = full[len(base) :] if full.startswith(base) else self._decode([token_id])
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        byte = _BYTE_PIECE.fullmatch(piece) if isinstance(piece, str) else None
        return TokenText(text, [int(byte.group(1), 16)] if byte else list(text.encode()))

    def entries(self, logprobs: Sequence[TokenLogprobs]) -> list[LogprobEntry]:
        """The entries of the next tokens (one per TokenLogprobs, in order)."""
        out = []
        for reported in logprobs:
            context = self._anchor + self._previous[-WINDOW:]
            base = self._decode(context)
            top = tuple(
                (self._text(context, base, token), finite_logprob(logprob))
                for token, logprob in zip(
                    reported.top_token_ids, reported.top_logprobs, strict=True
                )
            )
            token = self._text(context, base, reported.token_id)
            out.append(LogprobEntry(token, finite_logprob(reported.logprob), top))
            self._previous.append(reported.token_id)
        return out
