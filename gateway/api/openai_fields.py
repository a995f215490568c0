"""The fields of an OpenAI request body, type-checked one by one: each check raises
InvalidArgumentError naming the field as the client sent it (``prompt[1]``, ``messages[0]``)."""

from __future__ import annotations

import math
from typing import Any

from speculant.errors import InvalidArgumentError

MAX_TOKEN_ID = 2**31 - 1  # an int32 on the wire


def check_type(body: dict[str, Any], name: str, types: tuple[type, ...], what: str) -> Any:
    """body[name] (None when absent or null), which must be one of types (never a bool unless
    bool is one of them; never a NaN or infinite number)."""
    value = body.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise InvalidArgumentError(name, f"must be {what}, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgumentError(name, f"must be a finite number, got {value}")
    return value


def check_range(name: str, value: int | float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise InvalidArgumentError(name, f"must be in [{low:g}, {high:g}], got {value}")


def stop_strings(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise InvalidArgumentError("stop", "must be a string or a list of strings")


def is_token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def token_ids(field: str, ids: list[int]) -> tuple[int, ...]:
    for position, token in enumerate(ids):
        if not 0 <= token <= MAX_TOKEN_ID:
            raise InvalidArgumentError(f"{field}[{position}]", f"not a token id: {token}")
    return tuple(ids)
