"""Constrained prompt records for the tests (bench generate, distill): tight schemas and a
tool with an enum argument, which stories260K answers within a few dozen tokens."""

from __future__ import annotations

import json
from pathlib import Path

KID = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "happy": {"type": "boolean"}},
    "required": ["name", "happy"],
    "additionalProperties": False,
}
CARD = {
    "type": "object",
    "properties": {
        "mood": {"type": "string", "enum": ["happy", "sad", "angry"]},
        "age": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["mood", "age"],
    "additionalProperties": False,
}
PLAY = {
    "type": "function",
    "function": {
        "name": "play",
        "description": "Play with a toy.",
        "parameters": {
            "type": "object",
            "properties": {"toy": {"type": "string", "enum": ["ball", "doll", "kite"]}},
            "required": ["toy"],
            "additionalProperties": False,
        },
    },
}


def response_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "s", "strict": True, "schema": schema}}


def constrained_rows() -> list[dict]:
    """Two prompts of each kind: extract and card (response_format), tool (tools, required)."""
    tool = {"tools": [PLAY], "tool_choice": "required", "parallel_tool_calls": False}
    return [
        {"prompt": "Once upon a time, there was a girl named Lily.", "kind": "extract"}
        | {"response_format": response_format(KID)},
        {"prompt": "Tom was a big dog. He was sad.", "kind": "card"}
        | {"response_format": response_format(CARD)},
        {"prompt": "Sue wanted to play with her ball.", "kind": "tool"} | tool,
        {"prompt": "One day, a little bird sat on a tree.", "kind": "extract"}
        | {"response_format": response_format(KID)},
        {"prompt": "Max was happy. He ran to the park.", "kind": "card"}
        | {"response_format": {"type": "json_object"}},
        {"prompt": "Ben had a red kite.", "kind": "tool"} | tool,
    ]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
