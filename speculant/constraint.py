"""What a request's output must match (constrained decoding): the :class:`Constraint` record,
its kinds and the bounds checked before compiling it. The grammar engine that compiles and
follows it is :mod:`speculant.grammar`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from speculant.errors import InvalidArgumentError

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
CONSTRAINT_KINDS: tuple[ConstraintKind, ...] = (
    "json_schema",
    "json_object",
    "regex",
    "choice",
    "grammar",
)
MAX_CONSTRAINT_CHARS = 128 * 1024  # a schema's JSON, a regex, a grammar or all choices together
MAX_CHOICES = 1024


@dataclass(frozen=True)
class Constraint:
    """What the output must match: ``kind`` and its text (a JSON schema as JSON text, a regex, a
    grammar; empty for json_object) or, for a choice, the strings allowed (``choices``)."""

    kind: ConstraintKind
    text: str = ""
    choices: tuple[str, ...] = ()

    @property
    def field(self) -> str:
        """The request field that names this constraint, for errors."""
        return f"constraint.{self.kind}"

    def validate(self) -> Constraint:
        """InvalidArgumentError naming the field unless the constraint is well formed and
        within MAX_CONSTRAINT_CHARS (compiling checks the rest)."""
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidArgumentError("constraint", f"unknown kind {self.kind!r}")
        size = len(self.text) + sum(len(c) for c in self.choices)
        if size > MAX_CONSTRAINT_CHARS:
            raise InvalidArgumentError(
                self.field, f"{size} characters; at most {MAX_CONSTRAINT_CHARS} are accepted"
            )
        if self.kind == "choice":
            if not self.choices or len(self.choices) > MAX_CHOICES:
                raise InvalidArgumentError(
                    self.field, f"give 1 to {MAX_CHOICES} strings, got {len(self.choices)}"
                )
            if any(not c for c in self.choices):
                raise InvalidArgumentError(self.field, "a choice must not be empty")
        elif self.kind == "json_schema":
            try:
                schema = json.loads(self.text)
            except ValueError as exc:
                raise InvalidArgumentError(self.field, f"not valid JSON: {exc}") from exc
            if not isinstance(schema, dict | bool):
                raise InvalidArgumentError(self.field, "a JSON schema is an object")
        elif self.kind != "json_object" and not self.text:
            raise InvalidArgumentError(self.field, "must not be empty")
        return self


def json_schema_constraint(schema: object) -> Constraint:
    """A json_schema Constraint of a schema given as a dict (or JSON text)."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    return Constraint("json_schema", text)
