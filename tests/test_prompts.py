"""Prompts: text with the tokenizer's default special tokens, or chat messages via the template."""

from __future__ import annotations

import pytest

from speculant.errors import InvalidArgumentError
from speculant.prompting import encode_prompt
from speculant.tokenizer import load_tokenizer
from tests.conftest import PHI3_TOKENIZER, STORIES_MODEL, needs


def test_text_prompt_gets_the_default_special_tokens():
    tokenizer = load_tokenizer(str(STORIES_MODEL))
    ids = encode_prompt(tokenizer, "Once upon a time")
    assert ids[0] == tokenizer.bos_token_id == 1
    assert ids == tokenizer("Once upon a time").input_ids


@needs(PHI3_TOKENIZER)
def test_chat_messages_use_the_chat_template():
    tokenizer = load_tokenizer(str(PHI3_TOKENIZER))
    messages = [{"role": "user", "content": "Tell me a story."}]
    ids = encode_prompt(tokenizer, messages=messages)
    rendered = tokenizer.decode(ids)
    assert "Tell me a story." in rendered
    assert "<|user|>" in rendered and rendered.rstrip().endswith("<|assistant|>")


def test_chat_messages_without_a_template_are_invalid():
    tokenizer = load_tokenizer(str(STORIES_MODEL))
    with pytest.raises(InvalidArgumentError) as info:
        encode_prompt(tokenizer, messages=[{"role": "user", "content": "hi"}])
    assert info.value.field == "messages"


@needs(PHI3_TOKENIZER)
@pytest.mark.parametrize(
    ("prompt", "messages", "field"),
    [
        ("", None, "prompt"),
        ("x", [{"role": "user", "content": "y"}], "prompt"),
        ("", [{"role": "robot", "content": "y"}], "messages[0].role"),
    ],
)
def test_bad_prompts_name_the_field(prompt, messages, field):
    tokenizer = load_tokenizer(str(PHI3_TOKENIZER))
    with pytest.raises(InvalidArgumentError) as info:
        encode_prompt(tokenizer, prompt, messages)
    assert info.value.field == field
