"""One source for the drafting parameters: speculant.config.DraftConfig (fields, bounds,
defaults, help). The wire (DraftOptions in common.proto, ProposeRequest in draft.proto),
DraftParams, the docs rows and every command's drafting flags are checked against it here, so
they cannot drift apart. Likewise the sampling controls: SamplingControls' fields against the
wire, the HTTP bodies, GenerationConfig and the docs rows."""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from gateway.api.bodies import CompletionBody, SamplingFields
from launcher.cli import all_subparsers, build_parser
from speculant.config import (
    SAMPLING_CONTROLS,
    TUNABLE_FIELDS,
    DraftConfig,
    DraftParams,
    GenerationConfig,
    SamplingControls,
)
from speculant.v1 import common_pb2, draft_pb2
from speculant.wire import GATEWAY_SIDE_FIELDS
from tests.assets import ROOT

PROTOS = Path(__file__).resolve().parent.parent / "protos" / "speculant" / "v1"
GATEWAY_ONLY = set(GATEWAY_SIDE_FIELDS)  # the coordinator's choices: not sent to the draft service
OPTIONS = common_pb2.DraftOptions.DESCRIPTOR.fields_by_name
PROPOSE = draft_pb2.ProposeRequest.DESCRIPTOR.fields_by_name
# GenerationConfig's fields beside the sampling controls
GENERATION_ONLY = {"max_tokens", "temperature", "seed", "stop", "top_logprobs", "constraint"}


def _documented(model: str) -> set[str]:
    """The fields of the settings model with a row in docs/configuration.md."""
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    return set(re.findall(rf"^\| `{model}\.(\w+)` \|", text, re.M))


def _differ(declared: set[str], places: dict[str, set[str]]) -> list[str]:
    return [
        f"{where}: lacks {sorted(declared - names)}, adds {sorted(names - declared)}"
        for where, names in places.items()
        if names != declared
    ]


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
    places = {
        "DraftOptions (common.proto)": set(OPTIONS),
        "DraftParams": params,
        "docs/configuration.md (run scripts/config_table.py)": _documented("DraftConfig"),
    }
    assert not _differ(config, places), f"DraftConfig's fields differ: {_differ(config, places)}"
    for field in fields(DraftParams):  # unset mixing parameters are the graph's tuned ones
        default = (
            None if field.name in TUNABLE_FIELDS else DraftConfig.model_fields[field.name].default
        )
        assert field.default == default, f"DraftParams.{field.name} defaults to {field.default}"
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
    for parser in all_subparsers(build_parser()):
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


def test_the_sampling_controls_are_declared_once():
    """A sampling control is a SamplingControls field (with its bounds and help); the wire, the
    HTTP bodies, GenerationConfig and the docs carry exactly those."""
    declared = {f.name for f in fields(SamplingControls)}
    wire = common_pb2.SamplingControls.DESCRIPTOR.fields_by_name
    places = {
        "SamplingControls (common.proto)": set(wire),
        "the HTTP sampling fields": set(SamplingFields.model_fields),
        "CompletionBody": set(CompletionBody.model_fields) & declared,
        "GenerationConfig": set(GenerationConfig.model_fields) - GENERATION_ONLY,
        "docs/configuration.md (run scripts/config_table.py)": _documented("GenerationConfig")
        - GENERATION_ONLY,
    }
    assert not _differ(declared, places), f"sampling controls differ: {_differ(declared, places)}"
    comments = _field_comments("common.proto", "SamplingControls")
    for name, control in SAMPLING_CONTROLS.items():  # the declared type, bounds and off value
        double = wire[name].type == FieldDescriptor.TYPE_DOUBLE
        assert control.kind is (float if double else int), name
        assert wire[name].has_presence, f"{name}: unset must read as unset on the wire"
        if stated := re.search(r"\[([-\d.]+), ([-\d.]+)\]", comments[name]):
            bounds = (control.bounds.get("ge"), control.bounds.get("le"))
            assert tuple(map(float, stated.groups())) == bounds, f"common.proto {name}: {stated[0]}"
        if off := re.search(r"([\d.]+) = off", comments[name]):
            assert float(off[1]) == control.off, f"common.proto {name}: says {off[0]}"
