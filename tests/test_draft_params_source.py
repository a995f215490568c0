"""One source for the drafting parameters: speculant.config.DraftConfig (fields, bounds,
defaults). The wire (DraftOptions in common.proto, ProposeRequest in draft.proto), DraftParams
and every command's drafting flags are checked against it here, so they cannot drift apart."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from launcher.cli import _subparsers, build_parser
from speculant.config import DraftConfig, DraftParams
from speculant.v1 import common_pb2, draft_pb2
from speculant.wire import GATEWAY_SIDE_FIELDS

PROTOS = Path(__file__).resolve().parent.parent / "protos" / "speculant" / "v1"
GATEWAY_ONLY = set(GATEWAY_SIDE_FIELDS)  # the coordinator's choices: not sent to the draft service
OPTIONS = common_pb2.DraftOptions.DESCRIPTOR.fields_by_name
PROPOSE = draft_pb2.ProposeRequest.DESCRIPTOR.fields_by_name


def _field_comments(proto: str, message: str) -> dict[str, str]:
    """{field name: its trailing comment and the comment block right above it}."""
    text = (PROTOS / proto).read_text(encoding="utf-8")
    body = re.search(rf"message {message} \{{(.*?)\n\}}", text, re.S).group(1)
    comments: dict[str, str] = {}
    above: list[str] = []
    for line in body.splitlines():
        stripped = line.strip()
        if stripped.startswith("//"):
            above.append(stripped[2:])
            continue
        field = re.match(r"(?:optional |repeated )?\w+ (\w+) = \d+;\s*(?://(.*))?", stripped)
        if field:
            comments[field.group(1)] = " ".join([*above, field.group(2) or ""])
        above = []
    return comments


def _default_in(comment: str) -> str | None:
    match = re.search(r'default:? ("[^"]+"|[\w.]+)', comment) or re.search(
        r'("[\w-]+") \(default\)', comment
    )
    return match.group(1).strip('"') if match else None


def _same(written: str, value: object) -> bool:
    if isinstance(value, bool):
        return written == str(value).lower()
    if isinstance(value, int | float):
        return float(written) == float(value)
    return written == str(value)


def test_draft_options_and_propose_request_carry_the_same_parameters():
    config = set(DraftConfig.model_fields)
    params = {f.name for f in fields(DraftParams)}
    assert set(OPTIONS) == config, "DraftOptions fields != DraftConfig fields"
    assert params == config, "DraftParams fields != DraftConfig fields"
    for name in config - GATEWAY_ONLY:
        assert name in PROPOSE, f"ProposeRequest lacks {name}"
        assert PROPOSE[name].type == OPTIONS[name].type, f"{name}: types differ on the wire"
        optional = OPTIONS[name].type != FieldDescriptor.TYPE_ENUM
        assert PROPOSE[name].has_presence == OPTIONS[name].has_presence == optional, name


@pytest.mark.parametrize(
    ("proto", "message"), [("common.proto", "DraftOptions"), ("draft.proto", "ProposeRequest")]
)
def test_the_defaults_and_ranges_the_protos_state_are_the_configs(proto, message):
    comments = _field_comments(proto, message)
    stated = 0
    for name, info in DraftConfig.model_fields.items():
        comment = comments.get(name, "")
        written = _default_in(comment)
        if written is not None:
            stated += 1
            assert _same(written, info.default), f"{message}.{name}: says default {written}"
        bounds = re.search(r"(\d+)\.\.(\d+)", comment)
        if bounds:
            low = next(m.ge for m in info.metadata if getattr(m, "ge", None) is not None)
            high = next(m.le for m in info.metadata if getattr(m, "le", None) is not None)
            assert (int(bounds.group(1)), int(bounds.group(2))) == (low, high), name
    assert stated >= 4, f"{message}: too few defaults stated to check ({stated})"


def test_every_drafting_flag_defaults_to_the_config_or_leaves_it_to_the_server():
    """A flag named like a DraftConfig field defaults to None (unset: the server's default, the
    help naming the built-in one) or to the DraftConfig default itself."""
    checked = 0
    for parser in _subparsers(build_parser()):
        for action in parser._actions:
            for name, info in DraftConfig.model_fields.items():
                if f"--{name.replace('_', '-')}" not in action.option_strings:
                    continue
                default = action.default
                if action.nargs == 0 or isinstance(default, list | tuple):
                    continue  # a switch (its presence is the value), or a sweep of values
                checked += 1
                if default is None or default == argparse.SUPPRESS:
                    assert "default" in (action.help or ""), f"{parser.prog} {name}"
                else:
                    assert default == info.default, f"{parser.prog} --{name}: {default}"
    assert checked >= 10
