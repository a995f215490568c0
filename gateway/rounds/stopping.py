"""When generation stops: EOS tokens, stop strings, max_tokens and the model's context length."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class FinishReason(StrEnum):
    """Why generation ended (mirrors speculant.v1.FinishReason)."""

    EOS = "eos"  # the model emitted an end-of-sequence token (not returned)
    MAX_TOKENS = "max_tokens"
    STOP = "stop"  # a stop string was generated (not returned)
    CONTEXT_LENGTH = "context_length"  # the model's context window is full


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
