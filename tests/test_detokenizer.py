"""Streamed text deltas never split a multi-byte character and add up to the full text."""

from __future__ import annotations

import random

import pytest

from gateway.rounds.output import (
    REPLACEMENT_CHAR,
    IncrementalDetokenizer,
    decoder,
    find_stop_string,
    safe_text_length,
)
from speculant.tokenizer import load_tokenizer
from tests.assets import GPT2_TOKENIZER, SMOLLM2_MODEL, STORIES_MODEL, needs

TEXT = " Le café était naïf. 東京へ行く ☕🙂 and then\n\nthe end."


@pytest.mark.parametrize(
    "tokenizer_dir", [STORIES_MODEL, pytest.param(GPT2_TOKENIZER, marks=needs(GPT2_TOKENIZER))]
)
def test_deltas_are_whole_characters(tokenizer_dir):
    tokenizer = load_tokenizer(str(tokenizer_dir))
    prompt = tokenizer("Hello").input_ids
    tokens = tokenizer(TEXT, add_special_tokens=False).input_ids
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    deltas = [detokenizer.add([t]) for t in tokens]
    deltas.append(detokenizer.flush())
    assert not any(REPLACEMENT_CHAR in d for d in deltas)
    full = tokenizer.decode(prompt + tokens, skip_special_tokens=True)
    assert full.endswith("".join(deltas))
    assert "".join(deltas).strip() == TEXT.strip()
    assert sum(1 for d in deltas if d) > 5  # really incremental


def test_stop_string_search_and_hold_back():
    assert find_stop_string("abc STOP def", ["STOP"]).position == 4
    assert find_stop_string("abc", ["STOP"]) is None
    assert find_stop_string("xx END yy STOP", ["STOP", "END"]).stop == "END"
    assert safe_text_length("the end is ST", ["STOP"]) == len("the end is ")
    assert safe_text_length("the end", ["STOP"]) == len("the end")


@pytest.mark.parametrize(
    "tokenizer_dir",
    [
        STORIES_MODEL,
        pytest.param(GPT2_TOKENIZER, marks=needs(GPT2_TOKENIZER)),
        pytest.param(SMOLLM2_MODEL, marks=needs(SMOLLM2_MODEL)),
    ],
)
@pytest.mark.parametrize("clean_up", [False, True])
def test_the_fast_decoder_gives_what_the_tokenizers_decode_gives(tokenizer_dir, clean_up):
    """decoder() goes straight to the Rust tokenizer where Hugging Face's decode would do only
    that; with space clean-up on it goes through decode. Either way the text is decode's, for
    windows of any ids, special ones and byte pieces included."""
    tokenizer = load_tokenizer(str(tokenizer_dir))
    tokenizer.clean_up_tokenization_spaces = clean_up
    decode = decoder(tokenizer)
    rng = random.Random(0)
    vocab = len(tokenizer)
    text_ids = tokenizer(TEXT + " a , b . c 's", add_special_tokens=False).input_ids
    windows = [text_ids[i : i + n] for i in range(len(text_ids)) for n in (1, 2, 5)]
    windows += [[rng.randrange(vocab) for _ in range(rng.randint(0, 8))] for _ in range(300)]
    for ids in windows:
        assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=True), ids
