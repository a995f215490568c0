"""Refusing a prompt too long for the model's context before tokenizing it.

Tokenizing costs time and memory in proportion to the text (a 15 MB prompt: 16 s and 2 GB), so
the gateway first compares the prompt's length in characters with a bound that no prompt which
fits the context can reach: a token stands for at most *max token chars* characters (its
vocabulary entry's length, added tokens included: a byte-level or byte-fallback entry is at
least as long as the text it decodes to), so a prompt of n tokens has at most
n * max_token_chars characters. The bound allows SLACK times that, for normalizers that fold
characters before tokenizing; a prompt under it is tokenized and checked exactly, token by token.
"""

from __future__ import annotations

from collections.abc import Sequence

from speculant.errors import OutOfRangeError

SLACK = 4


def max_token_chars(tokenizer: object) -> int:
    """The most characters one token of the tokenizer stands for (at least 1)."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))  # type: ignore[attr-defined]
    return max((len(t) for t in tokens if isinstance(t, str)), default=1) or 1


def check_prompt_chars(
    prompt: str, messages: Sequence[dict[str, str]], limit: int, max_context_tokens: int
) -> None:
    """OUT_OF_RANGE, before any tokenizing, when the prompt (or the messages' contents) has
    more than `limit` characters."""
    chars = len(prompt) + sum(len(m.get("content", "")) for m in messages)
    if chars > limit:
        field = "messages" if messages else "prompt"
        raise OutOfRangeError(
            f"{field}: {chars} characters cannot fit the model's context of "
            f"{max_context_tokens} tokens (at most {limit} characters with this tokenizer)"
        )
