"""`speculant generate`'s constraint flags (--json-schema FILE, --json-object, --regex,
--choice, --grammar FILE), embedded and over a gateway (speculant.client's constraint=), and
their errors: one line naming the flag, never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher.cli import main
from speculant.client import SpeculantClient, generate_request
from speculant.constraint import Constraint, json_schema_constraint
from tests.assets import STORIES_MODEL

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "happy": {"type": "boolean"}},
    "required": ["name", "happy"],
    "additionalProperties": False,
}
LARK = 'start: "The " ANIMAL " was " MOOD "."\nANIMAL: "dog" | "cat" | "bird"\nMOOD: /[a-z]{1,8}/\n'
PROMPT = "Once upon a time, there was a dog."


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("constraints")
    paths = {
        "schema": folder / "schema.json",
        "response_format": folder / "response_format.json",
        "grammar": folder / "animal.lark",
        "not_json": folder / "broken.json",
        "bad_schema": folder / "bad.json",
    }
    paths["schema"].write_text(json.dumps(SCHEMA))
    wrapped = {"type": "json_schema", "json_schema": {"name": "kid", "schema": SCHEMA}}
    paths["response_format"].write_text(json.dumps(wrapped))
    paths["grammar"].write_text(LARK)
    paths["not_json"].write_text("{not json")
    paths["bad_schema"].write_text(json.dumps({"type": "object", "properties": {"a": 3}}))
    return paths


def generate(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, dict | None, str]:
    """(exit status, the --json response or None, stderr) of `speculant generate ARGS`."""
    status = main(["generate", "--prompt", PROMPT, "--temperature", "0", "--json", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, (json.loads(out) if status == 0 else None), err


def embedded(graph: Path) -> list[str]:
    return ["--graph", str(graph), "--model", str(STORIES_MODEL), "--max-tokens", "40"]


def test_constraint_flags_shape_the_output_embedded(tinystories_graph, files, capsys) -> None:
    flags = embedded(tinystories_graph)
    for schema in ("schema", "response_format"):
        status, answer, err = generate(capsys, *flags, "--json-schema", str(files[schema]))
        assert status == 0, err
        value = json.loads(answer["text"])
        assert set(value) == {"name", "happy"} and answer["finish_reason"] == "eos"
    status, answer, err = generate(capsys, *flags, "--json-object")
    assert status == 0 and answer["text"].startswith("{"), err
    status, answer, err = generate(capsys, *flags, "--choice", "yes", "--choice", "no")
    assert status == 0 and answer["text"] in ("yes", "no"), err
    status, answer, err = generate(capsys, *flags, "--regex", "[A-Z][a-z]{2,6} (ran|sat)\\.")
    assert status == 0 and re.fullmatch("[A-Z][a-z]{2,6} (ran|sat)\\.", answer["text"]), err
    status, answer, err = generate(capsys, *flags, "--grammar", str(files["grammar"]))
    assert status == 0, err
    assert re.fullmatch("The (dog|cat|bird) was [a-z]{1,8}\\.", answer["text"])


def test_constraint_flags_over_a_gateway(services, tinystories_graph, files, capsys) -> None:
    remote = ["--gateway", services.gateway_address, "--max-tokens", "40"]
    status, over_gateway, err = generate(capsys, *remote, "--json-schema", str(files["schema"]))
    assert status == 0, err
    flags = embedded(tinystories_graph)
    status, local, err = generate(capsys, *flags, "--json-schema", str(files["schema"]))
    assert status == 0, err
    # greedy: the same tokens in process and over the services
    assert over_gateway["token_ids"] == local["token_ids"] and over_gateway["text"] == local["text"]
    assert over_gateway["finish_reason"] == "eos"
    status, answer, err = generate(capsys, *remote, "--choice", "yes", "--choice", "no")
    assert status == 0 and answer["text"] in ("yes", "no"), err


def test_the_client_sends_a_constraint(services) -> None:
    request = generate_request("Hi", constraint=Constraint("choice", choices=("a", "b")))
    assert list(request.constraint.choice.options) == ["a", "b"]
    assert not generate_request("Hi").HasField("constraint")
    with SpeculantClient(services.gateway_address) as client:
        kid = json_schema_constraint(SCHEMA)
        result = client.generate(PROMPT, max_tokens=40, temperature=0, constraint=kid)
        assert set(json.loads(result.text)) == {"name", "happy"}
        chunks = list(client.stream(PROMPT, max_tokens=40, temperature=0, constraint=kid))
        assert "".join(c.text_delta for c in chunks) == result.text


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--json-schema", "{missing}", "--json-schema: cannot read"),
        ("--json-schema", "not_json", "--json-schema: "),
        ("--json-schema", "bad_schema", "--json-schema: "),
        ("--grammar", "{missing}", "--grammar: cannot read"),
        ("--regex", "(unclosed", "--regex: "),
        ("--choice", "", "--choice: a choice must not be empty"),
    ],
)
def test_a_bad_constraint_is_one_error_line(
    tinystories_graph, files, tmp_path, capsys, flag, value, message
) -> None:
    if value == "{missing}":
        value = str(tmp_path / "missing.json")
    elif value in files:
        value = str(files[value])
    status, _, err = generate(capsys, *embedded(tinystories_graph), flag, value)
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith("speculant generate: error: "), err
    assert message in lines[0], lines[0]


def test_constraint_flags_exclude_each_other(capsys) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["generate", "--prompt", "Hi", "--json-object", "--regex", "a+"])
    assert caught.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
