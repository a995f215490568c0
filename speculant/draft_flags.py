"""Server-wide drafting defaults as command-line flags (serve-draft, serve-gateway, up), and the
drafting flags of one `generate` run.

A request that leaves a drafting field unset gets the server's default: the gateway's for
Generate (k, the draft shape, the strategy...), the draft service's for a direct Propose. These
flags set those defaults; a flag not given leaves the ``SPECULANT_DRAFT__*`` variable or the
built-in default (:class:`speculant.config.DraftConfig`), and the mixing parameters not given
anywhere stay the graph's tuned ones. Each flag's type or choices, help and default shown are
its DraftConfig field's; the other settings' flags (serve-verifier's and up's for the verifier)
derive theirs from their fields the same way (:func:`flag_options`).
"""

from __future__ import annotations

import argparse
from types import NoneType
from typing import Literal, get_args, get_origin

from pydantic import BaseModel

from speculant.config import DraftConfig

_FIELDS = DraftConfig.model_fields
# The DraftConfig fields with a flag (--k, --tree-nodes, ...), each flag's type, help and
# default shown being its field's (DRAFT_FLAGS: flag -> field)
_FLAG_FIELDS = [
    "k",
    "tree_nodes",
    "strategy",
    "mixing",
    "escape_weight",
    "overlay_weight",
    "draft_size",
]
DRAFT_FLAGS = {f"--{name.replace('_', '-')}": name for name in _FLAG_FIELDS}


def flag_options(model: type[BaseModel], name: str, given_only: bool = True) -> dict[str, object]:
    """argparse options of a settings field's flag: its choices (a Literal) or type, its help
    (the field's description and default) and its default: None (given_only: a flag not given
    leaves the environment variable or the built-in default) or the field's."""
    info = model.model_fields[name]
    if get_origin(info.annotation) is Literal:
        kind: dict[str, object] = {"choices": list(get_args(info.annotation))}
    else:
        types = get_args(info.annotation) or (info.annotation,)
        kind = {"type": next(t for t in types if t is not NoneType)}
    shown = "none" if info.default is None else info.default
    return {
        **kind,
        "default": None if given_only else info.default,
        "help": f"{info.description} (built-in default: {shown})",
    }


SERVER_DEFAULTS_TITLE = (
    "drafting defaults (for requests that leave a field unset; "
    "default: SPECULANT_DRAFT__* or the built-in value)"
)


def add_draft_default_arguments(
    parser: argparse.ArgumentParser, title: str = SERVER_DEFAULTS_TITLE
) -> None:
    """The drafting flags, in their own group; each defaults to None (not given). A server's
    flags set its defaults for requests; `generate`'s set its own run's drafting."""
    group = parser.add_argument_group(title)
    for flag, name in DRAFT_FLAGS.items():
        group.add_argument(flag, dest=f"draft_{name}", **flag_options(DraftConfig, name))
    group.add_argument(
        "--no-attentive-mix",
        dest="draft_attentive_mix",
        action="store_const",
        const=False,
        default=None,
        help="draft from the highest matching order only (plain backoff)",
    )


_NAMES = [*DRAFT_FLAGS.values(), "attentive_mix"]


def given_draft_defaults(args: argparse.Namespace) -> dict[str, object]:
    """The drafting defaults given as flags: {DraftConfig field: value}."""
    values = {name: getattr(args, f"draft_{name}", None) for name in _NAMES}
    return {name: value for name, value in values.items() if value is not None}


def draft_defaults_from_args(args: argparse.Namespace) -> DraftConfig:
    """DraftConfig of the flags over SPECULANT_DRAFT__* and the built-in defaults; a bad value
    raises InvalidArgumentError naming its flag."""
    from pydantic import ValidationError

    from speculant.errors import InvalidArgumentError

    try:
        return DraftConfig(**given_draft_defaults(args))
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        flag = next((f for f, n in DRAFT_FLAGS.items() if n == name), None)
        where = flag or (f"SPECULANT_DRAFT__{name.upper()}" if name else "SPECULANT_DRAFT__*")
        raise InvalidArgumentError(where, first["msg"]) from None


def draft_default_argv(args: argparse.Namespace) -> list[str]:
    """The given drafting-default flags as a command line (for `up`'s children)."""
    argv: list[str] = []
    given = given_draft_defaults(args)
    for flag, name in DRAFT_FLAGS.items():
        if name in given:
            argv += [flag, str(given[name])]
    if given.get("attentive_mix") is False:
        argv.append("--no-attentive-mix")
    return argv
