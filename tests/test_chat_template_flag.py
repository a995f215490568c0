"""``--chat-template FILE`` of serve-gateway and up: read and checked at start-up (one error line
naming the flag), passed on by up to its gateway as an absolute path."""

from __future__ import annotations

import argparse

import pytest

from gateway.launch.commands import chat_template_from_args
from speculant.errors import InvalidArgumentError
from tests.assets import STORIES_MODEL
from tests.structured_http import TOOLS_TEMPLATE


def _up_args(*extra: str) -> argparse.Namespace:
    from launcher.cli import build_parser

    argv = ["up", "--graph", "g", "--model", str(STORIES_MODEL), "--device", "cpu", *extra]
    return build_parser().parse_args(argv)


def test_up_passes_the_chat_template_to_its_gateway_as_an_absolute_path(monkeypatch):
    from gateway.launch.up_plan import plan_up
    from launcher.cli import build_parser

    monkeypatch.chdir(TOOLS_TEMPLATE.parent)
    gateway = plan_up(_up_args("--chat-template", TOOLS_TEMPLATE.name)).children[2]
    given = gateway.argv[gateway.argv.index("--chat-template") + 1]
    assert given == str(TOOLS_TEMPLATE)
    served = build_parser().parse_args(gateway.argv)
    assert chat_template_from_args(served) == TOOLS_TEMPLATE.read_text(encoding="utf-8")
    assert "--chat-template" not in plan_up(_up_args()).children[2].argv


def test_up_refuses_a_chat_template_that_does_not_load_before_starting_anything(tmp_path):
    from gateway.launch.up_plan import plan_up, validate_plan
    from speculant.cli_errors import CommandError

    broken = tmp_path / "broken.jinja"
    broken.write_text("{% if messages %}")
    for path in (broken, tmp_path / "missing.jinja"):
        args = _up_args("--chat-template", str(path))
        with pytest.raises(CommandError) as error:
            validate_plan(plan_up(args), args)
        assert "--chat-template" in str(error.value) and str(path) in str(error.value)


def test_serve_gateway_reads_its_chat_template_file(tmp_path):
    from launcher.cli import build_parser

    base = ["serve-gateway", "--draft", "a:1", "--verifier", "b:2"]
    parser = build_parser()
    assert chat_template_from_args(parser.parse_args(base)) is None
    args = parser.parse_args([*base, "--chat-template", str(tmp_path / "none.jinja")])
    with pytest.raises(InvalidArgumentError) as error:
        chat_template_from_args(args)
    assert error.value.field == "--chat-template"
