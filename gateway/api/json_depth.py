"""How deeply a JSON body nests, found before it is parsed.

Python's json module parses arrays and objects recursively: a body nested about a thousand levels
deep (``{"prompt": [[[[...]]]]}``) raises RecursionError, and a shallower one can still raise it
later, in code that walks or prints the value. The HTTP API refuses such a body up front as a bad
request that names the field whose value nests too deeply. Real requests nest a few levels (chat
messages with content parts: five).
"""

from __future__ import annotations

import re

MAX_JSON_DEPTH = 64  # arrays and objects inside one another that a request body may have

# A JSON string (its escapes included) or one bracket: the only tokens that matter for depth.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


class TooDeep(ValueError):
    """The body nests more than MAX_JSON_DEPTH levels; field: the top-level key whose value does
    ("" when the body is not an object)."""

    def __init__(self, field: str, limit: int) -> None:
        where = f"{field}: " if field else ""
        super().__init__(f"{where}arrays and objects nested more than {limit} levels deep")
        self.field = field


def check_depth(data: bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise TooDeep if `data` (a JSON text, not yet parsed) nests deeper than `limit`.

    One regular-expression pass over strings and brackets; malformed JSON is left to the parser.
    The field named is the last string read at the top level before the value that went too
    deep opened: in an object, that value's key.
    """
    depth = 0
    in_object = False  # the body is an object (its top-level strings are keys and values)
    key = ""  # the last top-level string: the key of the value that follows it
    field = ""  # the top-level key of the value being read
    for token in _TOKENS.finditer(data):
        text = token.group()
        if text in (b"[", b"{"):
            depth += 1
            if depth == 1:
                in_object = text == b"{"
            elif depth == 2:
                field = key if in_object else ""
            if depth > limit:
                raise TooDeep(field, limit)
        elif text in (b"]", b"}"):
            depth -= 1
        elif depth == 1:
            key = text[1:-1].decode("utf-8", "replace")
