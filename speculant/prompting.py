"""Turning a request's prompt (text, or chat messages) into the token ids the model sees.

One rule for every caller (the gateway, the embedded decoder, distillation): a text prompt is
tokenized with the tokenizer's default special tokens (e.g. a leading BOS), as the graph builder
tokenizes a document; chat messages are rendered with the tokenizer's chat template and a
generation prompt, then tokenized without adding special tokens again. The chat template is the
tokenizer's unless one is given (a server's ``--chat-template FILE``: :func:`load_chat_template`);
a request's tools are passed to it, and whether it shows them to the model is
:func:`rendered_with_tools`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from transformers import PreTrainedTokenizerBase

from speculant.errors import InvalidArgumentError

ROLES = ("system", "user", "assistant", "tool")  # the roles chat templates render


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str = "",
    messages: Sequence[Mapping[str, Any]] | None = None,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template: str | None = None,
) -> list[int]:
    """Token ids of a text prompt (with the tokenizer's default special tokens, e.g. BOS) or of
    chat messages rendered with a chat template: `chat_template` (Jinja text) when given, else
    the tokenizer's. tools: OpenAI's function tools, passed to the template (which may show
    them to the model, or not: see rendered_with_tools)."""
    if messages:
        if prompt:
            raise InvalidArgumentError("prompt", "give either a prompt or messages, not both")
        if not (chat_template or getattr(tokenizer, "chat_template", None)):
            raise InvalidArgumentError(
                "messages", "this model's tokenizer has no chat template; send a text prompt"
            )
        for i, message in enumerate(messages):
            if message.get("role") not in ROLES:
                raise InvalidArgumentError(
                    f"messages[{i}].role", "must be system, user, assistant or tool"
                )
        rendered = render_chat(tokenizer, messages, tools, chat_template)
        return list(tokenizer(rendered, add_special_tokens=False).input_ids)
    if not prompt:
        raise InvalidArgumentError("prompt", "must not be empty")
    return list(tokenizer(prompt).input_ids)


def render_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template: str | None = None,
) -> str:
    """The messages (and tools) rendered with the chat template and a generation prompt;
    InvalidArgumentError naming ``messages`` when the template cannot render them (it raises,
    or fails on a message it does not expect: a tool call, content null)."""
    try:
        return tokenizer.apply_chat_template(
            [dict(m) for m in messages],
            tools=[dict(t) for t in tools] if tools else None,
            chat_template=chat_template,
            add_generation_prompt=True,
            tokenize=False,
        )
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InvalidArgumentError(
            "messages", f"the chat template cannot render these messages: {reason}"
        ) from None


def load_chat_template(path: str | Path) -> str:
    """A chat template file's text (Jinja, as Hugging Face's templates): InvalidArgumentError
    naming ``--chat-template`` when it cannot be read or is not a Jinja template."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgumentError("--chat-template", f"cannot read {path}: {exc}") from None
    try:
        jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise InvalidArgumentError(
            "--chat-template", f"{path} is not a Jinja template: line {exc.lineno}: {exc}"
        ) from None
    return text


def rendered_with_tools(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    chat_template: str | None = None,
) -> bool:
    """Whether the chat template shows the model the tools (its text with them differs)."""
    with_tools = render_chat(tokenizer, messages, tools, chat_template)
    return with_tools != render_chat(tokenizer, messages, None, chat_template)


def token_id_prompt(
    token_ids: Sequence[int], prompt: str, messages: Sequence[object], vocab_size: int
) -> list[int]:
    """A tokenized prompt, checked: given alone (not with a text prompt or messages), and every
    id in the vocabulary [0, vocab_size)."""
    if prompt or messages:
        raise InvalidArgumentError(
            "prompt_token_ids", "give one of prompt, messages and prompt_token_ids"
        )
    for i, token in enumerate(token_ids):
        if not 0 <= token < vocab_size:
            raise InvalidArgumentError(
                f"prompt_token_ids[{i}]",
                f"token id {token} is outside the vocabulary [0, {vocab_size})",
            )
    return list(token_ids)
