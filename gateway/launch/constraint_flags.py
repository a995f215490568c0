"""`speculant generate`'s constraint flags: what the output must match (one of them at most).

- ``--json-schema FILE``: a JSON schema (or an OpenAI ``response_format`` of type
  ``json_schema``, whose ``json_schema.schema`` is used), as a file;
- ``--json-object``: any JSON object;
- ``--regex RE``: a regular expression the whole output matches;
- ``--choice TEXT`` (repeatable): one of these strings exactly;
- ``--grammar FILE``: a grammar, Lark or llama.cpp's GBNF, as a file.

Errors name the flag (InvalidArgumentError, exit status 2): a file that cannot be read, a
schema that is not JSON, and (embedded, when generation starts) a constraint the grammar engine
does not compile, with its reason.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from speculant.constraint import Constraint, json_schema_constraint
from speculant.errors import InvalidArgumentError

FLAGS = {
    "json_schema": "--json-schema",
    "json_object": "--json-object",
    "regex": "--regex",
    "choice": "--choice",
    "grammar": "--grammar",
}


def add_constraint_arguments(parser: argparse.ArgumentParser) -> None:
    """The mutually exclusive constraint flags (see the module)."""
    group = parser.add_argument_group("structured output (one at most; default: free text)")
    flags = group.add_mutually_exclusive_group()
    flags.add_argument(
        "--json-schema",
        metavar="FILE",
        default=None,
        help="the output is JSON valid against this JSON schema file (compact JSON)",
    )
    flags.add_argument("--json-object", action="store_true", help="the output is a JSON object")
    flags.add_argument("--regex", metavar="RE", default=None, help="the output matches RE")
    flags.add_argument(
        "--choice",
        metavar="TEXT",
        action="append",
        default=None,
        help="the output is one of these strings (repeat the flag for each)",
    )
    flags.add_argument(
        "--grammar",
        metavar="FILE",
        default=None,
        help="the output follows this grammar file (Lark, or llama.cpp's GBNF)",
    )


def constraint_from_args(args: argparse.Namespace) -> Constraint | None:
    """The constraint the flags give (None: none), checked; InvalidArgumentError naming the
    flag."""
    constraint = None
    if args.json_schema is not None:
        constraint = _schema_constraint(args.json_schema)
    elif args.json_object:
        constraint = Constraint("json_object")
    elif args.regex is not None:
        constraint = Constraint("regex", args.regex)
    elif args.choice:
        constraint = Constraint("choice", choices=tuple(args.choice))
    elif args.grammar is not None:
        constraint = Constraint("grammar", _read(args.grammar, "--grammar"))
    if constraint is None:
        return None
    try:
        return constraint.validate()
    except InvalidArgumentError as exc:
        raise flag_error(exc) from None


def flag_error(exc: InvalidArgumentError) -> InvalidArgumentError:
    """A constraint's error (field ``constraint.KIND``) as the error of its flag; others as
    they are."""
    kind = exc.field.removeprefix("constraint.")
    if exc.field.startswith("constraint") and kind in FLAGS:
        return InvalidArgumentError(FLAGS[kind], exc.problem)
    if exc.field == "constraint":
        return InvalidArgumentError("constraint flag", exc.problem)
    return exc


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise InvalidArgumentError(flag, f"cannot read {path}: {reason}") from None


def _schema_constraint(path: str) -> Constraint:
    """The schema file's constraint (an OpenAI json_schema response_format is unwrapped)."""
    text = _read(path, "--json-schema")
    try:
        schema = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError("--json-schema", f"{path} is not JSON: {exc}") from None
    if isinstance(schema, dict) and schema.get("type") == "json_schema":
        spec = schema.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise InvalidArgumentError(
                "--json-schema", f"{path}: a response_format needs json_schema.schema"
            )
        schema = spec["schema"]
    if not isinstance(schema, dict | bool):
        raise InvalidArgumentError("--json-schema", f"{path}: a JSON schema is an object")
    return json_schema_constraint(schema)
