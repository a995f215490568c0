"""The model's own generation_config: the sampling controls its generation_config.json sets are
applied by default, as Hugging Face ``generate`` applies them, and a request's fields override
them.

A copy of the demo kit's stories260K whose generation_config.json sets ``repetition_penalty:
1.3``: speculative greedy decoding of it equals ``generate(do_sample=False)`` of that model
(which applies the penalty) on the demo kit's dev prompts, embedded and over the services; a
request with ``repetition_penalty=1.0`` gets plain greedy decoding instead.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from gateway import SpeculativeDecoder
from speculant.config import DraftConfig, GenerationConfig, VerifierConfig
from speculant.v1 import common_pb2
from tests.assets import STORIES_MODEL, load_dev_prompts
from tests.fixtures.e2e import running_services
from tests.sampling_checks import greedy_over_gateway, hf_generate

MAX_TOKENS = 64
EOS = [2]  # stories260K's
PENALTY = 1.3


@pytest.fixture(scope="module")
def penalised_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of stories260K whose generation_config.json sets repetition_penalty 1.3."""
    out = tmp_path_factory.mktemp("models") / "stories260K-penalised"
    shutil.copytree(STORIES_MODEL, out)
    path = out / "generation_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**config, "repetition_penalty": PENALTY}), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return load_dev_prompts(8)


@pytest.fixture(scope="module")
def references(penalised_model, tokenizer, prompts) -> dict[str, list[list[int]]]:
    """generate(do_sample=False) of the copy, as it comes ("model": its penalty applied) and
    with repetition_penalty=1.0 ("plain")."""
    model = AutoModelForCausalLM.from_pretrained(penalised_model).eval()
    assert model.generation_config.repetition_penalty == PENALTY
    ids = [tokenizer(p).input_ids for p in prompts]
    return {
        "model": [hf_generate(model, i, MAX_TOKENS, EOS) for i in ids],
        "plain": [hf_generate(model, i, MAX_TOKENS, EOS, repetition_penalty=1.0) for i in ids],
    }


def test_the_models_penalty_changes_its_greedy_output(references):
    differing = sum(a != b for a, b in zip(references["model"], references["plain"], strict=True))
    assert differing >= len(references["plain"]) - 1, f"only {differing} prompts differ"


@pytest.fixture(scope="module")
def penalised_decoder(tinystories_graph, penalised_model):
    config = VerifierConfig(model_name=str(penalised_model), device="cpu")
    return SpeculativeDecoder(tinystories_graph, config, learn=False)


@pytest.mark.parametrize(
    ("override", "expected"), [({}, "model"), ({"repetition_penalty": 1.0}, "plain")]
)
def test_the_models_defaults_apply_embedded(
    penalised_decoder, prompts, references, override, expected
):
    generation = GenerationConfig(max_tokens=MAX_TOKENS, temperature=0.0, seed=0, **override)
    draft = DraftConfig(k=4, tree_nodes=12)
    for i, prompt in enumerate(prompts):
        result = penalised_decoder.generate(
            prompt=prompt, generation_config=generation, draft_config=draft
        )
        assert result.token_ids == references[expected][i], f"prompt {i} differs from generate"


def test_the_applied_defaults_are_logged(tinystories_graph, penalised_model, caplog):
    caplog.set_level(logging.INFO)
    config = VerifierConfig(model_name=str(penalised_model), device="cpu")
    SpeculativeDecoder(tinystories_graph, config, learn=False)
    assert any(f"repetition_penalty={PENALTY}" in r.getMessage() for r in caplog.records)


def test_the_models_defaults_apply_over_services(
    tinystories_graph, penalised_model, prompts, references
):
    config = VerifierConfig(model_name=str(penalised_model), device="cpu")
    draft = common_pb2.DraftOptions(k=4, strategy=common_pb2.DRAFT_STRATEGY_GREEDY)
    cases = [(common_pb2.SamplingControls(), "model")]
    cases.append((common_pb2.SamplingControls(repetition_penalty=1.0), "plain"))
    with running_services(tinystories_graph, learn=False, verifier=config) as services:
        for sampling, expected in cases:
            responses = greedy_over_gateway(services.gateway, prompts, MAX_TOKENS, draft, sampling)
            for i, response in enumerate(responses):
                assert list(response.token_ids) == references[expected][i], (
                    f"{expected}: prompt {i} differs from generate"
                )
