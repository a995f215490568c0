"""A chat request's ``messages``, checked and put in the form chat templates take (Hugging
Face's convention): ``{"role", "content"}``, plus an assistant's ``tool_calls`` (each
``{"id", "type": "function", "function": {"name", "arguments": <the arguments as an object>}}``)
and a tool message's ``tool_call_id`` (and ``name``, when given).

Roles: ``system`` (and OpenAI's ``developer``, rendered as system), ``user``, ``assistant``,
``tool``. Content: a string, or OpenAI's list of ``{"type": "text", "text": ...}`` parts
(joined); an assistant's content may be null or absent when it makes tool calls. Other keys of
a message (``refusal``, ``annotations``, ... as clients send a previous answer back) are left
out. Errors name the field as the client sent it (``messages[1].tool_calls[0].function``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from speculant.errors import InvalidArgumentError

ROLES = {  # as the client names a role -> as the chat template gets it
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


class _Function(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    arguments: str  # JSON text, as OpenAI gives it


class _ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str = ""
    type: Literal["function"] = "function"
    function: _Function


_TOOL_CALLS = TypeAdapter(list[_ToolCall])


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's messages in the chat template's form (see the module)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages", "must be a non-empty list of messages")
    return [_message(f"messages[{i}]", message) for i, message in enumerate(messages)]


def _message(where: str, message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidArgumentError(where, "must be an object with a string role")
    role = ROLES.get(message["role"])
    if role is None:
        raise InvalidArgumentError(
            f"{where}.role", "must be system, developer, user, assistant or tool"
        )
    out: dict[str, Any] = {"role": role}
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        out["tool_calls"] = _tool_calls(f"{where}.tool_calls", calls)
    elif calls is not None and calls != []:
        raise InvalidArgumentError(f"{where}.tool_calls", "only an assistant's message has them")
    content = message.get("content")
    out["content"] = None if content is None and "tool_calls" in out else _content(where, content)
    for key in ("tool_call_id", "name"):
        value = message.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise InvalidArgumentError(f"{where}.{key}", "must be a string")
            out[key] = value
    return out


def _content(where: str, content: Any) -> str:
    """A message's text: a string, or OpenAI's list of content parts of type text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise InvalidArgumentError(
                    f"{where}.content[{j}]", "only parts of type 'text' are supported"
                )
            texts.append(part.get("text"))
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise InvalidArgumentError(f"{where}.content", "must be a string or a list of text parts")


def _tool_calls(where: str, calls: Any) -> list[dict[str, Any]]:
    """An assistant's tool calls, each with its arguments as an object (what templates
    render with ``tojson``)."""
    try:
        parsed = _TOOL_CALLS.validate_python(calls)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        raise InvalidArgumentError(f"{where}{path}", error["msg"]) from None
    out = []
    for j, call in enumerate(parsed):
        try:
            arguments = json.loads(call.function.arguments)
        except ValueError as exc:
            raise InvalidArgumentError(
                f"{where}[{j}].function.arguments", f"must be JSON text: {exc}"
            ) from None
        function = {"name": call.function.name, "arguments": arguments}
        out.append({"id": call.id, "type": "function", "function": function})
    return out
