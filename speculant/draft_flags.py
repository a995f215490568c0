"""Server-wide drafting defaults as command-line flags (serve-draft, serve-gateway, up), and the
drafting flags of one `generate` run.

A request that leaves a drafting field unset gets the server's default: the gateway's for
Generate (k, the draft shape, the strategy...), the draft service's for a direct Propose. These
flags set those defaults; a flag not given leaves the ``SPECULANT_DRAFT__*`` variable or the
built-in default (:class:`speculant.config.DraftConfig`), and the mixing parameters not given
anywhere stay the graph's tuned ones.
"""

from __future__ import annotations

import argparse

from speculant.config import MIXING_MODES, DraftConfig

_FIELDS = DraftConfig.model_fields
# flag -> (DraftConfig field, argparse options)
_FLAGS: dict[str, tuple[str, dict[str, object]]] = {
    "--k": ("k", {"type": int, "help": "draft tokens per round: a chain's length, a tree's depth"}),
    "--tree-nodes": (
        "tree_nodes",
        {"type": int, "help": "draft a tree of up to this many tokens (0 = a chain of k)"},
    ),
    "--strategy": (
        "strategy",
        {"choices": ["greedy", "sampling"], "help": "draft the likeliest token, or sample it"},
    ),
    "--mixing": (
        "mixing",
        {
            "choices": list(MIXING_MODES),
            "help": "how the matching orders are mixed into q (not given anywhere: the graph's "
            "tuned mode)",
        },
    ),
    "--escape-weight": (
        "escape_weight",
        {"type": float, "help": "witten-bell's escape weight (not given anywhere: the graph's)"},
    ),
    "--overlay-weight": (
        "overlay_weight",
        {"type": float, "help": "weight of the request's own context n-grams (0 = off)"},
    ),
    "--draft-size": (
        "draft_size",
        {
            "choices": ["cost", "fixed"],
            "help": "cost: verify, each round, the part of the draft that pays under the "
            "verifier's cost profile (k and tree nodes are limits); fixed: verify every drafted "
            "token",
        },
    ),
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
    for flag, (name, options) in _FLAGS.items():
        help_text = f"{options['help']} (built-in default: {_FIELDS[name].default})"
        group.add_argument(
            flag, dest=f"draft_{name}", default=None, **{**options, "help": help_text}
        )
    group.add_argument(
        "--no-attentive-mix",
        dest="draft_attentive_mix",
        action="store_const",
        const=False,
        default=None,
        help="draft from the highest matching order only (plain backoff)",
    )


_NAMES = [name for name, _ in _FLAGS.values()] + ["attentive_mix"]


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
        flag = next((f for f, (n, _) in _FLAGS.items() if n == name), None)
        where = flag or (f"SPECULANT_DRAFT__{name.upper()}" if name else "SPECULANT_DRAFT__*")
        raise InvalidArgumentError(where, first["msg"]) from None


def draft_default_argv(args: argparse.Namespace) -> list[str]:
    """The given drafting-default flags as a command line (for `up`'s children)."""
    argv: list[str] = []
    given = given_draft_defaults(args)
    for flag, (name, _) in _FLAGS.items():
        if name in given:
            argv += [flag, str(given[name])]
    if given.get("attentive_mix") is False:
        argv.append("--no-attentive-mix")
    return argv
