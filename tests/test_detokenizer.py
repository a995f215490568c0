"""Streamed text deltas never split a multi-byte character and add up to the full text."""

from __future__ import annotations

import pytest

from gateway.detokenizer import REPLACEMENT_CHAR, IncrementalDetokenizer
from gateway.stopping import find_stop_string, safe_text_length
from speculant.tokenizer import load_tokenizer
from tests.assets import GPT2_TOKENIZER, STORIES_MODEL, needs

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
