"""Prompts: text with the tokenizer's default special tokens, or chat messages via the template;
distillation's passage prompts (corpus passages with an instruction) and prompts files."""

from __future__ import annotations

import numpy as np
import pytest

from distill.prompts import (
    PASSAGE_TEMPLATES,
    corpus_passages,
    corpus_prompts,
    file_prompts,
    passages,
    write_prompts,
)
from speculant.errors import InvalidArgumentError
from speculant.prompting import encode_prompt
from speculant.tokenizer import load_tokenizer
from tests.assets import PHI3_TOKENIZER, STORIES_MODEL, STORY_SEPARATOR, TINYSTORIES_CORPUS, needs


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


def passage_of(content: str, template: str) -> str | None:
    """The passage in a prompt's content made with template, or None if it is not."""
    before, after = template.split("{passage}")
    if content.startswith(before) and content.endswith(after):
        return content[len(before) : len(content) - len(after)]
    return None


def test_passage_prompts_are_corpus_passages_in_a_template():
    corpus = TINYSTORIES_CORPUS.read_text(encoding="utf-8")
    draw = dict(doc_separator=STORY_SEPARATOR, min_words=20, max_words=60)
    prompts = corpus_passages([str(TINYSTORIES_CORPUS)], 30, seed=3, **draw)
    assert prompts == corpus_passages([str(TINYSTORIES_CORPUS)], 30, seed=3, **draw)
    assert prompts != corpus_passages([str(TINYSTORIES_CORPUS)], 30, seed=4, **draw)
    for prompt in prompts:
        assert len(prompt.messages) == 1 and prompt.messages[0][0] == "user" and not prompt.text
        passage = passage_of(prompt.messages[0][1], PASSAGE_TEMPLATES[prompt.kind])
        assert passage is not None and passage in corpus  # verbatim
        assert 20 <= len(passage.split()) <= 60 and passage == passage.strip()
    kinds = [p.kind for p in prompts]
    assert kinds[: len(PASSAGE_TEMPLATES)] == list(PASSAGE_TEMPLATES)  # in turn
    assert len({p.messages for p in prompts}) == 30
    only = corpus_passages([str(TINYSTORIES_CORPUS)], 4, templates=("program",), **draw)
    assert {p.kind for p in only} == {"program"}


def test_passages_end_at_natural_breaks():
    sentences = [f"Sentence {i} has {'some ' * (i % 4)}words." for i in range(40)]
    document = " ".join(sentences[:20]) + "\n\n" + " ".join(sentences[20:])
    cut = list(passages(document, np.random.default_rng(0), 8, 20))
    at = 0
    for passage in cut:  # consecutive, each ending a sentence
        at = document.index(passage, at) + len(passage)
        assert passage.endswith(".") and 8 <= len(passage.split()) <= 20
    assert cut[-1].endswith("Sentence 39 has some some some words.")
    assert sum(len(p.split()) for p in cut) == len(document.split())  # nothing left out here


def test_written_prompts_read_back(tmp_path):
    path = tmp_path / "prompts.jsonl"
    prompts = corpus_passages([str(TINYSTORIES_CORPUS)], 3, doc_separator=STORY_SEPARATOR)
    prompts += corpus_prompts([str(TINYSTORIES_CORPUS)], 2, doc_separator=STORY_SEPARATOR)
    write_prompts(path, prompts)
    assert file_prompts(path) == prompts
